"""The text channel's index (``soulmem_torch/retrieve/text.py``): the bulk reader of note
strings and the one-pass index of many memories equal their per-memory references."""

from __future__ import annotations

import random

import torch

from soulmem_torch.data import sample_memory_path
from soulmem_torch.model.soul_tune import load_soul_tune_graph
from soulmem_torch.retrieve.text import (
    _strings,
    build_text_index,
    build_text_indexes,
    note_strings,
)


def _notes() -> list:
    return load_soul_tune_graph(sample_memory_path()).notes


def test_note_strings_are_the_strings_of_the_json_dump() -> None:
    notes = _notes()
    kinds = {type(n.mem_type).__name__ for n in notes}
    assert kinds == {"SemMemory", "SpecificSituation", "AbstractSituation", "ProcMemory"}
    for note in notes:
        got = note_strings(note)
        assert got == _strings(note.mem_type.model_dump(mode="json"), [])
        assert all(type(s) is str for s in got)


def _same_index(a, b) -> None:
    assert a.vocab == b.vocab and list(a.vocab) == list(b.vocab)
    for x, y in ((a.weights, b.weights), (a.term_major, b.term_major)):
        assert x.shape == y.shape and x.is_coalesced() and y.is_coalesced()
        assert torch.equal(x.indices(), y.indices())
        assert torch.equal(x.values(), y.values())  # bit for bit


def test_one_pass_over_many_memories_equals_each_memory_alone() -> None:
    notes = _notes()
    rng = random.Random(0)
    memories = [rng.sample(notes, rng.randrange(0, len(notes))) for _ in range(12)]
    memories[3] = []  # a memory without notes
    memories[5] = notes[:1]
    cpu = torch.device("cpu")
    together = build_text_indexes(memories, device=cpu)
    assert len(together) == len(memories)
    for notes_k, index in zip(memories, together):
        _same_index(index, build_text_index(notes_k, device=cpu))
