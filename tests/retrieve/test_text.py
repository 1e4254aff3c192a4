"""The text channel's index (``soulmem_torch/retrieve/text.py``): the bulk reader of note
strings and the one-pass index of many memories equal their per-memory references."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from soulmem_torch.data import sample_memory_path
from soulmem_torch.model.soul_tune import load_soul_tune_graph
from soulmem_torch.retrieve.text import (
    _strings,
    build_text_index,
    build_text_indexes,
    note_strings,
    query_strings,
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


def _reference_index(notes):
    """The index as per-note ``text_terms`` of each string define it: term ids in order of
    first appearance, counts per (note, term), one memory's BM25."""
    from soulmem_torch.functional.fusion import bm25_note_weights, bm25_term_major
    from soulmem_torch.retrieve.text import text_terms

    per_note = [[t for s in note_strings(note) for t in text_terms(s)] for note in notes]
    vocab: dict[str, int] = {}
    for terms in per_note:
        for t in terms:
            vocab.setdefault(t, len(vocab))
    counts: dict[tuple[int, int], int] = {}
    for i, terms in enumerate(per_note):
        for t in terms:
            counts[(i, vocab[t])] = counts.get((i, vocab[t]), 0) + 1
    keys = sorted(counts)
    tf = torch.sparse_coo_tensor(
        torch.tensor(keys, dtype=torch.int64).reshape(-1, 2).T,
        torch.tensor([counts[k] for k in keys], dtype=torch.float64),
        (len(notes), len(vocab)),
        check_invariants=True,
    ).coalesce()
    weights = bm25_note_weights(tf)
    return vocab, weights, bm25_term_major(weights)


def test_the_index_equals_per_string_terms_bit_for_bit() -> None:
    from soulmem_torch.model import MemoryNote, SemMemory

    def sem(content: str, description: str) -> MemoryNote:
        return MemoryNote.build(
            SemMemory(content=content, aliases=[content], concept_type="Entity",
                      description=description)
        )  # fmt: skip

    notes = _notes()
    mixed = [
        sem("北京烤鸭 Peking duck", "我最喜欢的菜：烤鸭, visited twice"),
        sem("tab\x01separated", "ＦＵＬＬＷＩＤＴＨ words ﬁ ligature"),
        sem("猫", "a lone 猫 between words"),
    ]
    for memory in (notes, notes[:10] + mixed, mixed):
        vocab, weights, term_major = _reference_index(memory)
        got = build_text_index(memory, device=torch.device("cpu"))
        assert list(got.vocab) == list(vocab)
        assert torch.equal(got.weights.indices(), weights.indices())
        assert torch.equal(got.weights.values(), weights.values())
        assert torch.equal(got.term_major.indices(), term_major.indices())
        assert torch.equal(got.term_major.values(), term_major.values())


def test_the_index_is_the_same_read_a_few_texts_per_pass(monkeypatch) -> None:
    from soulmem_torch.model import MemoryNote, SemMemory
    from soulmem_torch.retrieve import text

    notes = _notes()[:30] + [
        MemoryNote.build(SemMemory(content=c, aliases=[], concept_type="Entity", description=d))
        for c, d in [
            ("北京 Peking", "烤鸭 twice"),
            ("plain words", "more words"),
            ("ＦＵＬＬ", "ﬁ"),
        ]
    ]
    memories = [notes, notes[5:], notes[::-1]]  # shared texts, both kinds interleaved
    cpu = torch.device("cpu")
    want = build_text_indexes(memories, device=cpu)
    monkeypatch.setattr(text, "_TEXTS_PER_PASS", 2)
    for a, b in zip(build_text_indexes(memories, device=cpu), want):
        _same_index(a, b)


@pytest.mark.parametrize("seed", range(3))
def test_query_strings_read_off_the_model_equal_the_json_dump(seed: int) -> None:
    """``query_strings`` reads a query's strings off its attributes: the strings (in order)
    its ``model_dump(mode="json")`` holds."""
    from tests.embedding.helpers import random_query

    rng = np.random.default_rng(seed)
    for _ in range(200):
        q = random_query(rng)
        assert query_strings(q) == _strings(q.variant.model_dump(mode="json"), [])
