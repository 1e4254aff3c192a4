"""ShardedMemoryBank on gloo: 2 and 3 CPU processes (torch.multiprocessing spawn, free port)
answer exactly as one single-process MemoryBank."""

from __future__ import annotations

import os
import socket
import traceback

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from soulmem_torch.bank.sharded import stable_placement

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo"
)

AGENTS = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    try:
        _check(rank, world, port)
        open(os.path.join(out_dir, f"ok-{rank}"), "w").close()
    except BaseException:
        with open(os.path.join(out_dir, f"fail-{rank}"), "w") as fh:
            fh.write(traceback.format_exc())


def _check(rank: int, world: int, port: int) -> None:
    import torch

    from soulmem_torch import MemoryBank, ShardedMemoryBank
    from soulmem_torch.errors import NotFoundError, ValidationError
    from tests.bank.helpers import TEXTS, assert_same_result, config, sample_notes

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        cfg = config("power")
        subsets = [list(range(a * 10, a * 10 + 30)) for a in range(AGENTS)]
        # the sample memory gets fresh ids at every load: every rank uses rank 0's notes
        box = [[sample_notes(subset) for subset in subsets] if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        sharded = ShardedMemoryBank()
        single = MemoryBank()  # the reference: every agent in one process
        half = AGENTS // 2  # (the first half one by one, the rest in one add_agents)
        for a, notes in enumerate(box[0][:half]):
            assert sharded.add_agent(f"npc-{a}", notes) == (
                stable_placement(f"npc-{a}", world) == rank
            )
        stored = sharded.add_agents({f"npc-{a}": box[0][a] for a in range(half, AGENTS)})
        assert all(stable_placement(a, world) == rank for a in stored)
        for a, notes in enumerate(box[0]):
            single.add_agent(f"npc-{a}", [n.model_copy(deep=True) for n in notes])
        held = sharded.agents()
        assert all(stable_placement(a, world) == rank for a in held)
        everyone = sharded.all_agents()
        assert sorted(everyone) == sorted(f"npc-{a}" for a in range(AGENTS))
        # rank 1 asks nothing; the others ask about every agent, wherever it lives
        if rank == 1:
            agents, texts = [], []
        else:
            agents = [f"npc-{(a + rank) % AGENTS}" for a in range(AGENTS + 2)]
            texts = [TEXTS[(a + rank) % len(TEXTS)] for a in range(AGENTS + 2)]
        got = sharded.ask(agents, texts, config=cfg)
        want = single.ask(agents, texts, config=cfg) if agents else []
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same_result(g, w)
        q = {"variant": {"Situation": [{"narrative": "rain at the café"}]}, "tag": []}
        reqs = [(f"npc-{rank % AGENTS}", q)]
        got = sharded.query(reqs, config=cfg, priorities=[rank])
        assert_same_result(got[0], single.query(reqs, config=cfg, priorities=[rank])[0])
        # a failing request fails alone, and only on the rank that asked it
        if rank == 0:
            with pytest.raises(NotFoundError, match="'nobody' is not in the bank"):
                sharded.ask(["nobody"], ["hi"], config=cfg)
        else:
            assert sharded.ask(["npc-0"], ["hi"], config=cfg)[0] is not None
        # a malformed call on one rank raises there, after the collectives (no hang)
        if rank == world - 1:
            with pytest.raises(ValidationError, match="texts: expected 2"):
                sharded.ask(["npc-0", "npc-1"], ["hi"], config=cfg)
        else:
            sharded.ask([], [], config=cfg)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_bank_equals_single_process_bank(tmp_path, world) -> None:
    mp.spawn(_worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True)
    failures = sorted(tmp_path.glob("fail-*"))
    assert not failures, "\n".join(f.read_text() for f in failures)
    assert len(list(tmp_path.glob("ok-*"))) == world


def test_stable_placement() -> None:
    assert stable_placement("npc-17", 4) == stable_placement("npc-17", 4)
    ranks = {stable_placement(f"npc-{i}", 3) for i in range(50)}
    assert ranks == {0, 1, 2}
    # fixed across processes and runs (not Python's salted hash)
    assert [stable_placement(f"npc-{i}", 7) for i in range(5)] == [
        stable_placement(f"npc-{i}", 7) for i in range(5)
    ]


def test_needs_an_initialized_group() -> None:
    from soulmem_torch import ShardedMemoryBank
    from soulmem_torch.errors import SoulMemError

    if dist.is_initialized():  # pragma: no cover
        pytest.skip("a process group is already initialized")
    with pytest.raises(SoulMemError, match="init_process_group"):
        ShardedMemoryBank()
