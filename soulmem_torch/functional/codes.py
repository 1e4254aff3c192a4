"""Integer codes shared by the graph tensors and the kernels.

``node_type`` codes (one per note) and ``edge_kind`` codes (one per link). Kept in one place so
that ``MemoryGraph`` (which writes them) and the kernels (which read them) cannot disagree.
"""

from __future__ import annotations

__all__ = [
    "LINK_PROC",
    "LINK_SEM",
    "LINK_SIT_ABSTRACT_TO_SPECIFIC",
    "LINK_SIT_SPECIFIC_TO_ABSTRACT",
    "NODE_ABSTRACT",
    "NODE_PROCEDURE",
    "NODE_SEMANTIC",
    "NODE_SPECIFIC",
    "SITUATION_LINK_CONFIDENCE",
]

# node_type
NODE_SEMANTIC = 0
NODE_SPECIFIC = 1  # SpecificSituation
NODE_ABSTRACT = 2  # AbstractSituation
NODE_PROCEDURE = 3

# edge_kind
LINK_PROC = 0  # Proc(TrigToAction{prob})
LINK_SEM = 1  # Sem(SemMemLink{verb, confidence})
LINK_SIT_ABSTRACT_TO_SPECIFIC = 2  # Situation(AbstractToSpecific)
LINK_SIT_SPECIFIC_TO_ABSTRACT = 3  # Situation(SpecificToAbstract)

# docs/spec.md §5: a Situation link's confidence is 0.8 *as float32*, widened to float64.
SITUATION_LINK_CONFIDENCE = 0.800000011920929
