"""Conversations as memories (docs/spec.md §11).

* :class:`ChatTurn`, :class:`ChatSession` — a chat history;
* readers: :func:`read_chat_jsonl` (a plain JSON Lines log), :func:`read_longmemeval`,
  :func:`read_locomo`;
* :func:`sessions_to_notes` — the mapping onto SoulMem's notes (used by
  ``SoulMem.add_sessions`` / ``MemoryBank.add_sessions``), :func:`chat_source` — where a note
  came from;
* :mod:`soulmem_torch.chat.metrics` — the benchmarks' official retrieval metrics;
  :mod:`soulmem_torch.chat.evaluate` — ``soulmem eval --format longmemeval|locomo``.
"""

from __future__ import annotations

from soulmem_torch.chat._types import ChatSession, ChatTurn
from soulmem_torch.chat.mapping import ChatNotes, chat_source, sessions_to_notes
from soulmem_torch.chat.readers import (
    LoCoMoQuestion,
    LoCoMoSample,
    LongMemEvalQuestion,
    parse_chat_time,
    read_chat_jsonl,
    read_locomo,
    read_longmemeval,
    write_chat_jsonl,
)

__all__ = [
    "ChatNotes",
    "ChatSession",
    "ChatTurn",
    "LoCoMoQuestion",
    "LoCoMoSample",
    "LongMemEvalQuestion",
    "chat_source",
    "parse_chat_time",
    "read_chat_jsonl",
    "read_locomo",
    "read_longmemeval",
    "sessions_to_notes",
    "write_chat_jsonl",
]
