"""Working memory and the memory cluster (docs/spec.md §2): the in-memory store above the data model."""

from __future__ import annotations

from soulmem_torch.runtime.cluster import GraphMemoryLink, MemoryCluster
from soulmem_torch.runtime.records import Feedback, Record
from soulmem_torch.runtime.window import (
    SUMMARY_SYSTEM_PROMPT,
    Assistant,
    Information,
    LLMCallable,
    PushResult,
    SlidingWindow,
    User,
    make_information,
)
from soulmem_torch.runtime.working_memory import WorkingMemory, WorkingState

__all__ = [
    "SUMMARY_SYSTEM_PROMPT",
    "Assistant",
    "Feedback",
    "GraphMemoryLink",
    "Information",
    "LLMCallable",
    "MemoryCluster",
    "PushResult",
    "Record",
    "SlidingWindow",
    "User",
    "WorkingMemory",
    "WorkingState",
    "make_information",
]
