"""``MemoryBank.add_agents``: many agents added in one write, the agents ``add_agent`` of each
adds — the same vectors, the same terms, the same answers — and all or nothing."""

from __future__ import annotations

import pytest
import torch

from soulmem_torch import HashingEmbedder, MemoryBank
from soulmem_torch.embedding import embed_notes
from soulmem_torch.errors import ValidationError
from soulmem_torch.retrieve.text import (
    note_terms_of,
    note_text,
    remember_note_terms,
    remember_notes_terms,
)

from .helpers import TEXTS, sample_notes


def _agents() -> dict[str, list]:
    """Four agents over the sample memory, sharing many of their notes, one of them empty."""
    return {
        "npc-0": sample_notes(list(range(0, 40))),
        "npc-1": sample_notes(list(range(20, 77))),
        "npc-2": [],
        "npc-3": sample_notes([3, 5, 8, 13, 21, 34, 55]),
    }


def _one_by_one(agents: dict[str, list], **kwargs) -> MemoryBank:
    bank = MemoryBank(embedder=HashingEmbedder(), **kwargs)
    for agent_id, notes in agents.items():
        bank.add_agent(agent_id, notes)
    return bank


def _vectors(bank: MemoryBank, agent_id: str) -> list[torch.Tensor]:
    out = []
    for item in bank.agent(agent_id).cluster:
        emb = item.embedding
        out.append(emb.tag)
        out.extend(emb.fields[name] for name in sorted(emb.fields))
    return out


def test_the_same_agents_as_add_agent_one_by_one(device):
    agents = _agents()
    want = _one_by_one(agents, device=device)
    bank = MemoryBank(embedder=HashingEmbedder(), device=device)
    counts = bank.add_agents(agents)
    assert counts == {agent_id: len(notes) for agent_id, notes in agents.items()}
    assert list(counts) == bank.agents() == want.agents()
    for agent_id in agents:
        assert bank.agent(agent_id).cluster.ids() == want.agent(agent_id).cluster.ids()
        for got, ref in zip(_vectors(bank, agent_id), _vectors(want, agent_id), strict=True):
            assert torch.equal(got, ref)  # the same vectors, bit for bit
        got_terms = note_terms_of(bank.agent(agent_id).cluster)
        ref_terms = note_terms_of(want.agent(agent_id).cluster)
        for note in agents[agent_id]:
            text = note_text(note)
            assert got_terms.counts(text) == ref_terms.counts(text)
    asked = ["npc-0", "npc-1", "npc-3", "npc-0"]
    questions = [TEXTS[0], TEXTS[1], TEXTS[2], TEXTS[3]]
    for got, ref in zip(
        bank.ask(asked, questions, record=False), want.ask(asked, questions, record=False)
    ):
        assert got.association == ref.association  # the same ids and scores, bit for bit
        assert got.action == ref.action
        assert got.seeds == ref.seeds


def test_pairs_and_given_embeddings():
    agents = _agents()
    given = {"npc-3": embed_notes(agents["npc-3"], HashingEmbedder())}
    bank = MemoryBank(embedder=HashingEmbedder())
    counts = bank.add_agents([list(pair) for pair in agents.items()], embeddings=given)
    assert counts == {agent_id: len(notes) for agent_id, notes in agents.items()}
    want = _one_by_one(agents)
    for got, ref in zip(_vectors(bank, "npc-3"), _vectors(want, "npc-3"), strict=True):
        assert torch.equal(got, ref)
    assert bank.add_agents({}) == {}
    assert len(bank) == 4


@pytest.mark.parametrize(
    ("agents", "embeddings", "match"),
    [
        ({"npc-0": [], "old": []}, None, "'old' is already in the bank"),
        ([("npc-0", []), ("npc-0", [])], None, "'npc-0' is given twice"),
        ({"": []}, None, "agent_id: expected a non-empty string"),
        ([("npc-0",)], None, r"agents\[0\]: expected an \(agent_id, notes\) pair"),
        ({"npc-0": sample_notes([1]), "npc-1": [sample_notes([2])[0], "note"]}, None,
         r"notes\[1\] of 'npc-1': expected a MemoryNote, found str"),
        ({"npc-0": sample_notes([1])[0]}, None, "notes of 'npc-0': expected an iterable"),
        ({"npc-0": sample_notes([1])}, {"npc-9": []}, "agent 'npc-9' is not among"),
        ({"npc-0": sample_notes([1, 2])}, {"npc-0": []},
         r"embeddings: expected 2 \(one per note of 'npc-0'\), found 0"),
        ({"npc-0": []}, [], "embeddings: expected a mapping"),
        ("npc-0", None, "agents: expected a mapping"),
        (7, None, "agents: expected a mapping"),
        ({"npc-0": 3}, None, "notes of 'npc-0': expected an iterable"),
        ({"npc-0": []}, {"npc-0": 3}, "embeddings of 'npc-0': expected one MemoryEmbedding"),
    ],
)  # fmt: skip
def test_a_refused_write_changes_nothing(agents, embeddings, match):
    bank = MemoryBank(embedder=HashingEmbedder())
    bank.add_agent("old", sample_notes([0, 1]))
    with pytest.raises(ValidationError, match=match):
        bank.add_agents(agents, embeddings=embeddings)
    assert bank.agents() == ["old"]
    assert len(bank.ask(["old"], [TEXTS[0]], record=False)) == 1


def test_a_failed_embedder_adds_no_agent():
    class Broken(HashingEmbedder):
        def __call__(self, texts):
            raise RuntimeError("the model is gone")

    bank = MemoryBank(embedder=Broken())
    with pytest.raises(RuntimeError, match="the model is gone"):
        bank.add_agents({"npc-0": sample_notes([0]), "npc-1": sample_notes([1])})
    assert bank.agents() == []


def test_terms_of_many_memories_in_one_pass():
    """``remember_notes_terms``: each memory holds what ``remember_note_terms`` of it alone
    holds; a text two memories share is read once (both hold the same arrays)."""
    from soulmem_torch import SoulMem

    notes = sample_notes()
    groups = [notes[:30], notes[20:50], [], notes[45:]]
    together = [SoulMem(embedder=HashingEmbedder()) for _ in groups]
    alone = [SoulMem(embedder=HashingEmbedder()) for _ in groups]
    remember_notes_terms([m.cluster for m in together], groups)
    for mem, group in zip(alone, groups):
        remember_note_terms(mem.cluster, group)
    for a, b, group in zip(together, alone, groups):
        got, want = note_terms_of(a.cluster), note_terms_of(b.cluster)
        assert set(got.terms) == set(want.terms) == {note_text(n) for n in group}
        for text in got.terms:
            assert got.counts(text) == want.counts(text)
    shared = note_text(notes[25])
    first, second = note_terms_of(together[0].cluster), note_terms_of(together[1].cluster)
    assert first.terms[shared][0] is second.terms[shared][0]
    with pytest.raises(ValidationError, match="notes: expected 2 lists"):
        remember_notes_terms([together[0].cluster, together[1].cluster], [groups[0]])
