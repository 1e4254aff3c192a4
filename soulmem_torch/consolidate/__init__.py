"""Memory that learns from use (docs/spec.md §10): plasticity from retrieval records, and the
consolidation of the short-term window into long-term notes."""

from __future__ import annotations

from soulmem_torch.consolidate.plasticity import (
    DEFAULT_TOP_K,
    LTD_STEP_MAX,
    LTP_NORM_THRESHOLD,
    LTP_STEP_MAX,
    LinkChange,
    PlasticityPlan,
    hot_notes,
    plasticity_delta,
    plasticity_kernel,
    plasticity_reference,
    retrieval_frequency,
)
from soulmem_torch.consolidate.update import update_plasticity

__all__ = [
    "DEFAULT_TOP_K",
    "LTD_STEP_MAX",
    "LTP_NORM_THRESHOLD",
    "LTP_STEP_MAX",
    "LinkChange",
    "PlasticityPlan",
    "hot_notes",
    "plasticity_delta",
    "plasticity_kernel",
    "plasticity_reference",
    "retrieval_frequency",
    "update_plasticity",
]
