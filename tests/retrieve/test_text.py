"""The text channel's index (``soulmem_torch/retrieve/text.py``): the bulk reader of note
strings and the one-pass index of many memories equal their per-memory references."""

from __future__ import annotations

import random
from types import SimpleNamespace

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


def _mixed_notes() -> list:
    from soulmem_torch.model import MemoryNote, SemMemory

    extra = [
        MemoryNote.build(SemMemory(content=c, aliases=[], concept_type="Entity", description=d))
        for c, d in [
            ("北京 Peking", "烤鸭 twice"),
            ("plain words", "more words"),
            ("ＦＵＬＬ", "ﬁ"),
            ("the", "of and"),  # stopwords only: a text without terms
        ]
    ]
    return _notes()[:40] + extra


def test_kept_terms_give_the_same_index_bit_for_bit(monkeypatch) -> None:
    """An index built with each memory's NoteTerms — empty, filled by the build, filled on
    write, partly stale — is the index built without them, and a held text is not read
    again."""
    from soulmem_torch.retrieve import text
    from soulmem_torch.retrieve.text import NoteTerms, note_text, remember_note_terms

    notes = _mixed_notes()
    memories = [notes, notes[7:], notes[::-1], []]
    cpu = torch.device("cpu")
    want = build_text_indexes(memories, device=cpu)
    stores = [NoteTerms(), NoteTerms(), None, NoteTerms()]
    for a, b in zip(build_text_indexes(memories, device=cpu, stores=stores), want):
        _same_index(a, b)  # empty stores: everything read, and put in the stores
    assert set(stores[0].terms) == {note_text(n) for n in notes}
    assert set(stores[1].terms) == {note_text(n) for n in notes[7:]}
    assert stores[3].terms == {}
    assert stores[0].counts(note_text(notes[-1])) == {}  # stopwords only
    for note in notes:  # each held text: its terms counted, in order of first appearance
        assert list(stores[0].counts(note_text(note)).items()) == list(_counts(note).items())

    read: list[int] = []
    real = text._read_texts

    def counting(ids, texts, rows):
        read.append(len(rows))
        return real(ids, texts, rows)

    monkeypatch.setattr(text, "_read_texts", counting)
    # memory 2 has no store, but its texts are memory 0's: a held text is taken from any
    # store of a note that holds it
    for a, b in zip(build_text_indexes(memories, device=cpu, stores=stores), want):
        _same_index(a, b)
    assert read == [0]  # every text is held by memory 0's store

    # a store with a stale text (a note since changed) and one filled on write
    mem = SimpleNamespace(cluster=_FakeCluster(notes[:10]))
    remember_note_terms(mem, notes[:10])
    held = mem.cluster.store
    assert set(held.terms) == {note_text(n) for n in notes[:10]}
    held.terms["stale text"] = (np.zeros(1, np.int32), np.ones(1, np.int32))
    alone = build_text_index(notes[:10], device=cpu)
    read.clear()
    (got,) = build_text_indexes([notes[:10]], device=cpu, stores=[held])
    _same_index(got, alone)
    assert read == [0] and "stale text" not in held.terms  # kept: this build's texts only


def _counts(note_or_text) -> dict[str, int]:
    """The reference: ``text_terms`` of each string, counted in order of first appearance."""
    from collections import Counter

    from soulmem_torch.retrieve.text import text_terms

    strings = note_strings(note_or_text) if not isinstance(note_or_text, str) else [note_or_text]
    return dict(Counter(t for s in strings for t in text_terms(s)))


