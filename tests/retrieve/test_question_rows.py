"""A question's (concept, episode) rows mixed, and filtered for evidence, on the tensors
(``run_stages``' ``questions``): the same lists, bit for bit, as the rows' own lists mixed by
``question_results`` and filtered by ``evidence.filter_result``."""

from __future__ import annotations

import random

import pytest
import torch

from soulmem_torch import MemoryBank, SoulMem
from soulmem_torch.bank._pipeline import UnionBackend
from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.fusion import candidate_term_hits, mix_row_pairs, reach_one_hop
from soulmem_torch.retrieve import DefaultPipelineConfig
from soulmem_torch.retrieve.evidence import filter_result
from soulmem_torch.retrieve.pipeline import GraphBackend
from soulmem_torch.retrieve.priority import mix_by_priority_batch
from soulmem_torch.retrieve.questions import question_results, text_queries
from tests.bank.helpers import TEXTS, sample_notes


def _bits(results):
    return [
        (
            [(str(i), float(s).hex()) for i, s in r.association],
            [(str(i), float(s).hex()) for i, s in r.action],
            [(str(i), float(s).hex()) for i, s in r.seeds],
            r.short_mem, r.priority, list(r.short_history),
        )
        for r in results
    ]  # fmt: skip


# -- the kernels against Python references ---------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_mix_row_pairs_is_mix_by_priority_of_the_two_lists(seed: int) -> None:
    rng = random.Random(seed)
    q, k, m = 40, 6, 12
    values = torch.zeros(2 * q, k, dtype=torch.float64)
    index = torch.zeros(2 * q, k, dtype=torch.int64)
    valid = torch.zeros(2 * q, k, dtype=torch.bool)
    for r in range(2 * q):
        n = rng.randint(0, k)
        cols = rng.sample(range(m), n)
        # few distinct scores: ties within a list, across the lists and at the cut
        scores = sorted((rng.choice([0.5, 0.25, 0.125, 0.75, 1.0]) for _ in cols), reverse=True)
        values[r, :n] = torch.tensor(scores, dtype=torch.float64)
        index[r, :n] = torch.tensor(cols, dtype=torch.int64)
        valid[r, :n] = True
    for top_k in (None, 3, 0, 20):
        got = mix_row_pairs(values, index, valid, top_k=top_k)
        assert got is not None
        v, i, ok = got
        lists = [
            [(int(c), float(s)) for c, s, o in zip(index[r], values[r], valid[r]) if o]
            for r in range(2 * q)
        ]
        want = mix_by_priority_batch(
            [[lists[2 * j], lists[2 * j + 1]] for j in range(q)], [0, 0], top_k=top_k
        )
        mixed = [[(int(c), float(s)) for c, s, o in zip(i[j], v[j], ok[j]) if o] for j in range(q)]
        assert [[(c, s.hex()) for c, s in row] for row in mixed] == [
            [(c, s.hex()) for c, s in row] for row in want
        ]


def test_mix_row_pairs_leaves_nan_and_odd_rows_to_the_caller() -> None:
    values = torch.tensor([[float("nan")], [0.5]], dtype=torch.float64)
    index = torch.zeros(2, 1, dtype=torch.int64)
    assert mix_row_pairs(values, index, torch.ones(2, 1, dtype=torch.bool)) is None
    # a NaN in an entry that is not real is no score
    assert mix_row_pairs(values, index, torch.tensor([[False], [True]])) is not None
    with pytest.raises(ValidationError, match="pair of rows per question"):
        mix_row_pairs(values[:1], index[:1], torch.ones(1, 1, dtype=torch.bool))


def test_candidate_term_hits_and_reach_one_hop_against_python() -> None:
    rng = random.Random(3)
    # two memories laid end to end: 5 and 4 notes, 6 and 3 terms
    sizes = [5, 4]
    entries = [(t, n) for t in range(9) for n in range(9) if rng.random() < 0.3]
    entries = [(t, n) for t, n in entries if (t < 6) == (n < 5)]  # a term is one memory's
    t_of, n_of = zip(*sorted(entries))
    term_major = torch.sparse_coo_tensor(
        torch.tensor([t_of, n_of]),
        torch.ones(len(t_of), dtype=torch.float64),
        (9, 9),
        check_invariants=True,
    ).coalesce()
    owner = [0, 1, 0, 1]
    first = torch.tensor([0, 5, 0, 5])
    query_cols = [[0, 2, 5], [6], [], [7, 8]]
    rows = [r for r, cols in enumerate(query_cols) for _ in cols]
    cols = [c for cs in query_cols for c in cs]
    query_terms = torch.sparse_coo_tensor(
        torch.tensor([rows, cols], dtype=torch.int64).reshape(2, -1),
        torch.ones(len(cols), dtype=torch.float64), (4, 9), check_invariants=True,
    ).coalesce()  # fmt: skip
    hits = candidate_term_hits(query_terms, term_major, first, 5)
    posting = set(zip(t_of, n_of))
    for r in range(4):
        for j in range(5):
            note = int(first[r]) + j
            want = j < sizes[owner[r]] and any((c, note) in posting for c in query_cols[r])
            assert bool(hits[r, j]) == want
    # links: memory 0: 0→1, 3→2; memory 1 (global 5..8): 6→8
    edge_index = torch.tensor([[0, 3, 6], [1, 2, 8]])
    estart, ecount = torch.tensor([0, 2, 0, 2]), torch.tensor([2, 1, 2, 1])
    reach = reach_one_hop(hits, edge_index, estart, ecount, first)
    for r in range(4):
        links = [(int(s) - int(first[r]), int(t) - int(first[r]))
                 for s, t in edge_index.T[int(estart[r]) : int(estart[r] + ecount[r])].tolist()]  # fmt: skip
        for j in range(5):
            near = any((s == j and hits[r, t]) or (t == j and hits[r, s]) for s, t in links)
            assert bool(reach[r, j]) == (bool(hits[r, j]) or near)
    assert hits.any() and (reach & ~hits).any()  # the case says something
    assert not reach_one_hop(hits[:0], edge_index, estart[:0], ecount[:0], first[:0]).numel()


