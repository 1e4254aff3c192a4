"""Identical notes (one note saved twice under two ids): they tie exactly in every similarity
kernel, so the tie-break (the lower column first) orders them the same in a memory and in a
bank — the lists equal entry by entry, not only as tie groups."""

from __future__ import annotations

import random
import uuid

import pytest
import torch

from soulmem_torch import MemoryBank, SoulMem
from soulmem_torch.embedding import HashingEmbedder
from soulmem_torch.functional.similarity import row_dots, rows_matmul
from soulmem_torch.model import LinkId, MemoryId

from .helpers import sample_notes

_NS = uuid.UUID("0b9f6c2e-7d1a-4c55-9e3b-5a2d7f0c8e61")


def _with_copies(seed: int, copies: int = 30) -> list:
    notes = sample_notes()
    rng = random.Random(seed)
    extra = []
    for k, note in enumerate(rng.choices(notes, k=copies)):
        nid = MemoryId(uuid.uuid5(_NS, f"{seed}/{k}"))
        links = [
            link.model_copy(update={"id": LinkId(uuid.uuid5(_NS, f"{seed}/{k}/{j}")), "from_": nid})
            for j, link in enumerate(note.mem_links)
        ]
        extra.append(note.model_copy(update={"id": nid, "mem_links": links}))
    out = notes + extra
    rng.shuffle(out)
    return out


def _question(notes: list, rng: random.Random) -> str:
    texts = [
        getattr(n.mem_type, name)
        for n in notes
        for name in ("narrative", "description", "content")
        if isinstance(getattr(n.mem_type, name, None), str) and getattr(n.mem_type, name).strip()
    ]
    return " ".join(rng.choice(texts).split()[:8])


def _exact(got: list, want: list) -> None:
    assert [i for i, _ in got] == [i for i, _ in want]
    for (_, a), (_, b) in zip(got, want):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(b))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_memory_with_copies_answers_as_its_bank(seed):
    rng = random.Random(100 + seed)
    agents = [_with_copies(seed * 10 + a) for a in range(3)]
    questions = [_question(n, rng) for n in agents for _ in range(2)]
    names = [f"a{a}" for a in range(3) for _ in range(2)]
    bank = MemoryBank(embedder=HashingEmbedder())
    for a, notes in enumerate(agents):
        bank.add_agent(f"a{a}", notes)
    got = bank.ask(names, questions, record=False)
    for a, notes in enumerate(agents):
        mem = SoulMem(embedder=HashingEmbedder())
        mem.add_notes(notes)
        for b in (2 * a, 2 * a + 1):
            want = mem.ask(questions[b], record=False)[0]
            _exact(got[b].seeds, want.seeds)
            _exact(got[b].association, want.association)
            _exact(got[b].action, want.action)


def test_small_dense_tables_score_identical_rows_identically():
    gen = torch.Generator().manual_seed(0)
    table = torch.nn.functional.normalize(torch.randn(37, 1024, generator=gen), dim=1)
    table[29] = table[3]  # one row twice, in a GEMM's edge block and in a full one
    a = torch.randn(5, 1024, generator=gen)
    out = rows_matmul(a, table)
    assert torch.equal(out[:, 3], out[:, 29])
    cols = torch.arange(37).expand(5, 37)
    assert torch.equal(out, row_dots(a, table, cols))  # the union's kernel, bit for bit
    torch.testing.assert_close(out, a @ table.T, rtol=1e-5, atol=1e-5)
