"""The one staged default pipeline (``retrieve/stages.py``): every entry point runs it, with the
one-memory or the union backend, and its result lists."""

from __future__ import annotations

import pytest
import torch

from soulmem_torch import MemoryBank, RetrDefaultPipeline
from soulmem_torch.bank._pipeline import UnionBackend
from soulmem_torch.retrieve import DefaultPipelineConfig, stages
from soulmem_torch.retrieve.pipeline import GraphBackend
from tests.bank.helpers import TEXTS, assert_same_result, sample_notes


@pytest.fixture
def backends(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The backend of every ``run_stages`` call (recorded at its similarity stage)."""
    seen: list[str] = []
    for cls in (GraphBackend, UnionBackend):
        original = cls.similarity

        def similarity(self, weights, _original=original, _name=cls.__name__):
            seen.append(_name)
            return _original(self, weights)

        monkeypatch.setattr(cls, "similarity", similarity)
    return seen


def test_every_entry_point_runs_the_staged_pipeline(backends: list[str]) -> None:
    bank = MemoryBank()
    bank.add_agent("a", sample_notes())
    bank.add_agent("b", sample_notes(list(range(0, 77, 3))))
    mem = bank.agent("a")
    cfg = DefaultPipelineConfig.original()

    bank.ask(["a", "b"], TEXTS[:2], config=cfg)
    assert backends == ["UnionBackend"]  # one call for the whole batch, both agents
    backends.clear()
    bank_results = bank.query([("a", TEXTS[0])], config=cfg)
    assert backends == ["UnionBackend"]
    backends.clear()

    one = mem.query([TEXTS[0]], config=cfg)
    assert backends == ["GraphBackend"]
    assert_same_result(bank_results[0], one[0])
    backends.clear()
    mem.ask(TEXTS[0])
    assert backends == ["GraphBackend"]  # the concept and the episode query: one batch
    backends.clear()

    request = cfg.into_request(mem.working_memory, TEXTS[0], embedder=mem.embedder)
    got = RetrDefaultPipeline().retrieve_batch([request, request])
    assert backends == ["GraphBackend"]
    assert got[0] == got[1]
    # (a batch of one may round the float32 similarity differently: the matmul's shape)
    assert_same_result(RetrDefaultPipeline().retrieve(request), got[0])


def test_result_lists_are_slices_of_one_flat_list() -> None:
    ids = ["n0", "n1", "n2", "n3"]
    seeds = (
        torch.tensor([[0.5, 0.25], [0.75, 0.0]]),
        torch.tensor([[1, 0], [3, 0]]),
        torch.tensor([[True, True], [True, False]]),
    )
    memory = (
        torch.tensor([[2.0], [1.0]], dtype=torch.float64),
        torch.tensor([[2], [1]]),
        torch.tensor([[True], [False]]),
    )
    pairs, ends = stages.result_lists(ids, None, seeds, memory)
    assert pairs == [("n1", 0.5), ("n0", 0.25), ("n2", 2.0), ("n3", 0.75)]
    assert ends == [2, 3, 4, 4]  # (row 0: seeds, memory), (row 1: seeds, memory)
    # candidate rows: column j of row b is ids[index[b, j]]
    index = torch.tensor([[3, 2, 1, 0], [0, 1, 2, 3]])
    pairs, _ = stages.result_lists(ids, index, seeds, memory)
    assert [i for i, _ in pairs] == ["n2", "n3", "n1", "n3"]


def test_row_topk_is_stable_and_masked() -> None:
    scores = torch.tensor([[1.0, 3.0, 3.0, 2.0]])
    mask = torch.tensor([[True, True, True, False]])
    selected, values, index, valid = stages.row_topk(scores, mask, 3)
    assert index.tolist() == [[1, 2, 0]]  # ties keep candidate order; the masked 2.0 is out
    assert values.tolist() == [[3.0, 3.0, 1.0]]
    assert valid.all()
    assert selected.tolist() == [[True, True, True, False]]