def test_a_text_read_on_write_has_the_terms_of_its_strings_counted() -> None:
    """``remember_note_terms`` holds each text as its distinct terms (in order of first
    appearance) and their counts: those of ``text_terms`` of its strings."""
    from soulmem_torch.model import MemoryNote, SemMemory
    from soulmem_torch.retrieve.text import note_terms_of, note_text, remember_note_terms

    extra = ["tab\x01sep and\x01", "ＦＵＬＬ 北京烤鸭 ﬁ 北京", "", "the of", "猫", "a b a c b a"]
    notes = _mixed_notes() + [
        MemoryNote.build(SemMemory(content=c, aliases=[c], concept_type="Entity", description=c))
        for c in extra
    ]
    mem = SimpleNamespace(cluster=_FakeCluster(notes))
    remember_note_terms(mem, notes)
    store = note_terms_of(mem)
    assert len(store) == len({note_text(n) for n in notes})
    for note in notes:
        got = store.counts(note_text(note))
        assert list(got.items()) == list(_counts(note).items())
        ids, counts = store.terms[note_text(note)]
        assert ids.dtype == counts.dtype == np.int32 and len(set(ids.tolist())) == len(ids)
    assert store.counts("not held") is None


def test_a_new_numbering_rereads_what_the_old_one_held(monkeypatch) -> None:
    """When the process's term numbering outgrows its bound it starts over: texts held in the
    old one are read again (the same index, bit for bit), none is misread."""
    from soulmem_torch.retrieve import text
    from soulmem_torch.retrieve.text import NoteTerms, note_text

    notes = _mixed_notes()
    cpu = torch.device("cpu")
    want = build_text_index(notes, device=cpu)
    store = NoteTerms()
    _same_index(build_text_indexes([notes], device=cpu, stores=[store])[0], want)
    before = text._NUMBERING.generation
    monkeypatch.setattr(text, "_TERMS_MAX", 0)  # the next read starts a new numbering
    read: list[int] = []
    real = text._read_texts

    def counting(ids, texts, rows):
        read.append(len(rows))
        return real(ids, texts, rows)

    monkeypatch.setattr(text, "_read_texts", counting)
    _same_index(build_text_indexes([notes], device=cpu, stores=[store])[0], want)
    assert text._NUMBERING.generation > before and store.generation == text._NUMBERING.generation
    assert read == [len({note_text(n) for n in notes})]  # every held text read again
    monkeypatch.setattr(text, "_TERMS_MAX", 1 << 21)
    read.clear()
    _same_index(build_text_indexes([notes], device=cpu, stores=[store])[0], want)
    assert read == [0]


class _FakeCluster:
    """A cluster's two members ``remember_note_terms`` uses."""

    def __init__(self, notes) -> None:
        self._notes = list(notes)
        self.store = None

    def __len__(self) -> int:
        return len(self._notes)

    def notes(self):
        return iter(self._notes)

    def kept(self, key, make):
        if self.store is None:
            self.store = make()
        return self.store


def test_terms_read_on_write_stay_bounded() -> None:
    """Notes replaced many times without an index build: the kept texts stay within twice
    the memory's notes (+ 1,024), the memory's own always among them."""
    from soulmem_torch.model import MemoryNote, SemMemory
    from soulmem_torch.retrieve.text import note_text, remember_note_terms

    def sem(i: int) -> MemoryNote:
        return MemoryNote.build(
            SemMemory(content=f"thing {i}", aliases=[], concept_type="Entity", description="")
        )

    cluster = _FakeCluster([])
    mem = SimpleNamespace(cluster=cluster)
    for i in range(3000):  # one note, replaced 3,000 times
        note = sem(i)
        remember_note_terms(mem, [note])
        cluster._notes = [note]
        assert len(cluster.store.terms) <= 2 * 1 + 1024 + 1
    assert note_text(note) in cluster.store.terms


