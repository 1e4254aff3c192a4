"""Annotated scalar types shared by the models (Rust ``f32`` / ``f64`` fields with bounds)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, PlainSerializer

from soulmem_torch.model.serde import F32Float, f32_round

__all__ = ["F32", "Intensity", "Probability", "UnitF32"]

_F32_SER = PlainSerializer(lambda v: F32Float(v), return_type=float)

F32 = Annotated[
    float,
    Field(allow_inf_nan=False, description="A Rust f32: kept as its float32 shortest decimal."),
    AfterValidator(f32_round),
    _F32_SER,
]
"""A finite Rust ``f32`` value."""

UnitF32 = Annotated[
    float,
    Field(ge=0.0, le=1.0, allow_inf_nan=False, description="A Rust f32 in [0, 1]."),
    AfterValidator(f32_round),
    _F32_SER,
]
"""A Rust ``f32`` in [0, 1] (a confidence)."""

Intensity = Annotated[
    float, Field(ge=0.0, allow_inf_nan=False, description="Link intensity (f64, finite, >= 0).")
]
Probability = Annotated[
    float, Field(ge=0.0, le=1.0, allow_inf_nan=False, description="A probability (f64) in [0, 1].")
]
