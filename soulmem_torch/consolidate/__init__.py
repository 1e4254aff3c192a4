"""Memory that learns from use (docs/spec.md §10): plasticity from retrieval records, and the
consolidation of the short-term window into long-term notes."""

from __future__ import annotations

from soulmem_torch.consolidate.active import select_active_nodes
from soulmem_torch.consolidate.consolidate import (
    DEFAULT_MAX_REPLY_CHARS,
    ConsolidationReport,
    consolidate_many,
    consolidate_memory,
)
from soulmem_torch.consolidate.notes import (
    BASE_INTENSITY,
    MAX_LINKS,
    MAX_NOTES,
    extract_json_array,
    legal_link_type,
    parse_note_reply,
)
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
    "BASE_INTENSITY",
    "DEFAULT_MAX_REPLY_CHARS",
    "MAX_LINKS",
    "MAX_NOTES",
    "ConsolidationReport",
    "consolidate_many",
    "consolidate_memory",
    "extract_json_array",
    "legal_link_type",
    "parse_note_reply",
    "select_active_nodes",
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