def test_soulmem_reads_terms_on_write_and_rereads_only_what_changed(monkeypatch) -> None:
    """``SoulMem.add_notes`` reads the new notes' terms; the next ask's index reads no text;
    after one more note only that one is read; answers equal a memory without kept terms."""
    from soulmem_torch import SoulMem
    from soulmem_torch.retrieve import text

    notes = _mixed_notes()
    mem = SoulMem()
    mem.add_notes(notes[:-3])
    read: list[int] = []
    real = text._read_texts

    def counting(ids, texts, rows):
        read.append(len(rows))
        return real(ids, texts, rows)

    monkeypatch.setattr(text, "_read_texts", counting)
    first = mem.ask("Peking duck words")
    assert read == [0]
    mem.add_notes(notes[-3:])
    assert read == [0, 3]  # on write: the three new texts
    read.clear()
    again = mem.ask("Peking duck words")
    assert read == [0]
    fresh = SoulMem()
    fresh.working_memory.add_nodes(notes, [e for e in _embeddings(fresh, notes)])
    monkeypatch.setattr(text, "_read_texts", real)
    want = fresh.ask("Peking duck words")[0].association
    assert [i for i, _ in again[0].association] == [i for i, _ in want]
    assert first[0].association  # the channel found something


def _embeddings(mem, notes):
    from soulmem_torch.embedding import embed_notes

    return embed_notes(notes, mem.embedder)


@pytest.mark.parametrize("seed", range(3))
def test_query_strings_read_off_the_model_equal_the_json_dump(seed: int) -> None:
    """``query_strings`` reads a query's strings off its attributes: the strings (in order)
    its ``model_dump(mode="json")`` holds."""
    from tests.embedding.helpers import random_query

    rng = np.random.default_rng(seed)
    for _ in range(200):
        q = random_query(rng)
        assert query_strings(q) == _strings(q.variant.model_dump(mode="json"), [])


def test_terms_on_write_take_embedded_notes_and_leave_bad_items_to_the_write() -> None:
    from soulmem_torch import SoulMem
    from soulmem_torch.errors import ValidationError
    from soulmem_torch.retrieve.text import note_terms_of, note_text
    from soulmem_torch.runtime.cluster import EmbeddedMemoryNote

    notes = _mixed_notes()[:3]
    mem = SoulMem()
    assert mem.add_notes([EmbeddedMemoryNote(notes[0], None), notes[1]]) == 2
    assert set(note_terms_of(mem).terms) == {note_text(n) for n in notes[:2]}
    with pytest.raises(ValidationError, match=r"notes\[1\]"):
        mem.add_notes([notes[2], "not a note"])
    assert len(mem) == 2


def test_a_query_finds_the_same_columns_by_term_ids_as_by_the_vocab() -> None:
    """An index built in one pass finds a query's columns by the terms' ids (no dict of
    terms made); the same columns as its ``vocab`` gives, unknown terms left out."""
    from soulmem_torch.errors import ValidationError
    from soulmem_torch.retrieve.text import TextIndex, text_terms

    notes = _mixed_notes()
    cpu = torch.device("cpu")
    lazy = build_text_indexes([notes, notes[10:], []], device=cpu)
    # the same indexes again, read through their vocab (``vocab`` is made on the first read)
    again = build_text_indexes([notes, notes[10:], []], device=cpu)
    strings = [s for n in notes for s in note_strings(n)] + ["unheard words", "北京 烤鸭 猫"]
    words = [*sorted({t for s in strings for t in text_terms(s)}), "unheard", "猫猫"]
    rng = random.Random(1)
    for index, twin in zip(lazy, again):
        by_dict = TextIndex(dict(twin.vocab), twin.weights, twin.term_major)
        for _ in range(50):
            query = rng.sample(strings, 3)
            assert index.term_ids(query) == by_dict.term_ids(query)
            terms = rng.sample(words, 8)
            assert index.term_columns(terms) == by_dict.term_columns(terms)
        assert index._vocab is None or not index.num_terms  # found by ids: no dict was made
        assert index.term_names() == list(index.vocab)
        assert index.num_terms == len(index.vocab) == len(
            {t for n in (notes if index is lazy[0] else notes[10:] if index is lazy[1] else [])
             for s in note_strings(n) for t in text_terms(s)}
        )  # fmt: skip
    with pytest.raises(ValidationError, match="vocab"):
        TextIndex(None, lazy[0].weights, lazy[0].term_major)