# -- the front doors against the rows' own lists ----------------------------------------------


@pytest.fixture(scope="module")
def bank() -> MemoryBank:
    bank = MemoryBank()
    bank.add_agent("a", sample_notes())
    bank.add_agent("b", sample_notes(list(range(0, 77, 3))))
    bank.add_agent("c", sample_notes(list(range(1, 77, 2))))
    return bank


QUESTIONS = [*TEXTS[:4], "quantum chromodynamics", "谁教我做桂花糕？"]


def _by_rows(bank: MemoryBank, agents, texts, config, flags):
    """The reference: every row's own lists, mixed by ``question_results``, filtered by
    ``filter_result``."""
    requests = [(a, q) for a, t in zip(agents, texts) for q in text_queries(t)]
    rows = bank.query(requests, config=config, record=False)
    out = question_results(rows, config.merge_top_k)
    return [
        filter_result(bank.agent(a).cluster, t, r) if f else r
        for a, t, r, f in zip(agents, texts, out, flags)
    ]


@pytest.mark.parametrize(
    "config", [DefaultPipelineConfig.for_questions(), DefaultPipelineConfig.original()]
)
def test_bank_ask_is_the_rows_mixed_and_filtered(bank: MemoryBank, config) -> None:
    agents = ["a", "b", "c", "a", "c", "b", "b"]
    texts = [*QUESTIONS, TEXTS[0]]
    flags = [True, False, True, True, True, True, False]
    got = bank.ask(agents, texts, config=config, record=False, only_matching=flags)
    assert _bits(got) == _bits(_by_rows(bank, agents, texts, config, flags))


def test_soulmem_ask_is_the_rows_mixed_and_filtered() -> None:
    mem = SoulMem()
    mem.add_notes(sample_notes())
    config = DefaultPipelineConfig.for_questions()
    for only in (True, False):
        got = mem.ask(QUESTIONS, record=False, only_matching=only)
        queries = [q for t in QUESTIONS for q in text_queries(t)]
        rows = mem.query(queries, config=config, record=False)
        want = question_results(rows, config.merge_top_k)
        if only:
            want = [filter_result(mem.cluster, t, r) for t, r in zip(QUESTIONS, want)]
        assert _bits(got) == _bits(want)


@pytest.mark.parametrize("backend", [UnionBackend, GraphBackend])
def test_without_the_tensor_evidence_the_lists_are_filtered(
    bank: MemoryBank, backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    mem = bank.agent("a")
    want_bank = bank.ask(["a", "b"], QUESTIONS[:2], record=False)
    want_mem = mem.ask(QUESTIONS[:3], record=False)
    monkeypatch.setattr(backend, "evidence", lambda self: None)
    assert _bits(bank.ask(["a", "b"], QUESTIONS[:2], record=False)) == _bits(want_bank)
    assert _bits(mem.ask(QUESTIONS[:3], record=False)) == _bits(want_mem)


def test_a_nan_score_mixes_the_lists(bank: MemoryBank, monkeypatch: pytest.MonkeyPatch) -> None:
    from soulmem_torch.retrieve import stages

    want = bank.ask(["a", "c"], QUESTIONS[:2], record=False)
    monkeypatch.setattr(stages, "mix_row_pairs", lambda *a, **k: None)  # as a NaN does
    assert _bits(bank.ask(["a", "c"], QUESTIONS[:2], record=False)) == _bits(want)


def test_questions_need_a_pair_of_rows_each(bank: MemoryBank) -> None:
    from soulmem_torch.retrieve import RetrDefaultPipeline

    mem = bank.agent("a")
    request = DefaultPipelineConfig().into_request(mem.working_memory, TEXTS[0])
    with pytest.raises(ValidationError, match="a concept and an episode query per question"):
        RetrDefaultPipeline().retrieve_questions([request], [True])
    assert RetrDefaultPipeline().retrieve_questions([], []) == []
