"""The generated parts of the documents are what their generators make of the code:
the README's tables of settings and config knobs (deployments/docs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from reverie.deployments.docs import BLOCKS, main, render, replace_block, settings_table
from reverie.models.config import ConsolidationConfig
from reverie.models.settings import Settings

pytestmark = pytest.mark.store_independent("reads the README and the code, no store")

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_the_readme_tables_are_what_the_code_makes_of_them() -> None:
    text = README.read_text(encoding="utf-8")
    assert render(text) == text, "the README's generated tables drifted: run `make docs`"


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


def test_check_fails_on_a_drifted_readme_and_make_docs_mends_it(tmp_path: Path) -> None:
    drifted = tmp_path / "README.md"
    text = README.read_text(encoding="utf-8")
    drifted.write_text(text.replace("| `REVERIE_PRESET` |", "| `REVERIE_PRESET_OLD` |"),
                       encoding="utf-8")
    assert main(["--check", "--readme", str(drifted)]) == 1
    assert main(["--readme", str(drifted)]) == 0
    assert drifted.read_text(encoding="utf-8") == text
    assert main(["--check", "--readme", str(drifted)]) == 0
    assert set(BLOCKS) >= {"settings", "config"}
