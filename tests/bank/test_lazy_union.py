"""Agents join the bank's union at their first query (docs/spec.md §3 DECISION "agents join the
union when asked"): answers are the same as per-agent ones whatever was asked before, agents
not asked are never snapshotted, and the spliced union equals one built from scratch."""

from __future__ import annotations

import torch

from soulmem_torch import MemoryBank
from soulmem_torch.bank import _union
from soulmem_torch.bank._union import build_union

from .helpers import TEXTS, assert_same_result, sample_notes
from .test_bank import _reference

_GRAPH = ("graph", torch.device("cpu"))
_UNION_FIELDS = (
    "ptr", "eptr", "sizes", "agent", "node_type", "edge_index", "edge_kind", "intensity",
    "confidence", "prob", "tag_emb", "tag_mask", "field_emb", "field_mask", "row_ptr",
)  # fmt: skip


def _bank(num_agents: int, device) -> MemoryBank:
    bank = MemoryBank(device=device)
    for a in range(num_agents):
        bank.add_agent(f"a{a}", sample_notes(list(range(3 * a, 3 * a + 12 + a))))
    return bank


def _snapshotted(bank: MemoryBank, agent: str) -> bool:
    return bank.agent(agent).working_memory.cluster.cached(_GRAPH) is not None


def _assert_union_is_a_full_build(bank: MemoryBank) -> None:
    union = bank._union
    full = build_union(union.graphs, union.device)
    for name in _UNION_FIELDS:
        got, want = getattr(union, name), getattr(full, name)
        assert (got is None) == (want is None), name
        if got is not None:
            assert torch.equal(got, want), name


def test_batches_of_new_agents_answer_as_each_agent_alone(device, monkeypatch) -> None:
    builds = []

    def counted(graphs, dev):
        builds.append(len(graphs))
        return build_union(graphs, dev)

    monkeypatch.setattr(_union, "build_union", counted)
    bank = _bank(10, device)  # small batches of new agents: spliced in, not rebuilt
    batches = [["a0", "a1"], ["a2", "a0"], ["a4", "a1", "a10"]]
    for step, agents in enumerate(batches):
        if step == 2:  # an agent not yet asked changes, one is added: both join when asked
            bank.add_notes("a4", sample_notes(list(range(40, 50))))
            bank.add_agent("a10", sample_notes(list(range(20, 45))))
        texts = [TEXTS[(step + i) % len(TEXTS)] for i in range(len(agents))]
        results = bank.ask(agents, texts, record=False)
        for agent, text, got in zip(agents, texts, results):
            assert_same_result(got, _reference(bank, agent, text, None))
        _assert_union_is_a_full_build(bank)
    assert builds == [10]  # the first batch's union; the next two batches were spliced


def test_an_agent_not_asked_is_not_snapshotted(device) -> None:
    bank = _bank(5, device)
    bank.ask(["a1", "a3"], [TEXTS[0], TEXTS[3]], record=False)
    assert [_snapshotted(bank, f"a{a}") for a in range(5)] == [False, True, False, True, False]
    assert bank._union.sizes.tolist() == [0, 13, 0, 15, 0]
    # reading the whole union brings every agent in
    union = bank.union()
    assert union.sizes.tolist() == [12, 13, 14, 15, 16]
    assert all(_snapshotted(bank, f"a{a}") for a in range(5))
    _assert_union_is_a_full_build(bank)


def test_answers_do_not_depend_on_what_joined_before(device) -> None:
    lazy, whole = _bank(4, device), _bank(4, device)
    whole.union()  # every agent in before the first question
    agents, texts = ["a2", "a0"], [TEXTS[1], TEXTS[4]]
    lazy.ask(["a3"], [TEXTS[2]], record=False)
    for got, want in zip(
        lazy.ask(agents, texts, record=False), whole.ask(agents, texts, record=False)
    ):
        assert_same_result(got, want)
