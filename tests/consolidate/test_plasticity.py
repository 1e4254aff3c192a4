"""Plasticity (LTP / LTD): the issue's exact values through the public API, the kernel against
the per-link loop, and the bank path against each agent's own update."""

from __future__ import annotations

import random

import pytest
import torch

from soulmem_torch import MemoryBank, SoulMem
from soulmem_torch.consolidate import (
    LinkChange,
    hot_notes,
    plasticity_delta,
    plasticity_reference,
)
from soulmem_torch.data import sample_memory_path
from soulmem_torch.errors import ValidationError
from soulmem_torch.graph import MemoryGraph
from soulmem_torch.model import MemoryId, MemoryLink, ProcMemory, TrigToAction
from soulmem_torch.model.notes import Action, MemoryNote
from soulmem_torch.model.soul_tune import load_soul_tune_graph
from soulmem_torch.model.timestamp import Timestamp
from soulmem_torch.runtime import Record

from ._memories import linked_pair, sem


def test_plasticity_delta_exact_values():
    assert plasticity_delta(0.0) == -0.05
    assert plasticity_delta(0.5) == 0.0
    assert plasticity_delta(1.0) == 0.08
    assert plasticity_delta(0.49) < 0
    assert plasticity_delta(0.51) > 0


def test_two_notes_retrieved_once_strengthen_their_link_once():
    mem, a, b = linked_pair(0.4)
    mem.working_memory.record_retrieval(a.id)
    mem.working_memory.record_retrieval(b.id)
    changes = mem.update_plasticity()
    assert len(changes) == 1
    (c,) = changes
    assert isinstance(c, LinkChange)
    assert c.link_id == a.mem_links[0].id
    assert c.old_intensity == pytest.approx(0.4)
    assert c.new_intensity == pytest.approx(0.48)
    assert c.new_confidence == pytest.approx(0.48, abs=1e-6)
    link = mem.cluster[a.id].note.mem_links[0]
    assert link.intensity == pytest.approx(0.48)
    assert link.link_type.confidence == pytest.approx(0.48, abs=1e-6)
    # the snapshot of the new version has the new values, and equals a fresh rebuild
    g = mem.working_memory.graph()
    fresh = MemoryGraph.from_cluster(mem.cluster)
    assert g.version == mem.cluster.version
    assert torch.equal(g.intensity, fresh.intensity)
    assert torch.equal(g.confidence, fresh.confidence)
    # a second update without a new retrieval changes nothing
    assert mem.update_plasticity() == []
    assert mem.cluster[a.id].note.mem_links[0].intensity == pytest.approx(0.48)


def test_no_retrieval_no_change_and_one_hot_note_no_change():
    mem, a, _b = linked_pair(0.4)
    assert mem.update_plasticity() == []
    mem.working_memory.record_retrieval(a.id)
    # b has f = 0: norm 0 -> LTD on a -> b
    (c,) = mem.update_plasticity()
    assert c.new_intensity == pytest.approx(0.35)
    mem2, _a2, _ = linked_pair(0.4)
    assert mem2.update_plasticity(top_k=1) == []  # fewer than two hot notes


def test_proc_prob_and_clamping():
    sit = sem("rain")
    act = MemoryNote.build(ProcMemory(action=Action(content="offer tea", action_type="Speak")))
    sit.mem_links.append(MemoryLink.new(sit.id, act.id, TrigToAction(prob=0.97), intensity=0.99))
    mem = SoulMem.from_notes([sit, act])
    mem.working_memory.record_retrieval([sit.id, act.id])
    (c,) = mem.update_plasticity()
    assert c.new_intensity == 1.0 and c.new_prob == 1.0  # clamped to [0, 1]
    assert c.new_confidence is None


def test_hot_notes_ranking_ties():
    ids = sorted(MemoryId() for _ in range(4))
    now = Timestamp.now()
    recs = {}
    for mid, count in zip(ids, [2, 2, 3, 0]):
        r = Record.new(mid, now=now)
        r.retrieval_count = count
        recs[mid] = r
    ranked = hot_notes(recs, 3)
    assert [row[0] for row in ranked] == [ids[2], ids[0], ids[1]]
    assert hot_notes(recs, 0) == []
    with pytest.raises(ValidationError, match="top_k"):
        hot_notes(recs, -1)


