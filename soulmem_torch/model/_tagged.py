"""Pydantic plumbing for Rust serde's externally tagged enums.

``Annotated[A | B, ExternallyTagged({("Semantic",): A, ("Situation", "Specific"): B})]`` validates
``{"Semantic": {...}}`` / ``{"Situation": {"Specific": {...}}}`` (or a variant instance) into the
variant instance, serializes back to the tagged shape, and describes it in the JSON Schema.
A path of several tags is a nested enum (``MemoryType::Situation(SituationType::…)``).
"""

from __future__ import annotations

from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

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
    ) -> core_schema.CoreSchema:
        groups: dict[str, dict[tuple[str, ...], type]] = {}
        for path, cls in entries.items():
            groups.setdefault(path[0], {})[path[1:]] = cls
        choices: dict[Any, core_schema.CoreSchema] = {}
        for tag, sub in groups.items():
            if () in sub:
                inner = handler.generate_schema(sub[()])
            else:
                inner = self._level(sub, handler)
            wrapped = core_schema.typed_dict_schema(
                {tag: core_schema.typed_dict_field(inner, required=True)},
                extra_behavior="forbid",
            )
            choices[tag] = core_schema.no_info_after_validator_function(
                lambda d, tag=tag: d[tag], wrapped
            )
        tags = sorted(groups)

        def discriminate(value: Any) -> str | None:
            if isinstance(value, dict) and len(value) == 1:
                (key,) = value
                return key if key in groups else None
            return None

        return core_schema.tagged_union_schema(
            choices,
            discriminate,
            custom_error_type="externally_tagged_enum",
            custom_error_message=f"expected an object with exactly one key, one of {tags}",
        )

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        tagged = self._level(self.variants, handler)
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
        )