@pytest.mark.parametrize("seed", range(4))
def test_first_appearance_numbers_keys_as_unique_ranked_by_first_index(seed: int) -> None:
    from soulmem_torch.retrieve.text import _first_appearance

    rng = np.random.default_rng(seed)
    key = rng.integers(0, [1, 5, 50, 10_000][seed], size=[0, 7, 300, 5000][seed] or 0)
    column, is_first = _first_appearance(key)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    assert np.array_equal(column, rank[inverse.reshape(-1)])
    assert np.array_equal(np.flatnonzero(is_first), np.sort(first))


def test_a_notes_text_is_walked_once_until_it_is_declared_changed(monkeypatch) -> None:
    """The text of each note is read off its fields on write and kept by the note object
    (``NoteTerms.texts``): an ask walks no note; a note changed in place and declared so
    (``mark_changed``), or removed and added again after a change, is read anew — the index
    then holds its new words, as a memory built from scratch does."""
    from soulmem_torch import SoulMem
    from soulmem_torch.model import MemoryNote, SemMemory
    from soulmem_torch.retrieve import text

    def sem(content: str, description: str) -> MemoryNote:
        return MemoryNote.build(
            SemMemory(content=content, aliases=[], concept_type="Entity", description=description)
        )

    notes = [sem("harbour", "boats in the harbour"), sem("orchard", "apple trees")]
    notes += [sem(f"thing {i}", f"plain words {i}") for i in range(5)]
    mem = SoulMem()
    mem.add_notes(notes)
    walked: list[str] = []
    real = text.note_text

    def counting(note):
        walked.append(note.mem_type.content)
        return real(note)

    monkeypatch.setattr(text, "note_text", counting)

    def index_terms():
        graph = mem.working_memory.graph()
        return set(text.text_index(graph, mem).term_names())

    assert "zebra" not in index_terms() and walked == []  # read on write, kept
    cluster = mem.working_memory.cluster
    notes[0].mem_type.description = "a zebra on the quay"
    cluster.mark_changed(notes[0].id)
    assert "zebra" in index_terms() and "boat" not in index_terms()
    assert walked == ["harbour"]  # only the note declared changed
    walked.clear()
    cluster.remove_note(notes[1].id)
    notes[1].mem_type.description = "pear xylophone"
    mem.add_notes([notes[1]])
    got = index_terms()
    assert {"pear", "xylophon"} <= got and "appl" not in got and walked == ["orchard"]
    fresh = SoulMem()
    fresh.add_notes(notes)
    assert set(text.text_index(fresh.working_memory.graph(), fresh).term_names()) == got
    assert mem.ask("zebra quay")[0].association[0][0] == notes[0].id


def test_a_text_read_while_a_change_is_declared_is_not_kept(monkeypatch) -> None:
    """A note declared changed while texts are being read (another thread's
    ``mark_changed``): the texts of that read are not kept (the next read walks the notes
    again), by the index build and by ``NoteTerms.text_of`` alike."""
    from soulmem_torch.retrieve import text
    from soulmem_torch.retrieve.text import NoteTerms

    notes = _mixed_notes()[:6]
    store = NoteTerms()
    real = text.note_text

    def declaring(note):  # a change declared in the middle of the read
        if note is notes[2]:
            store.notes_changed([notes[0]])
        return real(note)

    monkeypatch.setattr(text, "note_text", declaring)
    cpu = torch.device("cpu")
    _same_index(
        build_text_indexes([notes], device=cpu, stores=[store])[0],
        build_text_index(notes, device=cpu),
    )
    assert store.texts == {}
    assert store.text_of(notes[2]) == real(notes[2]) and store.texts == {}
    assert store.text_of(notes[1]) == real(notes[1]) and list(store.texts) == [id(notes[1])]
    monkeypatch.setattr(text, "note_text", real)
    build_text_indexes([notes], device=cpu, stores=[store])
    assert set(store.texts) == {id(n) for n in notes}
