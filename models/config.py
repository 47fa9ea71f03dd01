"""The knobs of every consolidation step, typed and bounded, plus named presets.

Defaults are the seeds' defaults (SuperLocalMemory, cognitive-memory, linksee-memory,
AutoMem; each section names its seed) unless a field's description or a comment says
otherwise. Every field carries a ``description`` and every section a docstring: pydantic
puts them in the JSON schema, which is the help text of the ``config`` parameter in
Prefect's run form. A flow takes a ``ConsolidationConfig``; ``preset(name)`` gives a
ready one. Presets are complete configs, not patches, so a run's artifact can print
exactly what it ran with.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from reverie.models.errors import ConfigError
from reverie.models.ids import given_id

# Who words summaries: "auto" is "llm" when an LLM server is configured, else "rules".
SummarizerName = Literal["auto", "rules", "llm"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DedupConfig(_Section):
    """Near-duplicate merging (SuperLocalMemory step 1): each group of near-duplicates
    becomes one summary memory; the originals move to the cold tier, nothing is deleted."""

    similarity: float = Field(0.85, ge=0.0, le=1.0, description=(
        "Cosine similarity (0-1) at or above which a memory is a duplicate of a group's "
        "representative (compared to the representative only, so groups never chain). "
        "Higher is stricter: fewer merges. SuperLocalMemory's compression_similarity, "
        "0.85. 0.80 leaves fewer hot characters in every LoCoMo fold, but about half of "
        "the members it leaves unsaid are distinct statements, not repeats (README, "
        "Quality)."
    ))
    min_group_size: int = Field(3, ge=2, le=1000, description=(
        "Fewest near-duplicates (representative included) merged into one summary; "
        "smaller groups are left as they are. SuperLocalMemory merges groups of three or "
        "more, so a pair stays. Higher is stricter."
    ))
    restated_share: float = Field(0.0, ge=0.0, le=1.0, description=(
        "Share (0-1) of a member's content words a merge's words must already say for "
        "that member, when it states no new number, name or date, to be left unsaid as a "
        "near-duplicate (its original stays in the cold tier); a member saying more of "
        "its own is said whole after the representative. 1 leaves unsaid only members "
        "said entirely; 0 only those stating no new fact. Higher keeps more of what "
        "members said, in more characters."
    ))
    supersede_similarity: float = Field(0.35, ge=0.0, le=1.0, description=(
        "Cosine similarity (0-1) at or above which two memories of one entity that state "
        "different values of the same fact (a number, a name, a date) are an update: the "
        "newest stays hot, the older move to the cold tier superseded by it, never merged. "
        "Higher is stricter: fewer updates recognised."
    ))
    supersede_frame_similarity: float = Field(0.20, ge=0.0, le=1.0, description=(
        "A second, lower cosine (0-1) for update pairs that say the same words around "
        "their values (the same unit or a name, and the same other content words: "
        "'works at Google', 'working for Stripe'). A name moves a short sentence's "
        "vector a lot, so such pairs can fall below supersede_similarity; the word test "
        "still decides. At or above supersede_similarity: no second search."
    ))


class BlocksConfig(_Section):
    """Core Memory block compilation (SuperLocalMemory step 2): the five always-in-context
    blocks, each and all together held to a character budget."""

    block_char_limit: int = Field(500, ge=20, le=20_000, description=(
        "Maximum length of each Core Memory block, in characters; a block is cut at a "
        "fact boundary. SuperLocalMemory's block_char_limit."
    ))
    core_memory_char_limit: int = Field(2000, ge=20, le=100_000, description=(
        "Maximum length of all five blocks together, in characters; the longest block "
        "drops facts until the total fits. SuperLocalMemory's core_memory_char_limit."
    ))
    facts_per_block: int = Field(5, ge=1, le=100, description=(
        "How many memories feed each ranked block (user_profile, project_context, "
        "behavioral_patterns); SuperLocalMemory's Mode A takes the top five. "
        "active_decisions and learned_preferences take every memory that qualifies."
    ))
    decision_min_access: int = Field(3, ge=0, description=(
        "active_decisions block: a decision is included once it has been accessed at "
        "least this many times; 0 includes every decision."
    ))
    preference_min_confidence: float = Field(0.7, ge=0.0, le=1.0, description=(
        "learned_preferences block: opinions and preferences are included when their "
        "confidence (trust, 0-1) is at least this. Higher is stricter."
    ))


class PromotionConfig(_Section):
    """Lifecycle promotion (SuperLocalMemory step 3): memories used often, trusted and
    valid at as_of are promoted; a promoted one that no longer qualifies returns to
    active."""

    min_access: int = Field(3, ge=0, description=(
        "Access count a memory needs to be promoted. Higher is stricter. "
        "SuperLocalMemory's promotion_min_access."
    ))
    min_trust: float = Field(0.5, ge=0.0, le=1.0, description=(
        "Confidence (trust, 0-1) a memory needs to be promoted. Higher is stricter. "
        "SuperLocalMemory's promotion_min_trust."
    ))


class EdgeDecayConfig(_Section):
    """Association-edge decay (SuperLocalMemory step 4): idle association edges lose
    weight and the weakest are pruned. Weights are recomputed from each edge's base
    weight, so runs never compound; provenance edges never decay."""

    inactive_days: float = Field(30.0, ge=0.0, description=(
        "Days since an association edge was last strengthened before it decays; past "
        "that, its weight is base_weight * exp(-rate_per_day * idle days), counting all "
        "idle days. SuperLocalMemory's decay_days_threshold."
    ))
    rate_per_day: float = Field(0.01, ge=0.0, le=1.0, description=(
        "Exponential decay rate of an idle edge's weight, per day (0.01 is about 1% a "
        "day). Higher fades edges faster; 0 keeps their base weight."
    ))
    prune_below: float = Field(0.05, ge=0.0, le=1.0, description=(
        "An idle association edge whose decayed weight is strictly below this is "
        "deleted. Higher prunes more; 0 prunes nothing."
    ))


class GraphConfig(_Section):
    """PageRank and communities over the memory graph (SuperLocalMemory step 5)."""

    damping: float = Field(0.85, gt=0.0, lt=1.0, description=(
        "PageRank damping factor, strictly between 0 and 1: the probability of "
        "following an edge rather than jumping to a random memory. 0.85 is the usual "
        "value."
    ))
    community_seed: int = Field(0, ge=0, description=(
        "Random seed of the Leiden community search (graph importance, and the cluster "
        "flow's 'leiden' method), so the same graph always gets the same communities. "
        "Any value works; changing it may regroup communities."
    ))


class LinkConfig(_Section):
    """Linking new summaries into the graph (SuperLocalMemory step 6): each new summary
    gets association edges, weighted by similarity, to its nearest hot memories (found
    as ``search`` says: by cells above its exact limit)."""

    similarity: float = Field(0.7, ge=0.0, le=1.0, description=(
        "Cosine similarity (0-1), inclusive, a hot memory needs to a new summary to be "
        "linked to it. Higher is stricter: fewer links."
    ))
    max_links: int = Field(10, ge=0, le=1000, description=(
        "Most association edges a new summary gets, to its nearest memories above the "
        "similarity; 0 adds none."
    ))
    cell_probes: int = Field(24, ge=1, le=4096, description=(
        "search.cell_probes for this step's search by cells (above search.exact_limit hot "
        "memories): its threshold is lower than dedup's, so a summary's neighbours sit in "
        "more cells (at 1M, 8 probes found 0.983 of the exact links, 24 found 0.995)."
    ))


class CompressConfig(_Section):
    """Compression of fading memories (cognitive-memory's consolidation): groups of
    similar low-relevance memories of one kind and one entity become a summary, dated
    when it is written (its members' dates are in its words and metadata); the
    originals move to the cold tier, superseded by it, and can be restored. A
    compression summary is never compressed again."""

    max_relevance: float = Field(0.20, ge=0.0, le=1.0, description=(
        "A hot, active, unprotected memory is a candidate when its relevance (0-1, "
        "scored by the decay flow) is strictly below this. Higher compresses earlier; "
        "0 compresses nothing. cognitive-memory's consolidation_retention_threshold."
    ))
    similarity: float = Field(0.70, ge=0.0, le=1.0, description=(
        "Cosine similarity (0-1), inclusive, a candidate needs to its group's seed "
        "(seeds are taken oldest first) to join the group. Higher is stricter. "
        "cognitive-memory's consolidation_similarity_threshold."
    ))
    min_group_size: int = Field(5, ge=2, le=1000, description=(
        "Fewest memories a summary stands for; a seed that gathers fewer is left as it "
        "is. Higher is stricter. cognitive-memory's consolidation_group_size (a group "
        "must be full to qualify)."
    ))
    max_group_size: int = Field(5, ge=2, le=1000, description=(
        "Most memories one summary stands for; a seed stops gathering at this many, "
        "most similar first. cognitive-memory's consolidation_group_size (groups of 2 "
        "to 8 at cosine 0.60 made fewer hot memories but more hot characters in every "
        "LoCoMo fold: README, Quality)."
    ))
    link_weight: float = Field(0.8, gt=0.0, le=1.0, description=(
        "Weight (0-1, above 0) of the provenance edge from a summary to each original; "
        "cognitive-memory links them at 0.8."
    ))

    @model_validator(mode="after")
    def _min_group_at_most_max(self) -> CompressConfig:
        if self.min_group_size > self.max_group_size:
            raise ValueError(
                f"min_group_size ({self.min_group_size}) must be at most max_group_size "
                f"({self.max_group_size})")
        return self


class ColdConfig(_Section):
    """Consolidation of cold notes by (entity, layer) (linksee's ``consolidate``): each
    group of old, rarely used notes becomes one protected learning memory; the
    originals move to the cold tier. Stalled detection follows it."""

    layers: tuple[str, ...] = Field(("context", "emotion", "implementation"), description=(
        "Memory layers whose notes may be consolidated (linksee's context, emotion and "
        "implementation). Notes of other layers, or without an entity, never are."
    ))
    min_age_days: float = Field(7.0, ge=0.0, description=(
        "Days since creation a note needs before it can be consolidated; 0 consolidates "
        "at once (useful right after a bulk import). linksee's min_age_days."
    ))
    max_heat: float = Field(30.0, ge=0.0, le=100.0, description=(
        "A note is cold, and a candidate, when its linksee heat index (0 frozen to 100 "
        "hot, from its accesses, their recency and its importance) is strictly below "
        "this. Higher takes warmer notes too."
    ))
    min_group_size: int = Field(2, ge=2, le=10_000, description=(
        "Fewest cold notes of one (entity, layer) consolidated into a learning memory; "
        "smaller groups are left alone. Higher is stricter."
    ))
    exemplars: int = Field(3, ge=1, le=20, description=(
        "How many notes of a group, most important first, the learning memory quotes."
    ))
    exemplar_chars: int = Field(200, ge=20, le=5000, description=(
        "Longest quote of each exemplar, in characters; longer notes are cut with an "
        "ellipsis."
    ))
    min_importance: float = Field(0.55, ge=0.0, le=1.0, description=(
        "Least importance (0-1) of a learning memory: it gets the mean importance of its "
        "notes, or this if higher (linksee: slightly above its sources)."
    ))
    stalled_after_days: float = Field(30.0, ge=0.0, description=(
        "Days untouched (since the last access, or creation) after which an in_progress "
        "memory is marked stalled."
    ))
    scope: Literal["all", "session"] = Field("all", description=(
        "'all': every note of the profile; 'session': only the notes of session_id "
        "(consolidation and stalled detection alike)."
    ))
    session_id: str | None = Field(None, description=(
        "The session whose notes are processed when scope is 'session' (required then); "
        "unused with 'all'."
    ))

    @field_validator("session_id")
    @classmethod
    def _session_as_stored(cls, value: str | None) -> str | None:
        # Compared with the session ids ingest stored, which are in this form.
        return None if value is None else given_id(value)

    @model_validator(mode="after")
    def _session_needs_an_id(self) -> ColdConfig:
        if self.scope == "session" and not self.session_id:
            raise ValueError("scope 'session' needs a session_id")
        return self


class DecayConfig(_Section):
    """Relevance decay (AutoMem's daily task): every live hot memory's relevance (0-1)
    is recomputed at as_of from its age, last access, edges, importance and confidence.
    Compression, clustering, creative discovery and forgetting read it."""

    base_rate_per_day: float = Field(0.01, ge=0.0, le=1.0, description=(
        "Exponential decay rate of relevance per day of age: factor exp(-rate * "
        "age_days). Higher fades memories faster; 0 ignores age. AutoMem's "
        "base_decay_rate."
    ))
    access_rate_per_day: float = Field(0.05, ge=0.0, le=1.0, description=(
        "Exponential decay rate per day since the last access, for memories not accessed "
        "within recent_access_hours: factor exp(-rate * days). Higher penalises idle "
        "memories more; 0 ignores access."
    ))
    recent_access_hours: float = Field(24.0, ge=0.0, description=(
        "A memory accessed within this many hours of as_of counts in full (access "
        "factor 1.0)."
    ))
    relationship_weight: float = Field(0.3, ge=0.0, le=10.0, description=(
        "How much a memory's edges raise its relevance: factor 1 + weight * ln(1 + "
        "edges); 0 ignores edges. AutoMem's relationship_preservation."
    ))
    default_importance: float = Field(0.5, ge=0.0, le=1.0, description=(
        "Importance (0-1) assumed for a memory whose importance is not known, in the "
        "score and in importance_threshold."
    ))
    default_confidence: float = Field(0.5, ge=0.0, le=1.0, description=(
        "Confidence (0-1) assumed for a memory whose confidence is not known."
    ))
    stale_after_days: float = Field(1.0, ge=0.0, le=3650.0, description=(
        "Steps that act on stored relevance (compress, creative, cluster, forget) say so "
        "in their report and log when the profile's last decay ran for a date more than "
        "this many days from their own as_of."
    ))
    importance_threshold: float | None = Field(None, ge=0.0, le=1.0, description=(
        "If set, only memories at least this important (0-1) are decayed; the others keep "
        "the relevance they had. Empty (None) decays all. AutoMem's "
        "CONSOLIDATION_DECAY_IMPORTANCE_THRESHOLD."
    ))


class CreativeConfig(_Section):
    """Creative association discovery (AutoMem's weekly task): every unlinked pair of a
    reproducible sample of relevant memories is tested against four rules in order; the
    first that matches adds a typed edge. Similarities here are cosine, -1 to 1."""

    sample_size: int = Field(20, ge=2, le=10_000, description=(
        "How many relevant memories are sampled (the same profile and as_of draw the same "
        "sample); every pair is tested, so work grows with its square."
    ))
    min_relevance: float = Field(0.3, ge=0.0, le=1.0, description=(
        "Only memories with relevance (0-1) strictly above this are sampled."
    ))
    contradiction_below: float = Field(0.3, ge=-1.0, le=1.0, description=(
        "Rule 1: two decisions with similarity strictly below this get a 'contradicts' "
        "edge (contradiction_confidence). Lower is stricter."
    ))
    explains_above: float = Field(0.5, ge=-1.0, le=1.0, description=(
        "Rule 2: an insight and a pattern with similarity strictly above this get a "
        "'discovered/explains' edge from the insight (explains_confidence). Higher is "
        "stricter."
    ))
    shared_theme_above: float = Field(0.7, ge=-1.0, le=1.0, description=(
        "Rule 3: memories of different kinds with similarity strictly above this get a "
        "'discovered/shares_theme' edge (confidence = the similarity). Higher is stricter."
    ))
    parallel_below: float = Field(0.4, ge=-1.0, le=1.0, description=(
        "Rule 4: memories created within parallel_within_days of each other with "
        "similarity strictly below this get a 'discovered/parallel_context' edge "
        "(parallel_confidence). Lower is stricter."
    ))
    parallel_within_days: float = Field(7.0, ge=0.0, description=(
        "Rule 4: most days between two memories' creation for them to count as parallel "
        "context. Lower is stricter."
    ))
    contradiction_confidence: float = Field(0.6, ge=0.0, le=1.0, description=(
        "Rule 1: the confidence (and weight) of a 'contradicts' edge."
    ))
    explains_confidence: float = Field(0.7, ge=0.0, le=1.0, description=(
        "Rule 2: the confidence (and weight) of a 'discovered/explains' edge."
    ))
    parallel_confidence: float = Field(0.5, ge=0.0, le=1.0, description=(
        "Rule 4: the confidence (and weight) of a 'discovered/parallel_context' edge."
    ))


class ClusterConfig(_Section):
    """Clustering into meta-memories (AutoMem's monthly task): each group of similar
    relevant memories gets one meta-memory with 'summarizes' edges to its members, which
    stay as they are. A re-run updates meta-memories rather than adding more."""

    similarity: float = Field(0.75, ge=0.0, le=1.0, description=(
        "Cosine similarity (0-1), inclusive, at which two memories are joined in the "
        "similarity graph. Higher is stricter. AutoMem's similarity_threshold."
    ))
    min_cluster_size: int = Field(5, ge=2, le=100_000, description=(
        "Fewest memories a cluster needs to get a meta-memory. AutoMem's "
        "min_cluster_size."
    ))
    min_relevance: float = Field(0.3, ge=0.0, le=1.0, description=(
        "Only memories with relevance (0-1) strictly above this are clustered."
    ))
    method: Literal["components", "leiden"] = Field("components", description=(
        "'components': AutoMem's single linkage, chains of similar memories join into one "
        "cluster; 'leiden': Leiden communities on the same graph (seeded by "
        "graph.community_seed), which splits long chains."
    ))
    reuse_overlap: float = Field(0.5, gt=0.0, le=1.0, description=(
        "Share (above 0, up to 1) of an earlier meta-memory's members a new cluster must "
        "hold to update that meta-memory instead of adding another."
    ))
    exemplars: int = Field(3, ge=1, le=20, description=(
        "How many members, most important first, a meta-memory worded by the rules "
        "quotes (exemplar_chars each at most)."
    ))
    cell_probes: int = Field(24, ge=1, le=4096, description=(
        "search.cell_probes for this step's search by cells (above search.exact_limit "
        "candidates): its candidates are a sparse share of the profile and its threshold "
        "low, so their neighbours sit in more cells (8 probes found 0.92 of the pairs "
        "among 84k candidates at 1M, 24 found 0.996)."
    ))
    exemplar_chars: int = Field(120, ge=20, le=5000, description=(
        "Longest quote of one member in a meta-memory worded by the rules, in characters; "
        "a longer member is cut and ends in an ellipsis."
    ))


class ForgetConfig(_Section):
    """Controlled forgetting, off by default. policy 'thresholds' (AutoMem's task, the
    default): relevance below archive_threshold / delete_threshold, both 0.0 (nothing).
    policy 'risk' (linksee's forget sweep): each memory's forgetting risk from heat,
    importance, days since last access and layer. Under either, protection (the flag,
    protected kinds, importance, grace period) is a hard filter checked first."""

    policy: Literal["thresholds", "risk"] = Field("thresholds", description=(
        "How forgettable memories are chosen. 'thresholds' (default; AutoMem): by "
        "relevance, against archive_threshold and delete_threshold. 'risk' (linksee's "
        "forget sweep): by forgetting risk = (1 - heat/100) * (1 - importance) * d * "
        "(1 + d / risk_time_scale_days), d the days since last access; archived at "
        "risk_archive_at, deleted at risk_delete_at. Protection beats both."
    ))
    archive_threshold: float = Field(0.0, ge=0.0, le=1.0, description=(
        "Archive (move to the cold tier, kept) live hot memories whose relevance is "
        "strictly below this; 0.0 archives nothing. AutoMem's archive_threshold. "
        "Unused under policy 'risk'."
    ))
    delete_threshold: float = Field(0.0, ge=0.0, le=1.0, description=(
        "Delete (leaving a tombstone) live hot memories whose relevance is strictly below "
        "this; 0.0 deletes nothing. AutoMem's delete_threshold. Under policy 'risk' no "
        "relevance is compared: above 0.0 lets the risk policy delete (the forget flow "
        "asks for approval first, as for thresholds); 0.0 archives what reaches "
        "risk_delete_at instead."
    ))
    grace_period_days: float = Field(90.0, ge=0.0, description=(
        "Memories younger than this many days at as_of are never archived or deleted. "
        "AutoMem's CONSOLIDATION_GRACE_PERIOD_DAYS."
    ))
    protected_importance: float = Field(0.7, ge=0.0, le=1.0, description=(
        "Memories with importance (0-1) at or above this are never archived or deleted. "
        "Lower protects more."
    ))
    protected_kinds: tuple[str, ...] = Field(("decision", "insight"), description=(
        "Memory kinds never archived or deleted. AutoMem's "
        "CONSOLIDATION_PROTECTED_TYPES."
    ))
    risk_archive_at: float = Field(50.0, gt=0.0, le=1_000_000.0, description=(
        "Policy 'risk': archive (cold tier, kept) unprotected live memories whose "
        "forgetting risk is at or above this (risk is 0 upwards, unbounded: 60 for a "
        "memory of heat 0 and importance 0 idle 30 days). Higher forgets less. linksee's "
        "COMPRESS_THRESHOLD, 50."
    ))
    risk_delete_at: float = Field(200.0, gt=0.0, le=1_000_000.0, description=(
        "Policy 'risk': delete (leaving a tombstone) unprotected live memories whose "
        "forgetting risk is at or above this, when delete_threshold is above 0.0 (else "
        "they are archived). At least risk_archive_at. Higher deletes less. linksee's "
        "DROP_THRESHOLD, 200."
    ))
    risk_time_scale_days: float = Field(30.0, gt=0.0, le=3650.0, description=(
        "Policy 'risk': days d since the last access (or creation) count as d * (1 + d / "
        "this), so long idleness weighs more than linearly. Lower makes idle memories "
        "riskier sooner. linksee's 30."
    ))
    risk_exempt_layers: tuple[str, ...] = Field(("goal", "caveat"), description=(
        "Policy 'risk': layers whose forgetting risk is 0, never forgotten by it. "
        "linksee's goal (its risk formula exempts these why-anchors) and caveat (linksee "
        "flags every caveat protected when it is stored)."
    ))

    @model_validator(mode="after")
    def _delete_level_above_archive_level(self) -> ForgetConfig:
        if self.risk_delete_at < self.risk_archive_at:
            raise ValueError(
                f"risk_delete_at ({self.risk_delete_at:g}) must be at least "
                f"risk_archive_at ({self.risk_archive_at:g})")
        return self


class ColdTierConfig(_Section):
    """Cold-tier upkeep (cognitive-memory's maintenance tick: cold migration, then cold
    TTL expiry), both off by default. Migration moves long-unused live memories to the
    cold tier (kept, found by deep recall and by id, undoable); expiry turns memories
    cold for longer than the TTL into tombstones. Flagged-protected and promoted
    memories are never migrated; protected memories, originals a summary stands for and
    summaries standing for originals are never expired."""

    migrate_after_days: float | None = Field(None, ge=1.0, le=36_500.0, description=(
        "Move a live hot memory to the cold tier once it has gone unused this many days "
        "or more at as_of: days since its last access, or since its creation if never "
        "accessed (an access starts the count again). Empty (None) migrates nothing. "
        "cognitive-memory migrates a memory after cold_migration_days (7) days at its "
        "retention floor; Reverie counts days unused."
    ))
    ttl_days: float | None = Field(None, ge=1.0, le=36_500.0, description=(
        "Expire a cold memory once it has been cold this many days or more at as_of: its "
        "content goes and a tombstone keeps its id, external id, content hash, dates and "
        "the reason. Empty (None) expires nothing; a run expires only when approved "
        "(the cold-tier flow's auto_approve_expiry). cognitive-memory's "
        "cold_storage_ttl_days (180)."
    ))


class SearchConfig(_Section):
    """How the all-pairs similarity searches (dedup, compression, clustering) find their
    pairs, and linking its nearest neighbours: every pair compared up to ``exact_limit``
    rows; above it, by cells (spherical k-means), each memory compared with the memories
    of its nearest cells. Cells trade a little recall for time; BENCHMARKS.md measures
    both. Not a seed's: Reverie's own."""

    exact_limit: int = Field(20_000, ge=2, le=100_000_000, description=(
        "Largest set of memories searched exactly, every pair compared; above it the "
        "search goes by cells. Exact search of 100k memories takes about 50 s on two cores."
    ))
    rows_per_cell: int = Field(100, ge=10, le=1_000_000, description=(
        "Memories per cell above exact_limit (at most 4,096 cells; past that, cells hold "
        "more): with smaller cells each probe compares fewer memories."
    ))
    cell_probes: int = Field(8, ge=1, le=4096, description=(
        "Cells each memory is compared with, the nearest to it (its own first): more "
        "probes find more of the pairs near a threshold, in proportionally more time."
    ))

    def with_probes(self, cell_probes: int) -> SearchConfig:
        """This search with a step's own ``cell_probes`` (cluster's and linking's
        thresholds are low, so they probe more cells than the default)."""
        return self.model_copy(update={"cell_probes": cell_probes})


class RecallConfig(_Section):
    """Recall with access tracking (``reverie recall --track``): the memories found
    together count as accessed, and the association edges among them grow stronger.
    Not a consolidation step, so not part of ConsolidationConfig: a flow's config (and
    the audit rows that quote it) stays what it was."""

    co_access_bonus: float = Field(0.05, ge=0.0, le=1.0, description=(
        "Weight added to each association edge between two memories found by the same "
        "tracked recall (the weight stays at most 1). 0.0 tracks accesses without "
        "strengthening edges."
    ))


class ConsolidationConfig(_Section):
    """Every knob of every consolidation step, one section per step; bounded and
    immutable. A field left out keeps its default."""

    dedup: DedupConfig = Field(DedupConfig(), description=(
        "Near-duplicate merging (full-consolidation, step 1)."
    ))
    blocks: BlocksConfig = Field(BlocksConfig(), description=(
        "Core Memory blocks (full- and lightweight-consolidation; forget recompiles them)."
    ))
    promotion: PromotionConfig = Field(PromotionConfig(), description=(
        "Lifecycle promotion (full-consolidation)."
    ))
    edge_decay: EdgeDecayConfig = Field(EdgeDecayConfig(), description=(
        "Association-edge decay and pruning (full- and lightweight-consolidation)."
    ))
    graph: GraphConfig = Field(GraphConfig(), description=(
        "PageRank and communities (full-consolidation; the seed also serves cluster)."
    ))
    linking: LinkConfig = Field(LinkConfig(), description=(
        "Linking new summaries into the graph (full-consolidation)."
    ))
    compress: CompressConfig = Field(CompressConfig(), description=(
        "Compression of fading memories into summaries (full-consolidation, compress)."
    ))
    cold: ColdConfig = Field(ColdConfig(), description=(
        "Consolidation of cold notes and stalled detection (consolidate-cold)."
    ))
    decay: DecayConfig = Field(DecayConfig(), description=(
        "Relevance decay (the daily decay flow)."
    ))
    creative: CreativeConfig = Field(CreativeConfig(), description=(
        "Creative association discovery (the weekly creative flow)."
    ))
    cluster: ClusterConfig = Field(ClusterConfig(), description=(
        "Clustering into meta-memories (the monthly cluster flow)."
    ))
    forget: ForgetConfig = Field(ForgetConfig(), description=(
        "Controlled forgetting (the forget flow and consolidate-cold's forget sweep)."
    ))
    cold_tier: ColdTierConfig = Field(ColdTierConfig(), description=(
        "Migration of long-unused memories to the cold tier and expiry of long-cold ones "
        "(the cold-tier flow); both off by default."
    ))
    search: SearchConfig = Field(SearchConfig(), description=(
        "All-pairs similarity search, exact or by cells (dedup, compression, cluster)."
    ))
    summarizer: SummarizerName = Field("auto", description=(
        "Who words summaries, merged memories, meta-memories and the prose Core Memory "
        "blocks: 'rules' (deterministic, no model), 'llm' (the OpenAI-compatible server "
        "at REVERIE_LLM_BASE_URL, falling back to the rules on any failure), or 'auto' "
        "(default: 'llm' when that variable is set, else 'rules')."
    ))


# The seeds' defaults, every field as declared above.
DEFAULT = ConsolidationConfig()
RECALL_DEFAULT = RecallConfig()

# Merges only very close duplicates (cosine 0.92, groups of 4), keeps idle associations
# twice as long (60 days) and links new summaries only to close memories (0.8).
CONSERVATIVE = ConsolidationConfig(
    dedup=DedupConfig(similarity=0.92, min_group_size=4),
    edge_decay=EdgeDecayConfig(inactive_days=60.0),
    linking=LinkConfig(similarity=0.8),
)

# For stores that grow fast: looser duplicates (cosine 0.80), idle associations decay
# after 14 days and are pruned below 0.1, new summaries link more widely (0.65).
AGGRESSIVE = ConsolidationConfig(
    dedup=DedupConfig(similarity=0.80, min_group_size=3),
    edge_decay=EdgeDecayConfig(inactive_days=14.0, prune_below=0.1),
    linking=LinkConfig(similarity=0.65),
)

# Forgetting turned on, archive only: what has faded below 0.05 moves to the cold tier
# (kept, found by deep recall); nothing is deleted.
ARCHIVE_FADED = DEFAULT.model_copy(update={"forget": ForgetConfig(archive_threshold=0.05)})

# Forgetting by risk (linksee's forget sweep), archive only: memories whose forgetting
# risk reaches 50 move to the cold tier, and so do those reaching 200 (linksee drops them)
# until a delete threshold above 0.0 (--delete-below) lets them be deleted, on approval.
FORGET_BY_RISK = DEFAULT.model_copy(update={"forget": ForgetConfig(policy="risk")})

# The names preset() and REVERIE_PRESET accept.
PRESETS: dict[str, ConsolidationConfig] = {
    "default": DEFAULT,
    "conservative": CONSERVATIVE,
    "aggressive": AGGRESSIVE,
    "archive-faded": ARCHIVE_FADED,
    "forget-by-risk": FORGET_BY_RISK,
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
    return with_overrides(config, "forget", archive_threshold=archive, delete_threshold=delete)


def with_overrides(
    config: ConsolidationConfig, section: str, **values: object
) -> ConsolidationConfig:
    """``config`` with the fields of one section that are given (None keeps the
    config's own), checked against that section's bounds: a flow parameter that
    overrides a knob is refused as the knob itself would be."""
    given = {k: v for k, v in values.items() if v is not None}
    if not given:
        return config
    current = getattr(config, section)
    try:
        changed = type(current)(**(current.model_dump() | given))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(
            f"{section} {first['loc'][0]}: {first['msg'].lower()}, got {first['input']}"
        ) from None
    return config.model_copy(update={section: changed})


def preset(name: str) -> ConsolidationConfig:
    """The named preset; a clear error lists the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}"
        ) from None
