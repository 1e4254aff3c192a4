"""The compact note layout (docs/spec.md §3, DECISION "compact note layout") through a bank:
each vector held once by the notes / snapshots and once, normalized, by the union; no dense
``(N, F, D)`` block anywhere; the union's rows carried across splices bit for bit."""

from __future__ import annotations

import pytest
import torch

from soulmem_torch import HashingEmbedder, MemoryBank
from soulmem_torch.embedding import FIELD_NAMES
from soulmem_torch.embedding.query_embedding import cached_note_side
from soulmem_torch.functional.sparse_rows import SparseRows

from .helpers import sample_notes

DIM = 64
F = len(FIELD_NAMES)


def _bank(subsets: list[list[int]], *, dim: int = DIM) -> MemoryBank:
    bank = MemoryBank(embedder=HashingEmbedder(dim=dim))
    for a, subset in enumerate(subsets):
        bank.add_agent(f"a{a}", sample_notes(subset))
    return bank


def _tensors(value, out: list[torch.Tensor]) -> list[torch.Tensor]:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            if v.layout == torch.strided:
                out.append(v)
        elif isinstance(v, SparseRows):
            stack.extend([v.crow, v.col, v.val])
        elif isinstance(v, (tuple, list)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif hasattr(v, "__dataclass_fields__"):
            stack.extend(
                getattr(v, f) for f in v.__dataclass_fields__ if f not in ("graphs", "cache")
            )
    return out


def _dense(table):
    return table.to_dense() if isinstance(table, SparseRows) else table


def _distinct_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def test_bank_memory_is_bounded_by_the_compact_layout() -> None:
    """Snapshots + union + caches after an ask: at most two copies (raw, normalized) of each
    distinct vector plus small per-note and per-link tensors (the small agents' dense PPR
    inverses aside); every note vector is a view of its snapshot's tables; no tensor
    has the dense (…, F, D) shape."""
    bank = _bank([list(range(0, 40)), list(range(20, 77)), list(range(10, 30))])
    agents = bank.agents()
    bank.ask(agents, ["a rainy afternoon at the café", "谁是我的朋友？", "the market square"])
    union = bank.union()
    graphs = [bank.graph(a) for a in agents]
    n = sum(int(g.num_nodes) for g in graphs)
    p = sum(int(g.field_rows.shape[0]) for g in graphs)
    e = sum(int(g.num_edges) for g in graphs)
    tensors: list[torch.Tensor] = []
    for a, g in zip(agents, graphs):
        _tensors([v for _, v in g], tensors)
        _tensors(list(g.cache.values()), tensors)
        for item in bank.agent(a).cluster:  # the notes' vectors live in the snapshot tables
            emb = item.embedding
            for vec in (emb.tag, *emb.fields.values()):
                ptr = vec.untyped_storage().data_ptr()
                assert ptr in (g.tag_emb.untyped_storage().data_ptr(),
                               g.field_rows.untyped_storage().data_ptr())  # fmt: skip
    _tensors(union, tensors)
    # every union cache but the small agents' dense PPR inverses (operators, not notes)
    _tensors([v for k, v in union.cache.items() if not (isinstance(k, tuple) and k[0] == "dense")],
             tensors)  # fmt: skip
    assert not any(t.dim() >= 2 and tuple(t.shape[-2:]) == (F, DIM) for t in tensors)
    # raw tags and distinct field rows + the normalized ones: dense, or (sparse tables) their
    # cells (8 bytes) and row offsets
    normalized = 0
    for table, rows in ((union.notes.rows, p + 1), (union.notes.tag, n)):
        normalized += (
            table.nnz * 8 + (rows + 1) * 8 if isinstance(table, SparseRows) else rows * DIM * 4
        )
    vectors = (n + p + 1) * DIM * 4 + normalized
    per_note = n * (F * (8 + 1 + 4) + 256)  # field indices, masks, node tensors, caches
    per_link = e * 256  # edge tensors, weights, both transition operators, BM25 postings
    assert _distinct_bytes(tensors) <= vectors + per_note + per_link
    # distinct rows: the fields built from the same texts share one row
    assert p < sum(int(g.field_pos.ge(0).sum()) for g in graphs)


@pytest.mark.parametrize("dim", [DIM, 1024])
def test_union_rows_are_the_snapshots_note_sides_and_carried_across_splices(
    dim: int, monkeypatch
) -> None:
    """Either layout: at width 1024 the hashed vectors are sparse (``SparseRows``; small
    tables allowed sparse here)."""
    import soulmem_torch.functional.similarity as fsim
    import soulmem_torch.functional.sparse_rows as sr

    if dim == 1024:
        monkeypatch.setattr(fsim, "SPARSE_MIN_CELLS", 0)
        monkeypatch.setattr(sr, "SPARSE_MIN_CELLS", 0)
    bank = _bank([list(range(0, 30)), list(range(30, 60))], dim=dim)
    if dim == 1024:
        assert isinstance(bank.union().notes.rows, SparseRows)
        assert isinstance(bank.union().notes.tag, SparseRows)
    before = bank.union()
    for a, g in zip(bank.agents(), (bank.graph(x) for x in bank.agents())):
        own = cached_note_side(g, cache=False)
        lo, hi = (int(x) for x in before.ptr[[bank.agents().index(a), bank.agents().index(a) + 1]])
        r0 = int(before.row_ptr[bank.agents().index(a)])
        assert torch.equal(_dense(before.notes.tag)[lo:hi], _dense(own.tag))
        assert torch.equal(_dense(before.notes.rows)[before.notes.index[lo:hi][own.mask]],
                           _dense(own.rows)[own.index[own.mask]])  # fmt: skip
        assert torch.equal(before.notes.index[lo:hi][own.mask] - r0, own.index[own.mask])
    bank.add_agent("a2", sample_notes(list(range(60, 77))))
    spliced = bank.union()
    assert spliced is not before
    rows = int(before.row_ptr[-1])
    # the old agents' normalized rows are carried (same values), the new agent's appended
    assert torch.equal(_dense(spliced.notes.rows)[:rows], _dense(before.notes.rows)[:rows])
    from soulmem_torch.bank._union import build_union

    full = build_union([bank.graph(a) for a in bank.agents()], bank.device)
    for name in ("rows", "index", "mask", "tag", "no_tag", "has_emb"):
        got, want = getattr(spliced.notes, name), getattr(full.notes, name)
        assert torch.equal(_dense(got), _dense(want)), name
    assert torch.equal(spliced.row_ptr, full.row_ptr)


def test_chat_turns_share_speaker_and_environment_rows() -> None:
    from soulmem_torch.chat import ChatSession, ChatTurn, sessions_to_notes

    turns = [ChatTurn(id=f"t{i}", role="user", speaker="user", text=f"message {i}")
             for i in range(12)]  # fmt: skip
    made = sessions_to_notes(
        [ChatSession(id="s1", time=None, turns=turns)], level="turn", roles=["user"]
    )
    bank = MemoryBank(embedder=HashingEmbedder(dim=DIM))
    bank.add_agent("chat", made.notes)
    g = bank.graph("chat")
    pos = g.field_pos
    for name in ("participant_name", "participant_role", "environment_atmosphere"):
        col = pos[:, FIELD_NAMES.index(name)]
        used = col[col >= 0].unique()
        assert used.numel() == 1, name  # one row for every turn
