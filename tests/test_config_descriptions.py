"""Every config knob explains itself in the schema Prefect builds the run form from."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from prefect.utilities.callables import parameter_schema
from pydantic import BaseModel, Field

from reverie.flows.full_consolidation import full_consolidation
from reverie.models import config as config_module
from reverie.models.config import ConsolidationConfig, DedupConfig

SECTIONS = sorted(
    (
        cls for cls in vars(config_module).values()
        if isinstance(cls, type) and issubclass(cls, config_module._Section)
        and cls is not config_module._Section
    ),
    key=lambda cls: cls.__name__,
)
# Sections a flow's ConsolidationConfig holds (RecallConfig configures recall alone).
CONSOLIDATION_SECTIONS = [cls for cls in SECTIONS if cls is not config_module.RecallConfig]


def object_schemas(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every object schema with properties: the root and each definition, by name."""
    found = {"<root>": schema} if "properties" in schema else {}
    for key in ("$defs", "definitions"):
        for name, definition in schema.get(key, {}).items():
            if "properties" in definition:
                found[name] = definition
    return found


def missing_descriptions(schemas: dict[str, dict[str, Any]]) -> list[str]:
    missing = [name for name, s in schemas.items()
               if name != "<root>" and not str(s.get("description", "")).strip()]
    for name, s in schemas.items():
        missing += [f"{name}.{prop}" for prop, p in s["properties"].items()
                    if not str(p.get("description", "")).strip()]
    return missing


def test_every_section_of_the_config_is_a_definition_of_its_schema() -> None:
    defs = ConsolidationConfig.model_json_schema()["$defs"]
    assert CONSOLIDATION_SECTIONS and (
        {cls.__name__ for cls in CONSOLIDATION_SECTIONS} - {"ConsolidationConfig"} == set(defs))


def test_every_field_and_section_of_the_config_schema_has_a_description() -> None:
    schemas = object_schemas(ConsolidationConfig.model_json_schema())
    assert len(schemas) == len(CONSOLIDATION_SECTIONS)
    assert missing_descriptions(schemas) == []
    assert str(schemas["<root>"].get("description", "")).strip()


@pytest.mark.parametrize("section", SECTIONS, ids=lambda cls: cls.__name__)
def test_every_field_has_its_own_description(section: type[BaseModel]) -> None:
    # Straight from the fields, so a section that is not reachable from
    # ConsolidationConfig, or a field hidden from the schema, is covered too.
    assert (section.__doc__ or "").strip()
    undescribed = [name for name, field in section.model_fields.items()
                   if not (field.description or "").strip()]
    assert undescribed == []


def test_the_summarizer_description_lists_its_values() -> None:
    described = ConsolidationConfig.model_fields["summarizer"].description or ""
    assert all(f"'{value}'" in described for value in ("auto", "rules", "llm"))


def test_the_walk_notices_a_field_without_a_description() -> None:
    class Bare(config_module._Section):
        """A section with one undescribed knob."""

        described: int = Field(3, description="A described knob.")
        bare: float = 0.5

    class Holder(config_module._Section):
        """Holds the bare section."""

        bare: Bare = Bare()

    assert missing_descriptions(object_schemas(Holder.model_json_schema())) == [
        "<root>.bare", "Bare.bare",
    ]


def test_prefects_parameter_schema_of_a_flow_carries_the_descriptions() -> None:
    schema = parameter_schema(full_consolidation.fn).model_dump_for_openapi()
    definitions = schema["definitions"]
    assert "ConsolidationConfig" in definitions
    config_schemas = {name: s for name, s in object_schemas(schema).items() if name != "<root>"}
    assert set(config_schemas) == {cls.__name__ for cls in CONSOLIDATION_SECTIONS}
    assert missing_descriptions(config_schemas) == []

    expected = DedupConfig.model_fields["similarity"].description
    assert expected and "cosine" in expected.lower()
    assert definitions["DedupConfig"]["properties"]["similarity"]["description"] == expected
    assert definitions["DedupConfig"]["description"] == inspect.cleandoc(DedupConfig.__doc__ or "")
    summarizer = definitions["ConsolidationConfig"]["properties"]["summarizer"]
    assert summarizer["description"] == (
        ConsolidationConfig.model_fields["summarizer"].description
    )
