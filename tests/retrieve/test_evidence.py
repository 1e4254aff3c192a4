"""``ask(..., only_matching=True)`` (the default): results that matched nothing the question
said are left out (``soulmem_torch/retrieve/evidence.py``)."""

from __future__ import annotations

import pytest

from soulmem_torch import MemoryBank, SoulMem
from soulmem_torch.data import sample_memory_path
from soulmem_torch.errors import ValidationError
from soulmem_torch.retrieve.evidence import STOP_TERMS, query_terms
from soulmem_torch.retrieve.text import note_strings, text_terms


@pytest.fixture(scope="module")
def mem() -> SoulMem:
    return SoulMem.from_graph_file(sample_memory_path())


def _terms(mem: SoulMem, mid) -> set[str]:
    return {t for s in note_strings(mem.cluster.get(mid).note) for t in text_terms(s)}


def test_a_question_that_matches_nothing_gets_nothing(mem: SoulMem) -> None:
    (r,) = mem.ask("quantum chromodynamics")
    assert r.association == [] and r.action == [] and r.seeds == []
    (everything,) = mem.ask("quantum chromodynamics", only_matching=False)
    assert len(everything.association) == 10  # the offline embedder's floor scores every note


@pytest.mark.parametrize(
    "question", ["a rainy afternoon", "谁教我做桂花糕？", "who taught me the cake?", "coffee"]
)
def test_every_kept_result_matches_or_is_linked_to_a_match(mem: SoulMem, question: str) -> None:
    (kept,) = mem.ask(question)
    (full,) = mem.ask(question, only_matching=False)
    terms = query_terms(question)
    assert terms and not terms & STOP_TERMS
    assert kept.association, question
    # the kept rows are the full list's rows with evidence, in the same order, same scores
    assert kept.association == [row for row in full.association if row in kept.association]
    for mid, _ in kept.association + kept.action:
        linked = [lk.to for lk in mem.cluster.out_links(mid)]
        linked += [lk.from_ for lk in mem.cluster.in_links(mid)]
        assert terms & _terms(mem, mid) or any(terms & _terms(mem, n) for n in linked)
    dropped = [mid for mid, _ in full.association if (mid, _) not in kept.association]
    for mid in dropped:
        assert not terms & _terms(mem, mid)


def test_function_words_are_no_evidence(mem: SoulMem) -> None:
    assert query_terms("who is the one?") == {"one"}
    assert query_terms("谁是我的朋友？") == {"朋友", "的朋"}


def test_the_bank_filters_as_soulmem_does() -> None:
    from soulmem_torch.model.soul_tune import load_soul_tune_graph

    graph = load_soul_tune_graph(sample_memory_path())
    bank = MemoryBank()
    bank.add_agent("a", graph.notes[:40], readable_ids=graph.readable_ids)
    own = SoulMem.from_notes(graph.notes[:40])
    texts = ["a rainy afternoon", "quantum chromodynamics", "coffee"]
    for text, got in zip(texts, bank.ask(["a"] * 3, texts)):
        (want,) = own.ask(text)
        assert [i for i, _ in got.association] == [i for i, _ in want.association]


def test_bank_takes_one_flag_per_question() -> None:
    bank = MemoryBank()
    bank.add_agent("a", SoulMem.from_graph_file(sample_memory_path()).cluster.notes())
    kept, every = bank.ask(["a", "a"], ["quantum chromodynamics"] * 2, only_matching=[True, False])
    assert kept.association == [] and len(every.association) == 10
    with pytest.raises(ValidationError, match="only_matching"):
        bank.ask(["a"], ["tea"], only_matching=[True, False])


def test_note_terms_read_off_the_text_index_are_each_notes_own_terms() -> None:
    from soulmem_torch.graph import MemoryGraph
    from soulmem_torch.retrieve.evidence import _terms_of_index
    from soulmem_torch.retrieve.text import text_index

    fresh = SoulMem.from_graph_file(sample_memory_path())
    assert _terms_of_index(fresh.cluster) == {}  # no snapshot yet: nothing is built
    graph = MemoryGraph.of(fresh.cluster)
    assert _terms_of_index(fresh.cluster) == {}  # no text index yet
    assert text_index(graph, fresh.working_memory) is not None
    own = _terms_of_index(fresh.cluster)
    for mid in graph.ids:  # made on first use, each note's own
        terms = own.get(mid)
        assert len(set(terms)) == len(terms), mid  # distinct
        assert frozenset(terms) == frozenset(_terms(fresh, mid)), mid
    assert own.get(object()) is None  # not a note of the snapshot
