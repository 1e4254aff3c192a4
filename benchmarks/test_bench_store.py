"""The SQLite store and bank: the cost of one write, of a load, and of a note on disk.

Run: ``pytest benchmarks/test_bench_store.py --benchmark-enable --benchmark-only -s``.

Side by side in one run, the offline ``HashingEmbedder`` (1,024 wide), 1 torch thread:

* ``add1``: ``MemoryStore.add_notes`` of one embedded note to a store of N notes (one
  transaction writing that row and a version row) — N = 100,000 and N = 10,000;
* ``soulmem add1+save``: the same through a loaded ``SoulMem`` (``add_notes`` then ``save``
  back: an incremental save), N = 100,000;
* ``rewrite1``: the same change through the previous engine (``DirectoryStore.save``: every
  note, vector and file of the memory written again as a new version), N = 10,000 (the old
  path at 100,000 takes minutes; its cost is linear in N, the issue measured 11.3 s at 20,000);
* ``load``: ``SoulMem.load`` of the 100,000-note store (rows verified, notes parsed, vectors
  decoded, the cluster built); bytes per note on disk;
* ``bank_load``: ``MemoryBank.load`` of a 10,000-agent bank from its one file, 3 notes an
  agent (the issue's bank: ~1–2 notes an agent) and 10 (``SOULMEM_BENCH_BANK_NOTES``, a comma
  list, default ``3,10``).

Before / after a change, load the same files with both checkouts in alternating processes
(what ``benchmarks/RESULTS.md`` reports): the benchmark here times the checkout it runs in.

Notes: Semantic notes with an alias, a description, two tags and one link to the previous note.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from soulmem_torch import SoulMem
from soulmem_torch.bank import MemoryBank
from soulmem_torch.embedding import HashingEmbedder, embed_notes
from soulmem_torch.model import MemoryId, MemoryLink, MemoryNote, SemMemLink, SemMemory
from soulmem_torch.store import DirectoryStore, MemoryStore
from soulmem_torch.store.db import file_size

N_BIG = int(os.environ.get("SOULMEM_BENCH_STORE_N", "100000"))
N_SMALL = 10_000
AGENTS = int(os.environ.get("SOULMEM_BENCH_AGENTS", "10000"))
BANK_NOTES = [int(x) for x in os.environ.get("SOULMEM_BENCH_BANK_NOTES", "3,10").split(",")]


def _notes(n: int, start: int = 0) -> list[MemoryNote]:
    out = []
    prev = None
    for i in range(start, start + n):
        mid = MemoryId(f"00000000-0000-4000-8000-{i:012d}")
        links = [] if prev is None else [MemoryLink.new(mid, prev, SemMemLink(verb="near",
                                                                           confidence=0.5))]  # fmt: skip
        out.append(MemoryNote.build(
            SemMemory(content=f"concept {i} 概念{i % 977}", aliases=[f"alias {i % 131}"],
                      concept_type="Entity", description=f"the {i}th thing, filed under {i % 53}"),
            id=mid, tags=[f"t{i % 7}", "bench"], mem_links=links,
        ))  # fmt: skip
        prev = mid
    return out


def _store(root: Path, n: int, embedder: HashingEmbedder) -> tuple[list, list]:
    notes = _notes(n)
    embeddings = embed_notes(notes, embedder)
    return notes, embeddings


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict:
    torch.set_num_threads(1)
    emb = HashingEmbedder()
    out: dict = {"embedder": emb}
    for n in (N_SMALL, N_BIG):
        root = tmp_path_factory.mktemp(f"sqlite{n}")
        notes, embeddings = _store(root, n, emb)
        mem = SoulMem(embedder=emb)
        mem.working_memory.add_nodes(notes, embeddings)
        mem.save(root)
        out[n] = root
        if n == N_SMALL:
            legacy = tmp_path_factory.mktemp("legacy")
            DirectoryStore(legacy, keep_versions=1).save(notes, embeddings)
            out["legacy"] = (legacy, notes, embeddings)
    return out


def _row(name: str, seconds: float, **extra: object) -> None:
    print(
        f"\nstore bench {name}: {seconds * 1e3:.1f} ms "
        + " ".join(f"{k}={v}" for k, v in extra.items())
    )


@pytest.mark.parametrize("n", [N_SMALL, N_BIG])
def test_add_one_note(benchmark, stores: dict, n: int) -> None:
    store = MemoryStore(stores[n])
    counter = iter(range(10**9))

    def one() -> None:
        (note,) = _notes(1, start=10**7 + next(counter))
        store.add_notes([note], embed_notes([note], stores["embedder"]))

    benchmark.pedantic(one, rounds=10, iterations=1, warmup_rounds=1)
    _row(f"add1 N={n}", benchmark.stats.stats.median)


def test_soulmem_add_one_note_and_save(benchmark, stores: dict) -> None:
    """The user's path: a loaded 100,000-note ``SoulMem``, one note added, ``save`` back
    (written incrementally: that note's row and a version row)."""
    root = stores[N_BIG]
    mem = SoulMem.load(root, embedder=stores["embedder"])
    counter = iter(range(10**9))

    def one() -> None:
        (note,) = _notes(1, start=3 * 10**7 + next(counter))
        mem.add_notes([note])
        mem.save(root)

    benchmark.pedantic(one, rounds=10, iterations=1, warmup_rounds=1)
    _row(f"soulmem add1+save N={len(mem)}", benchmark.stats.stats.median)


def test_rewrite_one_note_old_engine(benchmark, stores: dict) -> None:
    legacy, notes, embeddings = stores["legacy"]
    store = DirectoryStore(legacy, keep_versions=1)
    counter = iter(range(10**9))

    def one() -> None:
        (note,) = _notes(1, start=2 * 10**7 + next(counter))
        notes.append(note)
        embeddings.extend(embed_notes([note], stores["embedder"]))
        store.save(notes, embeddings)

    benchmark.pedantic(one, rounds=3, iterations=1)
    _row(f"rewrite1 (old engine) N={N_SMALL}", benchmark.stats.stats.median)


def test_load_and_bytes_per_note(benchmark, stores: dict) -> None:
    root = stores[N_BIG]
    mem = benchmark.pedantic(lambda: SoulMem.load(root, embedder=stores["embedder"]),
                             rounds=2, iterations=1)  # fmt: skip
    size = file_size(root / "store.sqlite3")
    _row(f"load N={len(mem)}", benchmark.stats.stats.median,
         bytes_per_note=round(size / len(mem)))  # fmt: skip
    assert mem.reembedded is None


@pytest.mark.parametrize("per_agent", BANK_NOTES)
def test_bank_of_10000_agents_loads(benchmark, tmp_path: Path, per_agent: int) -> None:
    emb = HashingEmbedder()
    bank = MemoryBank(embedder=emb)
    notes = _notes(per_agent * AGENTS)
    embeddings = embed_notes(notes, emb)
    t0 = time.perf_counter()
    for a in range(AGENTS):
        part = slice(per_agent * a, per_agent * (a + 1))
        bank.add_agent(f"npc-{a}", notes[part], embeddings=embeddings[part])
    bank.save(tmp_path)
    build = time.perf_counter() - t0
    del bank, notes, embeddings
    back = benchmark.pedantic(lambda: MemoryBank.load(tmp_path, embedder=emb), rounds=2,
                              iterations=1)  # fmt: skip
    assert len(back) == AGENTS and not back.damaged
    t0 = time.perf_counter()
    for a in range(20):
        back.write_notes(tmp_path, f"npc-{a}", _notes(1, start=10**8 + a))
    write = (time.perf_counter() - t0) / 20
    _row(f"bank_load agents={AGENTS} notes/agent={per_agent}", benchmark.stats.stats.median,
         build_and_save_s=round(build, 1), one_write_ms=round(write * 1e3, 1),
         bytes=file_size(tmp_path / "bank.sqlite3"))  # fmt: skip
