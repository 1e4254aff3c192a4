"""The exact dense PPR of small agents on the union (docs/spec.md §6, DECISION "exact small
graphs"): each agent's :func:`~soulmem_torch.functional.ppr_dense.dense_factors`, kept in
one flat buffer per (channel, edge weights, damping), and one gather + one
:func:`~soulmem_torch.functional.ppr_dense.dense_ppr_entries` call for a whole batch.

An agent's factors are computed from its own snapshot's transition
(:mod:`soulmem_torch.retrieve.operators`: ``transition`` / ``undirected_transition``, cached on
the snapshot) by the same function the
per-agent path uses, so the bank and a ``SoulMem`` of that agent read the same bits; the
entries are combined in the same order, so their results are bit-identical on the CPU.

The buffer holds the factors of the agents that have been asked (``n^2 + n`` float64 per
agent and channel: 2 × 79 KiB for an agent of 100 notes), filled on first use, carried over
when the union is spliced (a changed agent's block is dropped and refilled when it is next
asked), bounded by :func:`cache_limit` (the least recently asked agents' blocks dropped past
it, never those of the call at hand) and compacted when dropped blocks outweigh the live ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from soulmem_torch.bank._union import UnionSnapshot, agent_graph
from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.ppr_dense import dense_factors_many, dense_ppr_entries
from soulmem_torch.retrieve.operators import transition, undirected_transition, weight_key

__all__ = ["DenseStore", "carry_dense", "segment_dense_ppr"]

_F64 = torch.float64
_BATCH_FLOATS = 1 << 22  # floats of one batched inverse (as ``functional.ppr_dense``'s)
_I64 = torch.int64
_SLACK = 4096  # floats kept free past the last block: a row window never leaves the buffer


def cache_limit() -> int:
    """Bytes one store may hold (``SOULMEM_DENSE_CACHE_BYTES``, default 1 GiB): past it, the
    blocks of the agents asked least recently are dropped (and recomputed, to the same bits,
    when those agents are asked again)."""
    import os

    raw = os.environ.get("SOULMEM_DENSE_CACHE_BYTES", str(1 << 30))
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError(
            f"SOULMEM_DENSE_CACHE_BYTES: expected a whole number of bytes, found {raw!r}"
        ) from None
    if value < 0:
        raise ValidationError(f"SOULMEM_DENSE_CACHE_BYTES: expected >= 0, found {value}")
    return value


@dataclass(eq=False)
class DenseStore:
    """The agents' dense factors for one (channel, weight key, damping), in one buffer.

    Attributes:
        data: 1-D float64, capacity ≥ ``used``. Agent ``p``'s block is ``data[start[p] :
            start[p] + length[p]]``: ``inverse_t`` (``n^2``, row-major) then
            ``dangling_mass`` (``n``). Every float is finite and the buffer is zero past
            ``used`` (a row window may read a little past its block).
        used: floats written (live and dropped blocks).
        start: per agent position, ``-1`` when absent.
        length: per agent position, the block's floats (0 when absent).
        last: per agent position, the call that last asked it (for dropping the least
            recently asked blocks past :func:`cache_limit`).
        calls: calls so far.
    """

    data: Tensor
    used: int
    start: list[int]
    length: list[int]
    last: list[int]
    calls: int = 0
    _start_t: Tensor | None = None
    _fresh_from: int | None = None  # (a grown buffer: not zeroed past here yet)

    @classmethod
    def empty(cls, num_agents: int, device: torch.device) -> DenseStore:
        return cls(
            torch.empty(0, dtype=_F64, device=device),
            0,
            [-1] * num_agents,
            [0] * num_agents,
            [0] * num_agents,
        )

    def touch(self, positions: list[int]) -> None:
        """Record one call asking the agents ``positions``."""
        self.calls += 1
        last, now = self.last, self.calls
        for p in positions:
            last[p] = now

    @property
    def live(self) -> int:
        """Floats of the live blocks."""
        return sum(self.length)

    def start_tensor(self, device: torch.device) -> Tensor:
        """``start`` as an int64 tensor (cached until the next change)."""
        if self._start_t is None:
            self._start_t = torch.tensor(self.start, dtype=_I64, device=device)
        return self._start_t

    def carried(self, num_agents: int, dropped: set[int]) -> DenseStore:
        """The store for a union of ``num_agents`` agents in which the agents ``dropped``
        changed (their blocks become garbage) and the new ones are absent."""
        extra = num_agents - len(self.start)
        start = [(-1 if p in dropped else s) for p, s in enumerate(self.start)] + [-1] * extra
        length = [(0 if p in dropped else n) for p, n in enumerate(self.length)] + [0] * extra
        last = self.last + [0] * extra
        return DenseStore(self.data, self.used, start, length, last, self.calls)

    def append(
        self, blocks: list[Tensor], positions: list[int], *, keep: set[int] | None = None
    ) -> None:
        """Write ``blocks`` (of agents ``positions``) after the others: past
        :func:`cache_limit`, the least recently asked blocks not in ``keep`` are dropped
        first; compacts when dropped blocks outweigh the live ones; grows by doubling."""
        pos = self._reserve(sum(int(b.numel()) for b in blocks), keep or set())
        placed = []
        with self._writing():
            for block, p in zip(blocks, positions):
                self.data[pos : pos + block.numel()] = block
                placed.append((p, pos, int(block.numel())))
                pos += int(block.numel())
        self._written(pos, placed)

    def append_chunks(
        self, chunks: list[tuple[list[int], Tensor, Tensor]], *, keep: set[int] | None = None
    ) -> None:
        """:meth:`append` of same-sized agents' factors as they come out of a batched
        inverse: each chunk ``(positions, inverses (k, n, n), mass (k, n))`` is written
        straight into the buffer (each agent's block ``inverses[i]`` transposed, row-major,
        then ``mass[i]``: the floats :meth:`append` of those blocks writes), one copy per
        part instead of a block at a time."""
        sizes = [int(inv.shape[1]) for _, inv, _ in chunks]
        total = sum(len(ps) * (n * n + n) for (ps, _, _), n in zip(chunks, sizes))
        pos = self._reserve(total, keep or set())
        placed = []
        with self._writing():
            for (ps, inverses, mass), n in zip(chunks, sizes):
                k, size = len(ps), n * n + n
                rows = self.data[pos : pos + k * size].view(k, size)
                rows[:, : n * n].view(k, n, n).copy_(inverses.transpose(1, 2))
                rows[:, n * n :].copy_(mass)
                placed.extend((p, pos + i * size, size) for i, p in enumerate(ps))
                pos += k * size
        self._written(pos, placed)

    def _reserve(self, floats: int, keep: set[int]) -> int:
        """Room for ``floats`` more (and :data:`_SLACK` past them) after ``used``, blocks
        dropped past the limit / the buffer compacted or grown as needed: the position they
        start at. A grown buffer is not zeroed where blocks will be written
        (:meth:`_written` zeroes what stays past them)."""
        need = floats + _SLACK
        self._evict(floats, keep)
        if self.used + need > self.data.numel():
            live = self.live
            if self.used > 2 * live:
                self._compact(live + need)
            if self.used + need > self.data.numel():
                # room for a quarter more: agents asked later mostly fit without a copy
                size = max(2 * self.data.numel(), (self.used + need) * 5 // 4)
                grown = torch.empty(size, dtype=_F64, device=self.data.device)
                grown[: self.used] = self.data[: self.used]
                self._fresh_from = self.used  # (past ``used``: not zeroed yet)
                self.data = grown
        return self.used

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """A write that fails changes nothing the store reads: what it wrote past ``used``
        is zeroed again (no block was recorded yet)."""
        try:
            yield
        except BaseException:
            self.data[self.used :].zero_()
            self._fresh_from = None
            raise

    def _written(self, end: int, placed: list[tuple[int, int, int]]) -> None:
        """Blocks ``placed`` (``(agent position, start, floats)``) written up to ``end``:
        recorded, and the buffer is zero past them again."""
        if self._fresh_from is not None:
            self.data[max(end, self._fresh_from) :].zero_()
            self._fresh_from = None
        for p, start, length in placed:
            self.start[p], self.length[p] = start, length
        self.used = end
        self._start_t = None

    def _evict(self, incoming: int, keep: set[int]) -> None:
        limit = cache_limit() // 8  # floats
        live = self.live
        if live + incoming <= limit:
            return
        held = sorted(
            (self.last[p], p) for p, s in enumerate(self.start) if s >= 0 and p not in keep
        )
        for _, p in held:
            if live + incoming <= limit:
                break
            live -= self.length[p]
            self.start[p], self.length[p] = -1, 0
        self._start_t = None

    def _compact(self, capacity: int) -> None:
        fresh = torch.zeros(max(capacity, 1), dtype=_F64, device=self.data.device)
        pos = 0
        for p, (s, n) in enumerate(zip(self.start, self.length)):
            if s >= 0:
                fresh[pos : pos + n] = self.data[s : s + n]
                self.start[p] = pos
                pos += n
        self.data, self.used = fresh, pos
        self._start_t = None


def _store_key(config: Any, undirected: bool) -> tuple[Any, ...]:
    return ("dense", undirected, float(config.damping_factor), *weight_key(config))


def carry_dense(new: UnionSnapshot, old: UnionSnapshot | None, changed: list[int]) -> None:
    """Hand ``old``'s dense stores to ``new``: agents keep their positions (the bank only
    appends agents), a changed agent's block is dropped, new agents start absent."""
    if old is None:
        return
    dropped = set(changed)
    for key, store in old.cache.items():
        if isinstance(key, tuple) and key and key[0] == "dense":
            new.cache[key] = store.carried(new.num_agents, dropped)