def _random_memory(rng: random.Random, n: int = 30) -> SoulMem:
    notes = [sem(f"n{i}") for i in range(n)]
    for note in notes:
        for _ in range(rng.randrange(0, 5)):
            other = rng.choice(notes)
            value = round(rng.random(), 3)
            from soulmem_torch.model import SemMemLink

            note.mem_links.append(
                MemoryLink.new(
                    note.id, other.id, SemMemLink(verb="r", confidence=value), intensity=value
                )
            )
    mem = SoulMem.from_notes(notes)
    ids = [n.id for n in notes]
    for _ in range(rng.randrange(1, 40)):
        mem.working_memory.record_retrieval(rng.sample(ids, rng.randrange(1, 6)))
    for record in mem.working_memory.records.values():  # spans of 0 s to a day
        record.first_access_time = Timestamp.from_ns(
            record.last_access_time.ns_since_epoch - rng.randrange(0, 86_400 * 10**9)
        )
    return mem


@pytest.mark.parametrize("seed", range(6))
def test_kernel_matches_the_per_link_loop(seed):
    rng = random.Random(seed)
    mem = _random_memory(rng)
    top_k = rng.choice([2, 3, 8, 40])
    expected = plasticity_reference(mem.cluster.notes(), mem.working_memory.records, top_k)
    changes = mem.update_plasticity(top_k)
    got = {c.link_id: (c.new_intensity, c.new_confidence, c.new_prob) for c in changes}
    assert got == expected


def test_bank_update_equals_each_agents_own_update():
    notes = load_soul_tune_graph(sample_memory_path()).notes
    bank = MemoryBank()
    bank.add_agent("a", notes[:50])
    bank.add_agent("b", notes[30:])
    bank.add_agent("idle", notes[:20])
    # every agent in the union first (an agent not asked joins it when the whole union is
    # read): the update below then patches the union the questions used
    bank.union()
    for _ in range(2):
        # every fused answer (the evidence filter would leave "b" without retrievals)
        bank.ask(
            ["a", "b"], ["a rainy afternoon at the café", "谁是我的朋友？"], only_matching=False
        )
    refs = {
        ag: plasticity_reference(
            bank.agent(ag).cluster.notes(), bank.agent(ag).working_memory.records
        )
        for ag in ("a", "b", "idle")
    }
    before = bank.union()
    node_cache = before.cache.get("note_ids")
    changes = bank.update_plasticity()
    assert changes and {c.agent for c in changes} == {"a", "b"}
    # the union is patched, not rebuilt: the node caches are the same objects
    after = bank.union()
    assert after is not before and after.notes is before.notes
    assert node_cache is not None and after.cache.get("note_ids") is node_cache
    for ag in ("a", "b", "idle"):
        got = {
            c.link_id: (c.new_intensity, c.new_confidence, c.new_prob)
            for c in changes
            if c.agent == ag
        }
        assert got == refs[ag]
    assert bank.update_plasticity() == []
    # answers after the update are each agent's own answers (operators of the changed agents
    # rebuilt, the others' carried)
    for ag in ("a", "b", "idle"):
        (mine,) = bank.ask([ag], ["谁是我的朋友？"], record=False)
        (own,) = bank.agent(ag).ask("谁是我的朋友？", record=False)
        assert [i for i, _ in mine.association] == [i for i, _ in own.association]
        assert [s for _, s in mine.association] == pytest.approx([s for _, s in own.association])
    # the next query sees the new link values
    union = bank.union()
    g = bank.graph("a")
    assert torch.equal(g.intensity, MemoryGraph.from_cluster(bank.agent("a").cluster).intensity)
    lo, hi = int(union.eptr[0]), int(union.eptr[1])
    assert torch.equal(union.intensity[lo:hi], g.intensity)


