"""``ShardedMemoryBank``: agents spread over the ranks of a ``torch.distributed`` group.

Every rank holds a :class:`MemoryBank` of the agents it owns (placement: a stable hash of the
agent id — BLAKE2b, not Python's salted ``hash`` — modulo the world size, or any function
``placement(agent_id, world_size) -> rank``). ``add_agent`` / ``add_agents`` / ``add_notes`` may be
called on every rank with every agent: a rank keeps only what it owns.

``ask`` and ``query`` are **collective**: every rank of the group calls them (with its own
requests, possibly none) and gets the answers to its own requests. Requests travel to their
owners and answers travel back with two ``all_gather_object`` exchanges (gloo on CPU, NCCL on
GPUs); each rank answers everything it received with one bank call. A request for an unknown
agent fails alone, and any error is raised only after both exchanges, so no rank is left
waiting in a collective.

Launch one process per GPU (or per CPU shard) with ``torchrun``; a demo::

    torchrun --standalone --nproc-per-node 2 -m soulmem_torch.bank.sharded
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from soulmem_torch.errors import NotFoundError, SoulMemError, ValidationError
from soulmem_torch.model import MemoryNote

__all__ = ["ShardedMemoryBank", "stable_placement"]


def stable_placement(agent_id: str, world_size: int) -> int:
    """The owner rank of an agent: BLAKE2b-64 of the UTF-8 id modulo ``world_size`` (the same
    on every process, run and platform)."""
    digest = hashlib.blake2b(agent_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % world_size


class _Failure:
    """An error answered for one request (pickled back to the requester)."""

    def __init__(self, exc: BaseException) -> None:
        self.type = type(exc)
        self.message = str(exc.args[0]) if exc.args else str(exc)

    def error(self) -> BaseException:
        try:
            return self.type(self.message)
        except Exception:  # pragma: no cover - an exotic exception type
            return SoulMemError(self.message)


class ShardedMemoryBank:
    """A :class:`MemoryBank` sharded by agent over a process group.

    Args:
        embedder: each rank's embedder (the same kind everywhere); ``None`` → hashing.
        device: this rank's retrieval device; ``None`` → CPU (with NCCL: ``"cuda:<local
            rank>"``).
        group: the process group (``None`` → the default group, which must be initialized).
        placement: ``placement(agent_id, world_size) -> rank``; ``None`` →
            :func:`stable_placement`.
    """

    def __init__(
        self,
        *,
        embedder: Any = None,
        device: Any = None,
        group: Any = None,
        placement: Callable[[str, int], int] | None = None,
    ) -> None:
        import torch.distributed as dist

        from soulmem_torch.bank.bank import MemoryBank

        if not dist.is_available() or not dist.is_initialized():
            raise SoulMemError(
                "ShardedMemoryBank: torch.distributed is not initialized; call "
                "torch.distributed.init_process_group first (e.g. under torchrun)"
            )
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.placement = placement or stable_placement
        self.local = MemoryBank(embedder=embedder, device=device)

    # -- placement and building (local, not collective) ---------------------------------------
    def owner(self, agent_id: str) -> int:
        """The rank that holds ``agent_id``."""
        if not isinstance(agent_id, str) or not agent_id:
            raise ValidationError(f"agent_id: expected a non-empty string, found {agent_id!r}")
        rank = self.placement(agent_id, self.world_size)
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValidationError(
                f"placement: expected a rank in [0, {self.world_size}) for {agent_id!r}, "
                f"found {rank!r}"
            )
        return rank

    def owns(self, agent_id: str) -> bool:
        return self.owner(agent_id) == self.rank

    def add_agent(self, agent_id: str, notes: Iterable[MemoryNote] = (), **kwargs: Any) -> bool:
        """Adds the agent on its owner (call it on every rank, or only on the owner); returns
        whether this rank stored it."""
        if not self.owns(agent_id):
            return False
        self.local.add_agent(agent_id, notes, **kwargs)
        return True

    def add_agents(
        self,
        agents: Mapping[str, Iterable[MemoryNote]] | Iterable[tuple[str, Iterable[MemoryNote]]],
        **kwargs: Any,
    ) -> dict[str, int]:
        """``MemoryBank.add_agents`` of the agents this rank owns (call it on every rank with
        every agent); returns their note counts (the other ranks' agents are not listed)."""
        from soulmem_torch.bank.bank import agent_pairs

        mine = [
            p
            for p in agent_pairs(agents)
            if not isinstance(p, (tuple, list)) or len(p) != 2 or self.owns(p[0])
        ]
        return self.local.add_agents(mine, **kwargs)

    def add_agent_graph(self, agent_id: str, graph: Any) -> bool:
        """``MemoryBank.add_agent_graph`` on the owner; returns whether this rank stored it."""
        if not self.owns(agent_id):
            return False
        self.local.add_agent_graph(agent_id, graph)
        return True

    def add_notes(self, agent_id: str, notes: Iterable[MemoryNote], **kwargs: Any) -> int | None:
        """``MemoryBank.add_notes`` on the owner (``None`` on the other ranks)."""
        if not self.owns(agent_id):
            return None
        return self.local.add_notes(agent_id, notes, **kwargs)

    def __len__(self) -> int:
        """Agents held by this rank."""
        return len(self.local)

    def agents(self) -> list[str]:
        """Agents held by this rank."""
        return self.local.agents()

    def all_agents(self) -> list[str]:
        """Every agent of every rank (collective)."""
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, self.local.agents(), group=self.group)
        return [a for part in gathered for a in part]

    # -- asking (collective) ------------------------------------------------------------------
    def ask(
        self, agent_ids: Sequence[str] | str, texts: Sequence[str] | str, *, config: Any = None
    ) -> list[Any]:
        """Collective ``MemoryBank.ask``: this rank's questions, answered by their owners."""
        error: BaseException | None = None
        items: list[tuple[str, str, Any, int]] = []
        try:
            agent_ids = [agent_ids] if isinstance(agent_ids, str) else list(agent_ids)
            texts = [texts] if isinstance(texts, str) else list(texts)
            if len(agent_ids) != len(texts):
                raise ValidationError(
                    f"texts: expected {len(agent_ids)} texts (one per agent id), found {len(texts)}"
                )
            items = [("ask", a, t, 0) for a, t in zip(agent_ids, texts)]
        except SoulMemError as exc:
            error, items = exc, []
        return self._exchange(items, config, error)

    def query(
        self,
        requests: Sequence[tuple[str, Any]],
        *,
        config: Any = None,
        priorities: Sequence[int] | None = None,
    ) -> list[Any]:
        """Collective ``MemoryBank.query``: this rank's requests, answered by their owners."""
        error: BaseException | None = None
        items: list[tuple[str, str, Any, int]] = []
        try:
            requests = list(requests)
            prio = list(priorities) if priorities is not None else [0] * len(requests)
            if len(prio) != len(requests):
                raise ValidationError(
                    f"priorities: expected {len(requests)} values, found {len(prio)}"
                )
            for i, item in enumerate(requests):
                if not isinstance(item, (tuple, list)) or len(item) != 2:
                    raise ValidationError(
                        f"requests[{i}]: expected an (agent_id, query) pair, found {item!r}"
                    )
            items = [("query", a, q, p) for (a, q), p in zip(requests, prio)]
        except SoulMemError as exc:
            error, items = exc, []
        return self._exchange(items, config, error)

    def _exchange(
        self, items: list[tuple[str, str, Any, int]], config: Any, error: BaseException | None
    ) -> list[Any]:
        import torch.distributed as dist

        outgoing: list[list[tuple[int, tuple[str, str, Any, int]]]] = [
            [] for _ in range(self.world_size)
        ]
        local_failures: dict[int, _Failure] = {}
        for i, item in enumerate(items):
            try:
                outgoing[self.owner(item[1])].append((i, item))
            except SoulMemError as exc:
                local_failures[i] = _Failure(exc)
        # 1. requests to their owners
        sent: list[Any] = [None] * self.world_size
        dist.all_gather_object(sent, outgoing, group=self.group)
        received = [
            (src, i, item) for src in range(self.world_size) for i, item in sent[src][self.rank]
        ]
        answers = self._answer([item for _, _, item in received], config)
        replies: list[list[tuple[int, Any]]] = [[] for _ in range(self.world_size)]
        for (src, i, _), answer in zip(received, answers):
            replies[src].append((i, answer))
        # 2. answers back to the requesters
        back: list[Any] = [None] * self.world_size
        dist.all_gather_object(back, replies, group=self.group)
        if error is not None:
            raise error
        out: list[Any] = [None] * len(items)
        for i, failure in local_failures.items():
            out[i] = failure
        for owner in range(self.world_size):
            for i, answer in back[owner][self.rank]:
                out[i] = answer
        for answer in out:
            if isinstance(answer, _Failure):
                raise answer.error()
        return out

    def _answer(self, items: list[tuple[str, str, Any, int]], config: Any) -> list[Any]:
        """Answers received requests with one bank call per kind; a failing request fails
        alone (the batch is split until the failures are isolated)."""
        if not items:
            return []
        out: list[Any] = [None] * len(items)
        pending = []
        for j, (_, agent, _, _) in enumerate(items):
            if agent not in self.local:
                out[j] = _Failure(NotFoundError(f"agents: {agent!r} is not in the bank"))
            else:
                pending.append(j)
        self._answer_rows(items, pending, out, config)
        return out

    def _answer_rows(self, items: list[Any], rows: list[int], out: list[Any], config: Any) -> None:
        if not rows:
            return
        try:
            asks = [j for j in rows if items[j][0] == "ask"]
            queries = [j for j in rows if items[j][0] == "query"]
            if asks:
                res = self.local.ask(
                    [items[j][1] for j in asks], [items[j][2] for j in asks], config=config
                )
                for j, r in zip(asks, res):
                    out[j] = r
            if queries:
                res = self.local.query(
                    [(items[j][1], items[j][2]) for j in queries],
                    config=config,
                    priorities=[items[j][3] for j in queries],
                )
                for j, r in zip(queries, res):
                    out[j] = r
        except Exception as exc:
            if len(rows) == 1:
                out[rows[0]] = _Failure(exc)
                return
            half = len(rows) // 2
            self._answer_rows(items, rows[:half], out, config)
            self._answer_rows(items, rows[half:], out, config)


def _demo() -> None:  # pragma: no cover - run under torchrun (see the module docstring)
    """Each rank holds its share of four agents built from the bundled sample memory and asks
    one question of an agent it does not necessarily own."""
    import os

    import torch
    import torch.distributed as dist

    from soulmem_torch.data import sample_memory_path
    from soulmem_torch.model.soul_tune import load_soul_tune_graph

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()
    device = None
    if backend == "nccl":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
        torch.cuda.set_device(device)
    notes = load_soul_tune_graph(sample_memory_path()).notes
    bank = ShardedMemoryBank(device=device)
    for a in range(4):
        bank.add_agent(f"npc-{a}", notes[a * 15 : a * 15 + 40])
    agent = f"npc-{rank % 4}"
    result = bank.ask([agent], ["a rainy afternoon at the café"])[0]
    print(
        f"rank {rank}: holds {bank.agents()}; asked {agent} (owner: rank {bank.owner(agent)}), "
        f"got {len(result.association)} memories",
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":  # pragma: no cover
    _demo()