def _fill(
    union: UnionSnapshot,
    store: DenseStore,
    missing: list[int],
    config: Any,
    undirected: bool,
    *,
    keep: set[int],
    union_transition: Any = None,
) -> None:
    d = float(config.damping_factor)
    # the first ask of an agent (or after it changed): O(n^3) each, same-sized agents' inverses
    # in one batch
    if union.device.type == "cpu" and union_transition is not None:
        op = union_transition(union, config, undirected=undirected)
        store.append_chunks(_dense_blocks(union, op, missing, d), keep=keep)
        return
    build = undirected_transition if undirected else transition
    operators = [build(agent_graph(union, p), config) for p in missing]
    blocks = [
        torch.cat([f.inverse_t.reshape(-1), f.dangling_mass])
        for f in dense_factors_many(operators, d, cache=False)
    ]
    store.append(blocks, missing, keep=keep)


def _dense_blocks(
    union: UnionSnapshot, op: Any, missing: list[int], d: float
) -> list[tuple[list[int], Tensor, Tensor]]:
    """Agents ``missing``'s factors as :meth:`DenseStore.append_chunks` takes them (``(agent
    positions, M (k, n, n), g^T M (k, n))`` per batch of same-sized agents), read off the union's
    transition (``bank._operators.union_transition``: one vectorized build for every agent,
    the values of each agent's own ``build_transition``): the dense ``P^T`` of all same-sized
    agents scattered in one pass, inverted by one batched ``torch.linalg.inv`` and their
    dangling rows summed in order (``index_add_``) — the bits of ``dense_factors`` on each
    agent's own operator, without building one operator per agent (``op``: that union
    operator)."""
    t = op.transpose
    crow, col = t.crow_indices().to(torch.int64), t.col_indices().to(torch.int64)
    val = t.values().to(_F64)
    miss = torch.tensor(missing, dtype=torch.int64, device=union.device)
    sizes = union.sizes.index_select(0, miss)
    chunks: list[tuple[list[int], Tensor, Tensor]] = []
    for n in torch.unique(sizes).tolist():  # one pass per distinct agent size
        members = (sizes == n).nonzero().reshape(-1)
        if n == 0:  # empty agents: empty blocks
            k = int(members.numel())
            none = torch.zeros(k, 0, dtype=_F64, device=union.device)
            chunks.append(([missing[g] for g in members.tolist()], none.view(k, 0, 0), none))
            continue
        step = max(1, _BATCH_FLOATS // (n * n))
        for lo in range(0, int(members.numel()), step):
            chunk = members[lo : lo + step]
            k = int(chunk.numel())
            first = union.ptr.index_select(0, miss.index_select(0, chunk))  # (k,)
            local = torch.arange(n, device=union.device)
            nodes = (first.unsqueeze(1) + local).reshape(-1)  # (k·n,) union rows, agent-major
            start = crow.index_select(0, nodes)
            length = crow.index_select(0, nodes + 1) - start
            row = torch.repeat_interleave(torch.arange(k * n, device=union.device), length)
            pos = torch.repeat_interleave(start - (torch.cumsum(length, 0) - length), length)
            pos += torch.arange(int(row.numel()), device=union.device)
            src = col.index_select(0, pos) - first.index_select(0, row // n)
            dense = torch.zeros(k * n * n, dtype=_F64, device=union.device)
            dense[row * n + src] = val.index_select(0, pos)  # each (target, source) once
            a = torch.eye(n, dtype=_F64, device=union.device).repeat(k, 1, 1)
            a.sub_(dense.view(k, n, n), alpha=d)
            inverses = torch.linalg.inv(a)
            dangling = (op.out_degree.index_select(0, nodes) == 0).nonzero().reshape(-1)
            mass = torch.zeros(k, n, dtype=_F64, device=union.device).index_add_(
                0, dangling // n, inverses.reshape(k * n, n).index_select(0, dangling)
            )
            chunks.append(([missing[g] for g in chunk.tolist()], inverses, mass))
    return chunks


def segment_dense_ppr(
    union: UnionSnapshot,
    config: Any,
    agents: Tensor,
    weights: Tensor,
    keys: Tensor,
    oks: Sequence[Tensor],
    *,
    undirected: Sequence[bool],
    union_transition: Any = None,
) -> list[Tensor]:
    """Exact PPR on the agents' blocks (each agent at most ``config.power_dense_max_nodes``
    notes), one channel per ``undirected`` flag (the ``graph_undirected`` channel's operator
    when set): channel ``c`` answers the rows ``oks[c]``. Returns one ``(B, M)`` float64 per
    channel, rows normalized, zero elsewhere.

    Args:
        agents: (B,) agent position of every row.
        weights: (B, M) float64 personalization on candidate rows.
        keys: (B, M) bool, the keys.
        oks: per channel, (B,) bool, the rows to answer.
        undirected: per channel, which operator.
        union_transition: ``bank._operators.union_transition`` (passed in: that module imports
            this one): a first ask's missing agents' factors are read off the union's
            transition on the CPU; ``None`` → each agent's own operator.
    """
    b, m = weights.shape
    device = weights.device
    outs = [torch.zeros(b, m, dtype=_F64, device=device) for _ in oks]
    any_ok = torch.zeros(b, dtype=torch.bool, device=device)
    for ok in oks:
        any_ok |= ok
    rows = any_ok.nonzero().reshape(-1)
    if rows.numel() == 0 or m == 0:
        return outs
    # the (query, key) entries, by query then key: shared by the channels
    entry_row, node = (keys & any_ok.unsqueeze(1)).nonzero(as_tuple=True)
    if entry_row.numel() == 0:  # rows without keys: nothing to walk from
        return outs
    agent = agents.index_select(0, entry_row)
    n = union.sizes.index_select(0, agent)
    weight = weights[entry_row, node]
    involved = torch.unique(agents.index_select(0, rows))
    width = int(union.sizes.index_select(0, involved).max())
    asked = involved.tolist()
    inside = None
    if width > int(n.min()):
        inside = torch.arange(width, device=device).unsqueeze(0) < n.unsqueeze(1)
    for c, (ok, flag) in enumerate(zip(oks, undirected)):
        if not bool(ok.any()):
            continue
        store = _store(union, config, flag, device)
        store.touch(asked)
        missing = involved[store.start_tensor(device).index_select(0, involved) < 0].tolist()
        if missing:
            _fill(
                union, store, missing, config, flag, keep=set(asked),
                union_transition=union_transition,
            )  # fmt: skip
        start = store.start_tensor(device).index_select(0, agent)
        # row ``node`` of each entry's block: ``width`` floats from its first (one window
        # gather; the buffer keeps ``width`` floats of slack past its end), past ``n`` zeroed
        windows = store.data.as_strided((store.data.numel() - width + 1, width), (1, 1))
        gathered = windows.index_select(0, start + node * n)
        if inside is not None:
            gathered = gathered.mul_(inside)
        mass = store.data.index_select(0, start + n * n + node)
        x = dense_ppr_entries(
            gathered, mass, weight, entry_row, num_queries=b,
            damping=float(config.damping_factor), scratch=True,  # (a fresh gather)
        )  # fmt: skip
        outs[c][:, :width] = x.mul_(ok.unsqueeze(1))
    return outs


def _store(union: UnionSnapshot, config: Any, undirected: bool, device: torch.device) -> DenseStore:
    key = _store_key(config, undirected)
    store = union.cache.get(key)
    if store is None:
        store = union.cache[key] = DenseStore.empty(union.num_agents, device)
    return store
