"""The generated parts of the documents are what their generators make of the code: the
README's tables of settings, config knobs and commands (deployments/docs.py, the one
command that makes every generated document, BENCHMARKS.md included)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from reverie.deployments.docs import (
    BLOCKS,
    check,
    documents,
    main,
    readme,
    replace_block,
    settings_table,
)
from reverie.models.config import ConsolidationConfig
from reverie.models.settings import Settings

pytestmark = pytest.mark.store_independent("reads the README and the code, no store")

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_the_readme_tables_are_what_the_code_makes_of_them() -> None:
    assert check([readme()]) == []


def test_every_setting_and_knob_has_a_row_with_its_description() -> None:
    text = README.read_text(encoding="utf-8")
    for name, field in Settings.model_fields.items():
        assert f"| `REVERIE_{name.upper()}` |" in text
        assert (field.description or "").strip(), f"REVERIE_{name.upper()} is not described"

    def knobs(model: type, path: str) -> list[str]:
        found = []
        for name, field in model.model_fields.items():
            found.append(f"{path}{name}")
            if hasattr(field.annotation, "model_fields"):
                found += knobs(field.annotation, f"{path}{name}.")
        return found

    assert all(f"`{k}`" in text for k in knobs(ConsolidationConfig, "config."))


def test_replace_block_swaps_only_what_its_markers_hold() -> None:
    text = "intro\n<!-- generated:t -->\nold\n<!-- /generated:t -->\noutro\n"
    assert replace_block(text, "t", "new\n") == (
        "intro\n<!-- generated:t -->\nnew\n<!-- /generated:t -->\noutro\n")
    again = replace_block(replace_block(text, "t", "new"), "t", "new")
    assert again == replace_block(text, "t", "new")  # idempotent


@pytest.mark.parametrize("text", [
    "no markers\n",
    "<!-- generated:t -->\n<!-- /generated:t -->\n<!-- generated:t -->\n<!-- /generated:t -->\n",
])
def test_a_missing_or_doubled_block_is_an_error(text: str) -> None:
    with pytest.raises(ValueError, match="generated:t"):
        replace_block(text, "t", "x")


def test_a_new_setting_shows_in_the_table_with_its_bounds_and_default() -> None:
    class Example(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="EXAMPLE_")
        answer: int = Field(42, ge=1, le=100, description="What | it does.")
        mode: bool = Field(False, description="A switch.")

    table = settings_table(Example)
    assert "| `EXAMPLE_ANSWER` | `42` | 1 to 100 | What \\| it does. |" in table
    assert "| `EXAMPLE_MODE` | `false` |  | A switch. |" in table


def test_check_names_each_drifted_document_and_make_docs_mends_them(tmp_path: Path) -> None:
    """The one command, on a copy of the repository's documents: ``--check`` fails naming
    what drifted and writes nothing; without it, every generated part is made again."""
    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    text = README.read_text(encoding="utf-8")
    drifted = (text.replace("| `REVERIE_PRESET` |", "| `REVERIE_PRESET_OLD` |")
               .replace("| `reverie ingest FILE", "| `reverie ingested FILE"))
    (tmp_path / "README.md").write_text(drifted, encoding="utf-8")
    (tmp_path / "BENCHMARKS.md").write_text("# stale\n", encoding="utf-8")
    assert [d.path.name for d in documents(tmp_path)] == ["README.md", "BENCHMARKS.md"]
    assert len(check(documents(tmp_path))) == 2
    assert main(["--check"], root=tmp_path) == 1
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == drifted
    assert main([], root=tmp_path) == 0
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == text
    assert (tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8") == \
        (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert main(["--check"], root=tmp_path) == 0
    assert set(BLOCKS) == {"settings", "config", "commands"}
