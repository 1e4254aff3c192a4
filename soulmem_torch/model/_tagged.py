"""Pydantic plumbing for Rust serde's externally tagged enums.

``Annotated[A | B, ExternallyTagged({("Semantic",): A, ("Situation", "Specific"): B})]`` validates
``{"Semantic": {...}}`` / ``{"Situation": {"Specific": {...}}}`` (or a variant instance) into the
variant instance, serializes back to the tagged shape, and describes it in the JSON Schema.
A path of several tags is a nested enum (``MemoryType::Situation(SituationType::…)``).
"""

from __future__ import annotations

from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

__all__ = ["ExternallyTagged"]


class ExternallyTagged:
    """Annotated marker for an externally tagged (possibly nested) enum of pydantic classes."""

    def __init__(self, variants: dict[tuple[str, ...], type]) -> None:
        self.variants = dict(variants)
        self.path_of = {cls: path for path, cls in self.variants.items()}

    def path(self, value: Any) -> tuple[str, ...]:
        for cls in type(value).__mro__:
            if cls in self.path_of:
                return self.path_of[cls]
        raise TypeError(f"{type(value).__name__} is not a variant of this enum")

    def _level(
        self, entries: dict[tuple[str, ...], type], handler: GetCoreSchemaHandler
    ) -> tuple[core_schema.CoreSchema, core_schema.CoreSchema]:
        """``(validator, description)`` of one level of the enum. The validator is a typed
        dict with one optional key per tag (pydantic-core parses the present variant
        straight from JSON, with no Python call before it) and a check that exactly one
        known key is present; the description is a union of one-key objects (what the JSON
        Schema shows)."""
        groups: dict[str, dict[tuple[str, ...], type]] = {}
        for path, cls in entries.items():
            groups.setdefault(path[0], {})[path[1:]] = cls
        fields: dict[str, core_schema.TypedDictField] = {}
        shapes: dict[Any, core_schema.CoreSchema] = {}
        for tag, sub in groups.items():
            if () in sub:
                inner = described = handler.generate_schema(sub[()])
            else:
                inner, described = self._level(sub, handler)
            fields[tag] = core_schema.typed_dict_field(inner, required=False)
            shapes[tag] = core_schema.typed_dict_schema(
                {tag: core_schema.typed_dict_field(described, required=True)},
                extra_behavior="forbid",
            )
        tags = sorted(groups)
        message = f"expected an object with exactly one key, one of {tags}"

        def pick(value: dict[str, Any]) -> Any:
            if len(value) == 1:
                ((key, out),) = value.items()
                if key in groups:
                    return out
            raise PydanticCustomError("externally_tagged_enum", message)

        validator = core_schema.no_info_after_validator_function(
            pick,
            core_schema.typed_dict_schema(
                fields, extra_behavior="allow", extras_schema=core_schema.any_schema()
            ),
        )
        return validator, core_schema.tagged_union_schema(shapes, discriminator=_only_key)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        tagged, described = self._level(self.variants, handler)
        classes = tuple(self.variants.values())

        def accept_instances(value: Any, handler: Any) -> Any:
            if isinstance(value, classes):
                return value
            return handler(value)

        def serialize(value: Any) -> Any:
            out: Any = value
            for tag in reversed(self.path(value)):
                out = {tag: out}
            return out

        return core_schema.json_or_python_schema(
            json_schema=tagged,
            python_schema=core_schema.no_info_wrap_validator_function(accept_instances, tagged),
            serialization=core_schema.plain_serializer_function_ser_schema(
                serialize, return_schema=core_schema.any_schema()
            ),
            metadata={"pydantic_js_functions": [lambda _schema, js: js(described)]},
        )


def _only_key(value: Any) -> str | None:
    """The tag of a one-key object (the description's discriminator; never validates)."""
    return next(iter(value)) if isinstance(value, dict) and len(value) == 1 else None
