"""The knobs of every consolidation step, typed and bounded, plus named presets.

Defaults are the seeds' defaults (SuperLocalMemory's consolidation config) unless a
comment says otherwise. A flow takes a ``ConsolidationConfig``; ``preset(name)``
gives a ready one. Presets are complete configs, not patches, so a run's artifact
can print exactly what it ran with.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DedupConfig(_Section):
    """Near-duplicate merging (SLM step 1)."""

    # SLM `compression_similarity`: cosine at or above which two memories are duplicates.
    similarity: float = Field(0.85, ge=0.0, le=1.0)
    # SLM merges only groups of three or more; a pair stays as it is.
    min_group_size: int = Field(3, ge=2, le=1000)


class BlocksConfig(_Section):
    """Core Memory block compilation (SLM step 2)."""

    block_char_limit: int = Field(500, ge=20, le=20_000)
    core_memory_char_limit: int = Field(2000, ge=20, le=100_000)
    # Mode A takes the top five facts for the ranked blocks.
    facts_per_block: int = Field(5, ge=1, le=100)
    # active_decisions: decisions referenced at least this often.
    decision_min_access: int = Field(3, ge=0)
    # learned_preferences: opinions/preferences trusted at least this much.
    preference_min_confidence: float = Field(0.7, ge=0.0, le=1.0)


class PromotionConfig(_Section):
    """Lifecycle promotion (SLM step 3)."""

    min_access: int = Field(3, ge=0)  # SLM promotion_min_access
    min_trust: float = Field(0.5, ge=0.0, le=1.0)  # SLM promotion_min_trust


class EdgeDecayConfig(_Section):
    """Association-edge decay (SLM step 4)."""

    inactive_days: float = Field(30.0, ge=0.0)  # SLM decay_days_threshold
    rate_per_day: float = Field(0.01, ge=0.0, le=1.0)
    prune_below: float = Field(0.05, ge=0.0, le=1.0)


class GraphConfig(_Section):
    """PageRank and communities over the memory graph (SLM step 5)."""

    damping: float = Field(0.85, gt=0.0, lt=1.0)
    # Seeds the community search so the same graph always gets the same communities.
    community_seed: int = Field(0, ge=0)


class LinkConfig(_Section):
    """Linking new summaries into the graph (SLM step 6)."""

    similarity: float = Field(0.7, ge=0.0, le=1.0)
    max_links: int = Field(10, ge=0, le=1000)


class CompressConfig(_Section):
    """Compression of fading memories (cognitive-memory's consolidation)."""

    # Candidates score strictly below this relevance (cognitive-memory's retention).
    max_relevance: float = Field(0.20, ge=0.0, le=1.0)
    similarity: float = Field(0.70, ge=0.0, le=1.0)  # inclusive, to the group's seed
    group_size: int = Field(5, ge=2, le=1000)
    # cognitive-memory links a summary to each original at this weight.
    link_weight: float = Field(0.8, gt=0.0, le=1.0)


class ColdConfig(_Section):
    """Consolidation of cold notes by (entity, layer) (linksee's ``consolidate``)."""

    layers: tuple[str, ...] = ("context", "emotion", "implementation")
    # 0 consolidates at once (useful right after a bulk import).
    min_age_days: float = Field(7.0, ge=0.0)
    max_heat: float = Field(30.0, ge=0.0, le=100.0)  # strictly below: cold
    min_group_size: int = Field(2, ge=2, le=10_000)
    exemplars: int = Field(3, ge=1, le=20)
    exemplar_chars: int = Field(200, ge=20, le=5000)
    # A learning memory is at least this important (linksee: slightly above its sources).
    min_importance: float = Field(0.55, ge=0.0, le=1.0)
    # in_progress memories untouched this long become stalled.
    stalled_after_days: float = Field(30.0, ge=0.0)
    # "all" memories, or only those of one session.
    scope: Literal["all", "session"] = "all"
    session_id: str | None = None

    @model_validator(mode="after")
    def _session_needs_an_id(self) -> ColdConfig:
        if self.scope == "session" and not self.session_id:
            raise ValueError("scope 'session' needs a session_id")
        return self


class DecayConfig(_Section):
    """Relevance decay (AutoMem's daily task)."""

    base_rate_per_day: float = Field(0.01, ge=0.0, le=1.0)  # AutoMem base_decay_rate
    access_rate_per_day: float = Field(0.05, ge=0.0, le=1.0)
    # An access this recent counts in full (factor 1.0).
    recent_access_hours: float = Field(24.0, ge=0.0)
    relationship_weight: float = Field(0.3, ge=0.0, le=10.0)  # relationship_preservation
    # Memories whose importance is not known score as if it were this.
    default_importance: float = Field(0.5, ge=0.0, le=1.0)
    default_confidence: float = Field(0.5, ge=0.0, le=1.0)
    # Optional: decay only memories at least this important (AutoMem's
    # CONSOLIDATION_DECAY_IMPORTANCE_THRESHOLD); None decays all.
    importance_threshold: float | None = Field(None, ge=0.0, le=1.0)


class CreativeConfig(_Section):
    """Creative association discovery (AutoMem's weekly task)."""

    sample_size: int = Field(20, ge=2, le=10_000)
    min_relevance: float = Field(0.3, ge=0.0, le=1.0)  # strictly above
    contradiction_below: float = Field(0.3, ge=-1.0, le=1.0)
    explains_above: float = Field(0.5, ge=-1.0, le=1.0)
    shared_theme_above: float = Field(0.7, ge=-1.0, le=1.0)
    parallel_below: float = Field(0.4, ge=-1.0, le=1.0)
    parallel_within_days: float = Field(7.0, ge=0.0)


class ClusterConfig(_Section):
    """Clustering into meta-memories (AutoMem's monthly task)."""

    similarity: float = Field(0.75, ge=0.0, le=1.0)  # inclusive
    min_cluster_size: int = Field(5, ge=2, le=100_000)
    min_relevance: float = Field(0.3, ge=0.0, le=1.0)  # strictly above
    # "components": AutoMem's single linkage (chains join); "leiden": communities on
    # the same graph, which splits long chains.
    method: Literal["components", "leiden"] = "components"
    # A new cluster sharing at least this share of an earlier meta-memory's members
    # updates that meta-memory instead of adding another.
    reuse_overlap: float = Field(0.5, gt=0.0, le=1.0)
    exemplars: int = Field(3, ge=1, le=20)


class ForgetConfig(_Section):
    """Controlled forgetting (AutoMem's task, off by default)."""

    archive_threshold: float = Field(0.0, ge=0.0, le=1.0)  # 0.0 = never archive
    delete_threshold: float = Field(0.0, ge=0.0, le=1.0)  # 0.0 = never delete
    grace_period_days: float = Field(90.0, ge=0.0)
    protected_importance: float = Field(0.7, ge=0.0, le=1.0)  # at or above: kept
    protected_kinds: tuple[str, ...] = ("decision", "insight")


class ConsolidationConfig(_Section):
    """Everything Reverie's flows read; bounded, immutable."""

    dedup: DedupConfig = DedupConfig()
    blocks: BlocksConfig = BlocksConfig()
    promotion: PromotionConfig = PromotionConfig()
    edge_decay: EdgeDecayConfig = EdgeDecayConfig()
    graph: GraphConfig = GraphConfig()
    linking: LinkConfig = LinkConfig()
    compress: CompressConfig = CompressConfig()
    cold: ColdConfig = ColdConfig()
    decay: DecayConfig = DecayConfig()
    creative: CreativeConfig = CreativeConfig()
    cluster: ClusterConfig = ClusterConfig()
    forget: ForgetConfig = ForgetConfig()
    # "rules" is Mode A (deterministic, no model); "llm" asks the OpenAI-compatible
    # server configured by REVERIE_LLM_BASE_URL; "auto" is "llm" when that is set.
    summarizer: str = Field("auto", min_length=1)


DEFAULT = ConsolidationConfig()

# Merges only very close duplicates and keeps idle associations longer.
CONSERVATIVE = ConsolidationConfig(
    dedup=DedupConfig(similarity=0.92, min_group_size=4),
    edge_decay=EdgeDecayConfig(inactive_days=60.0),
    linking=LinkConfig(similarity=0.8),
)

# For stores that grow fast: looser duplicates, quicker pruning.
AGGRESSIVE = ConsolidationConfig(
    dedup=DedupConfig(similarity=0.80, min_group_size=3),
    edge_decay=EdgeDecayConfig(inactive_days=14.0, prune_below=0.1),
    linking=LinkConfig(similarity=0.65),
)

# Forgetting turned on, archive only: what has faded below 0.05 moves to the cold tier
# (kept, found by deep recall); nothing is deleted.
ARCHIVE_FADED = DEFAULT.model_copy(update={"forget": ForgetConfig(archive_threshold=0.05)})

PRESETS: dict[str, ConsolidationConfig] = {
    "default": DEFAULT,
    "conservative": CONSERVATIVE,
    "aggressive": AGGRESSIVE,
    "archive-faded": ARCHIVE_FADED,
}

ArchiveThreshold = Annotated[float, Field(
    ge=0.0, le=1.0,
    description="Archive (move to the cold tier, kept) live memories whose relevance is "
    "below this; 0.0 archives nothing. Overrides config.forget.archive_threshold.",
)]
DeleteThreshold = Annotated[float, Field(
    ge=0.0, le=1.0,
    description="Delete (leaving a tombstone) live memories whose relevance is below this; "
    "0.0 deletes nothing. Overrides config.forget.delete_threshold.",
)]


def with_forget_thresholds(
    config: ConsolidationConfig, archive: float | None, delete: float | None
) -> ConsolidationConfig:
    """``config`` with the forget thresholds given (None keeps the config's own)."""
    given = {k: v for k, v in (("archive_threshold", archive), ("delete_threshold", delete))
             if v is not None}
    if not given:
        return config
    try:
        forget = ForgetConfig(**(config.forget.model_dump() | given))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(
            f"forget {first['loc'][0]}: {first['msg'].lower()}, got {first['input']}"
        ) from None
    return config.model_copy(update={"forget": forget})


def preset(name: str) -> ConsolidationConfig:
    """The named preset; a clear error lists the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}"
        ) from None