def test_bank_agents_argument_is_checked():
    bank = MemoryBank()
    bank.add_agent("a", [sem("x")])
    with pytest.raises(ValidationError, match="distinct"):
        bank.update_plasticity(["a", "a"])
    with pytest.raises(KeyError):
        bank.update_plasticity(["nope"])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ties", [True, False])
def test_top_positions_matches_a_python_sort(seed, ties):
    from soulmem_torch.consolidate.plasticity import _top_positions

    gen = torch.Generator().manual_seed(seed)
    a, m, k = 50, 20, 6
    count = torch.randint(0, 4, (a, m), generator=gen)
    span = torch.randint(0, 3, (a, m), generator=gen)
    f = count.double() / span.clamp(min=1).double()
    if not ties:  # distinct frequencies: the no-tie path
        f = torch.rand(a, m, generator=gen, dtype=torch.float64)
    if ties:
        f[torch.rand(a, m, generator=gen) < 0.2] = -1.0  # excluded entries
    rank = torch.stack([torch.randperm(m, generator=gen) for _ in range(a)])
    fast = _top_positions(f, count, rank, k)
    exact = _top_positions(f, count + (1 << 40), rank, k)  # the exact sort path
    for row in range(a):
        ref = sorted(
            range(m), key=lambda j: (-f[row, j].item(), -count[row, j].item(), rank[row, j].item())
        )
        assert fast[row].tolist() == ref[:k] == exact[row].tolist()


def test_bank_update_of_some_agents():
    notes = load_soul_tune_graph(sample_memory_path()).notes
    bank = MemoryBank()
    for ag in ("a", "b", "c"):
        bank.add_agent(ag, notes[:40])
    bank.ask(["a", "b", "c"], ["a rainy afternoon at the café"] * 3)
    refs = {
        ag: plasticity_reference(
            bank.agent(ag).cluster.notes(), bank.agent(ag).working_memory.records
        )
        for ag in ("a", "c")
    }
    changes = bank.update_plasticity(["c", "a"])
    assert {c.agent for c in changes} == {"a", "c"}
    for ag in ("a", "c"):
        got = {
            c.link_id: (c.new_intensity, c.new_confidence, c.new_prob)
            for c in changes
            if c.agent == ag
        }
        assert got == refs[ag]
    assert bank.update_plasticity(["a", "c"]) == []
    assert {c.agent for c in bank.update_plasticity()} == {"b"}
    (r,) = bank.ask(["a"], ["rain"], record=False)
    (own,) = bank.agent("a").ask("rain", record=False)
    assert [i for i, _ in r.association] == [i for i, _ in own.association]


@pytest.mark.parametrize("seed", range(4))
def test_sparse_ranking_equals_the_padded_one(seed):
    from soulmem_torch.consolidate.plasticity import _rank_padded, _rank_sparse

    gen = torch.Generator().manual_seed(seed)
    a, m, k = 40, 30, 5
    ptr = torch.arange(a + 1) * m
    sizes = ptr[1:] - ptr[:-1]
    count = torch.randint(0, 4, (a * m,), generator=gen)
    count.view(a, m)[:, :k] += 1  # every agent retrieved at least k notes
    count.view(a, m)[a // 2] = 0  # and one retrieved nothing
    span = torch.randint(0, 5, (a * m,), generator=gen)
    rank = torch.stack([torch.randperm(m, generator=gen) for _ in range(a)]).reshape(-1)
    active = torch.rand(a, generator=gen) < 0.8
    has_record = torch.rand(a * m, generator=gen) < 0.95
    has_record.view(a, m)[:, :k] = True
    args = (count, span, rank, has_record, active, k, m, k)
    sparse = _rank_sparse(ptr, *args)
    assert sparse is not None
    padded = _rank_padded(ptr, sizes, *args)
    assert torch.equal(sparse[2], padded[2]) and torch.equal(sparse[3], padded[3])
    s_norm = dict(zip(sparse[0].tolist(), sparse[1].tolist()))
    p_norm = dict(zip(padded[0].tolist(), padded[1].tolist()))
    assert s_norm == p_norm
    count.view(a, m)[0, 1:] = 0  # an agent with a single retrieved note: the padded path
    assert _rank_sparse(ptr, *args) is None
