"""A bank on disk: every agent in one SQLite database (``BANK_DIR/bank.sqlite3``).

The tables are those of :mod:`soulmem_torch.store.db` with the agent column filled: one
``agents`` row per agent (its position, kind and the embedder its vectors came from), one
``notes`` row per note, one ``graphs`` row per tensor-built agent. A write of one agent is one
transaction touching only that agent's changed rows (plus its ``agents`` row and one
``versions`` row), so the cost of a write does not grow with the bank. Every row is
checksummed; :func:`load_bank` verifies each agent on its own: a damaged agent is named (a
``DamagedAgentWarning``, ``bank.damaged``) and the others are served — one bad agent never
makes the bank unloadable. Writes to a damaged agent are refused (its rows are kept for
repair). A bank directory of the previous format (``bank.json`` + ``agents/``) is read, and
copied into the database by the first write.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import groupby
from pathlib import Path
from typing import Any

import torch

from soulmem_torch._gcpause import gc_paused
from soulmem_torch.bank._agent import Agent
from soulmem_torch.errors import StoreError, ValidationError
from soulmem_torch.store.codec import CodecError, decode_embeddings, decode_graph, encode_graph
from soulmem_torch.store.db import Database, NoteRow, agent_digest, graph_digest
from soulmem_torch.store.rows import (
    check_lock_timeout,
    check_utf8,
    decode_rows,
    note_rows,
    parse_notes,
    version_info,
)

__all__ = [
    "BANK_DB",
    "DamagedAgentError",
    "DamagedAgentWarning",
    "bank_db",
    "load_bank",
    "recorded_embedder_spec",
]

BANK_DB = "bank.sqlite3"
LEGACY_MANIFEST = "bank.json"


class DamagedAgentWarning(UserWarning):
    """An agent of a bank could not be loaded (named with the reason); the rest was."""


class DamagedAgentError(StoreError):
    """A write to an agent whose stored rows are damaged (refused; its rows are kept)."""


def bank_db(path: str | os.PathLike[str], timeout: float | None = None) -> Database:
    return Database(Path(path) / BANK_DB, kind="bank", timeout=check_lock_timeout(timeout))


def recorded_embedder_spec(path: str | os.PathLike[str]) -> str | None:
    """The embedder spec the bank database under ``path`` recorded with its latest version
    (``None``: no database, none recorded, or one that cannot be read — loading reports that)."""
    db = bank_db(path)
    if not db.exists():
        return None
    try:
        with db.read() as conn:
            latest = db.latest(conn)
    except StoreError:
        return None
    identity = None if latest is None else latest[2].get("embedder")
    spec = identity.get("spec") if isinstance(identity, dict) else None
    return spec if isinstance(spec, str) else None


def _identity(embedder: Any, bank: Any = None) -> dict[str, Any]:
    """The embedder's identity (one embedder call; cached on the bank per embedder)."""
    from soulmem_torch.embedding.identity import embedder_identity

    cached = getattr(bank, "_identity_cache", None)
    if cached is not None and cached[0] is embedder:
        return cached[1]
    identity = embedder_identity(embedder).to_json()
    if bank is not None:
        bank._identity_cache = (embedder, identity)
    return identity


def _agent_info(bank: Any, kind: str, identity: dict[str, Any] | None) -> str:
    info = {"embedder": identity, "embedder_name": type(bank.embedder).__name__}
    if kind == "graph":
        info = {"embedder": None, "embedder_name": None}
    return json.dumps(info, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _rows_of(
    mem: Any,
    replace: Mapping[Any, Any] | None = None,
    extra: Sequence[tuple[Any, Any]] = (),
) -> list[NoteRow]:
    """The agent's note rows; ``replace``: notes written in place of the live ones (same ids),
    ``extra``: ``(note, embedding)`` appended — a change persisted before it is applied."""
    entries = list(mem.cluster)
    replace = replace or {}
    notes = [replace.get(e.note.id, e.note) for e in entries] + [n for n, _ in extra]
    embeddings = [e.embedding for e in entries] + [x for _, x in extra]
    return note_rows(notes, embeddings, mem.readable_ids, range(len(notes)))


def check_agent_text(agent_id: str) -> None:
    check_utf8(agent_id, "agent id")


def write_agents(
    bank: Any,
    path: str | os.PathLike[str],
    agent_ids: Sequence[str],
    *,
    changed: dict[str, Iterable[Any]] | None = None,
    replace_all: bool = False,
    pending: dict[str, tuple[Mapping[Any, Any], Sequence[tuple[Any, Any]]]] | None = None,
) -> int:
    """Persists agents in one transaction; returns the new generation.

    ``changed[agent]``: the ids of the only notes of that agent that changed (rows written
    for those alone); otherwise the agent's rows are diffed against the stored ones.
    ``replace_all``: the bank's agents become the database's (agents not in the bank are
    deleted) — :meth:`MemoryBank.save`. ``pending[agent] = (replace, extra)``: notes to write
    in place of live ones and new ``(note, embedding)`` pairs, not applied in memory yet (a
    plasticity update or a consolidation persists first, then applies).
    """
    db = bank_db(path)
    if not getattr(bank, "_served", False):
        _check_not_served(Path(path))
    if (Path(path) / "store.sqlite3").exists():
        raise StoreError(
            f"path: {str(path)!r} holds a memory store, not a bank; save the bank elsewhere"
        )
    identity = _identity(bank.embedder, bank)
    for a in agent_ids:
        check_agent_text(a)
        if a in bank.damaged:
            raise DamagedAgentError(
                f"agent {a!r}: its stored rows are damaged ({bank.damaged[a]}); not overwritten"
            )
    # everything that can fail on bad data is computed before the transaction opens
    plans: list[tuple[str, str, list[NoteRow] | None, bytes | None, set[str] | None]] = []
    for a in agent_ids:
        agent = bank._agents[a]
        if agent.mem is not None:
            ids = None if changed is None or a not in changed else {str(i) for i in changed[a]}
            replace, extra = (pending or {}).get(a, (None, ()))
            rows = _rows_of(agent.mem, replace, extra)
            if ids is not None:
                rows = [r for r in rows if r.id in ids]
            plans.append((a, "notes", rows, None, ids))
        else:
            plans.append((a, "graph", None, encode_graph(agent.graph), None))
    with db.write() as conn:
        _migrate_legacy(bank, Path(path), conn)
        top = conn.execute("SELECT MAX(gen) FROM versions").fetchone()[0]
        gen = 1 + (top or 0)
        if replace_all:
            positions = dict(conn.execute("SELECT agent, pos FROM agents").fetchall())
        else:  # only the written agents' rows: the cost of a write does not grow with the bank
            positions = {}
            for a in agent_ids:
                row = conn.execute("SELECT pos FROM agents WHERE agent = ?", (a,)).fetchone()
                if row is not None:
                    positions[a] = row[0]
        top_pos = conn.execute("SELECT MAX(pos) FROM agents").fetchone()[0]
        nxt = 1 + (-1 if top_pos is None else int(top_pos))
        if replace_all:
            gone = [a for a in positions if a not in bank._agents]
            for a in gone:
                for table in ("notes", "graphs", "agents"):
                    conn.execute(f"DELETE FROM {table} WHERE agent = ?", (a,))
        for a, kind, rows, payload, ids in plans:
            pos = positions.get(a)
            if pos is None:
                pos, nxt = nxt, nxt + 1
            info = _agent_info(bank, kind, identity)
            if ids is not None and a in positions:
                stored = conn.execute("SELECT info FROM agents WHERE agent = ?", (a,)).fetchone()
                if stored is not None and stored[0] != info:
                    # its stored vectors came from another embedder: the whole agent is
                    # written again (never a mix of two embedders' vectors in one agent)
                    rows, ids = _rows_of(bank._agents[a].mem), None
            conn.execute(
                "INSERT OR REPLACE INTO agents VALUES (?, ?, ?, ?, ?, ?)",
                (a, pos, kind, info, gen, agent_digest(a, pos, kind + "\0" + info)),
            )
            if kind == "graph":
                assert payload is not None
                conn.execute(
                    "INSERT OR REPLACE INTO graphs VALUES (?, ?, ?, ?)",
                    (a, payload, gen, graph_digest(a, payload)),
                )
                continue
            assert rows is not None
            if ids is None:  # a diff against the stored rows
                existing = {
                    i: (p, s)
                    for i, p, s in conn.execute(
                        "SELECT id, pos, sha FROM notes WHERE agent = ?", (a,)
                    )
                }
                keep = {r.id for r in rows}
                deletes = [i for i in existing if i not in keep]
                rows = [r for r in rows if existing.get(r.id, (None, None))[1] != r.digest(a)]
                for i in deletes:
                    conn.execute("DELETE FROM notes WHERE agent = ? AND id = ?", (a, i))
            conn.executemany(
                "INSERT OR REPLACE INTO notes VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(a, r.id, r.pos, r.note, r.rid, r.emb, gen, r.digest(a)) for r in rows],
            )
        info = version_info(
            {"agents": len(bank._agents)}, None, type(bank.embedder).__name__, identity,
            {"agents": list(agent_ids)[:20], "written": len(agent_ids)}, agent="*",
        )  # fmt: skip
        db.commit_version(conn, "*", info=info, keep_versions=1, gen=gen)
    return gen


def _check_not_served(root: Path) -> None:
    """Refuses a write from outside a running ``soulmem serve`` of this directory: its bank
    in memory would not see it, and its next writes could undo it."""
    import filelock

    from soulmem_torch.store import StoreLockedError

    lock_path = root / "SERVE.lock"
    if not lock_path.exists():
        return
    lock = filelock.FileLock(lock_path, thread_local=False, is_singleton=False)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        raise StoreLockedError(
            f"{root}: a soulmem serve is serving this bank; write through its HTTP API (POST "
            "/agents/{id}/notes), or stop it first"
        ) from None
    lock.release()


def _migrate_legacy(bank: Any, root: Path, conn: Any) -> None:
    """On the first write to a legacy bank directory, every agent the bank holds is written."""
    if conn.execute("SELECT COUNT(*) FROM agents").fetchone()[0]:
        return
    if not (root / LEGACY_MANIFEST).exists():
        return
    identity = _identity(bank.embedder, bank)
    for pos, a in enumerate(bank._order):
        agent = bank._agents[a]
        kind = "notes" if agent.mem is not None else "graph"
        info = _agent_info(bank, kind, identity)
        conn.execute(
            "INSERT INTO agents VALUES (?, ?, ?, ?, ?, ?)",
            (a, pos, kind, info, 0, agent_digest(a, pos, kind + "\0" + info)),
        )
        if kind == "graph":
            payload = encode_graph(agent.graph)
            conn.execute("INSERT INTO graphs VALUES (?, ?, ?, ?)",
                         (a, payload, 0, graph_digest(a, payload)))  # fmt: skip
        else:
            conn.executemany(
                "INSERT INTO notes VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(a, r.id, r.pos, r.note, r.rid, r.emb, 0, r.digest(a))
                 for r in _rows_of(agent.mem)],
            )  # fmt: skip


def read_agent(bank: Any, path: str | os.PathLike[str], agent_id: str) -> Any:
    """One agent's ``SoulMem`` as stored (``None`` when the database does not hold it)."""
    db = bank_db(path)
    if not db.exists():
        return None
    with db.read() as conn:
        row = conn.execute(
            "SELECT agent, pos, kind, info, gen, sha FROM agents WHERE agent = ?", (agent_id,)
        ).fetchone()
        if row is None:
            return None
        rows = conn.execute(
            "SELECT agent, id, pos, note, rid, emb, sha FROM notes WHERE agent = ? "
            "ORDER BY pos, id", (agent_id,)
        ).fetchall()  # fmt: skip
        graphs = conn.execute("SELECT agent, payload, sha FROM graphs WHERE agent = ?",
                              (agent_id,)).fetchall()  # fmt: skip
    built = _build_agents(bank, str(db.path), [row], rows, graphs, {})
    return built[0][1] if built else None


def load_bank(
    cls: Any,
    path: str | os.PathLike[str],
    *,
    embedder: Any = None,
    device: Any = None,
    on_damaged: str = "warn",
    on_embedder_mismatch: str = "reembed",
    **kwargs: Any,
) -> Any:
    """``MemoryBank.load``: the database, else a legacy ``bank.json`` directory."""
    if on_damaged not in ("warn", "raise"):
        raise ValidationError(f"on_damaged: expected 'warn' or 'raise', found {on_damaged!r}")
    if on_embedder_mismatch not in ("reembed", "refuse"):
        raise ValidationError(
            f"on_embedder_mismatch: expected 'reembed' or 'refuse', found {on_embedder_mismatch!r}"
        )
    with gc_paused():  # ~10 small acyclic objects a note, thousands of agents (see _gcpause)
        return _load_bank(cls, path, embedder, device, on_damaged, on_embedder_mismatch, kwargs)


def _load_bank(
    cls: Any,
    path: str | os.PathLike[str],
    embedder: Any,
    device: Any,
    on_damaged: str,
    on_embedder_mismatch: str,
    kwargs: dict[str, Any],
) -> Any:
    root = Path(path)
    db = bank_db(root)
    bank = cls(embedder=embedder, device=device, **kwargs)
    if db.exists():
        with db.read() as conn:
            agents = conn.execute(
                "SELECT agent, pos, kind, info, gen, sha FROM agents ORDER BY pos"
            ).fetchall()
            rows = conn.execute(
                "SELECT agent, id, pos, note, rid, emb, sha FROM notes ORDER BY agent, pos, id"
            ).fetchall()
            graphs = conn.execute("SELECT agent, payload, sha FROM graphs").fetchall()
        if agents or not (root / LEGACY_MANIFEST).exists():
            for agent_id, built in _build_agents(
                bank, str(db.path), agents, rows, graphs, bank.damaged,
                on_mismatch=on_embedder_mismatch,
            ):  # fmt: skip
                bank._register(agent_id, built)
            _report_damaged(bank, root, on_damaged)
            return bank
    if (root / LEGACY_MANIFEST).exists():
        _load_legacy(bank, root)
        _report_damaged(bank, root, on_damaged)
        return bank
    if (root / "agents").is_dir():
        raise StoreError(
            f"path: {str(root)!r} holds an agents/ directory but neither {BANK_DB} nor "
            f"{LEGACY_MANIFEST}: the bank's manifest is missing; refusing to start an empty "
            "bank over it (restore bank.json from a backup)"
        )
    raise StoreError(f"path: {str(root)!r} holds no bank ({BANK_DB} is missing)")


def _report_damaged(bank: Any, root: Path, on_damaged: str) -> None:
    if not bank.damaged:
        return
    names = ", ".join(f"{a!r} ({why})" for a, why in list(bank.damaged.items())[:5])
    more = f" and {len(bank.damaged) - 5} more" if len(bank.damaged) > 5 else ""
    text = (f"{root}: {len(bank.damaged)} agent(s) could not be loaded and are not served: "
            f"{names}{more}; their stored rows are kept, writes to them are refused")  # fmt: skip
    if on_damaged == "raise":
        raise StoreError(text)
    warnings.warn(DamagedAgentWarning(text), stacklevel=3)


def _build_agents(
    bank: Any,
    where: str,
    agents: Sequence[Sequence[Any]],
    rows: Sequence[Sequence[Any]],
    graphs: Sequence[Sequence[Any]],
    damaged: dict[str, str],
    *,
    on_mismatch: str = "reembed",
) -> list[tuple[str, Any]]:
    from soulmem_torch.api import SoulMem
    from soulmem_torch.embedding import embed_notes
    from soulmem_torch.embedding.identity import (
        EmbedderIdentity,
        EmbedderMismatchError,
        describe_mismatch,
        embedder_identity,
    )
    from soulmem_torch.model import MemoryId

    by_agent = {a: list(g) for a, g in groupby(rows, key=lambda r: r[0])}
    try:  # every blob of the bank in one vectorized decode; a bad one: per agent below
        decoded = decode_embeddings([r[5] for r in rows])
        pre: dict[str, list[Any]] = {}
        for r, e in zip(rows, decoded):
            pre.setdefault(r[0], []).append(e)
    except CodecError:
        pre = {}
    parsed = parse_notes([r[3] for r in rows])  # every note of the bank in one pass, too
    pre_notes: dict[str, list[Any]] = {}
    for r, n in zip(rows, parsed or ()):
        pre_notes.setdefault(r[0], []).append(n)
    payloads = {a: (p, s) for a, p, s in graphs}
    given: EmbedderIdentity | None = None
    verdicts: dict[str, str | None] = {}  # info JSON → mismatch reason (None: same)
    out: list[tuple[str, Any]] = []
    for agent_id, pos, kind, info, _gen, sha in agents:
        try:
            if sha != agent_digest(agent_id, pos, kind + "\0" + info):
                raise StoreError(f"{where}: agent {agent_id!r}: checksum mismatch of its row")
            if kind == "graph":
                payload, psha = payloads.get(agent_id, (None, None))
                if payload is None or psha != graph_digest(agent_id, payload):
                    raise StoreError(f"{where}: agent {agent_id!r}: graph blob missing or "
                                     "checksum mismatch")  # fmt: skip
                from soulmem_torch.graph import MemoryGraph  # PyG: only for tensor agents

                try:
                    ids, tensors = decode_graph(payload)
                    graph = MemoryGraph.from_tensors(
                        tensors.pop("edge_index"), num_nodes=int(tensors["node_type"].shape[0]),
                        ids=[MemoryId(i) for i in ids], **tensors,
                    )  # fmt: skip
                except (CodecError, KeyError, ValueError, TypeError, RuntimeError) as exc:
                    raise StoreError(
                        f"{where}: agent {agent_id!r}: bad graph blob ({exc})"
                    ) from None
                out.append((agent_id, Agent(graph=graph.cpu())))
                continue
            if kind != "notes":
                raise StoreError(f"{where}: agent {agent_id!r}: unknown kind {kind!r}")
            agent_rows = [r[1:] for r in by_agent.get(agent_id, ())]
            notes, embeddings, readable = decode_rows(
                where, agent_id, agent_rows, hint="the other agents are served",
                embeddings=pre.get(agent_id, []) if agent_id in pre or not agent_rows else None,
                notes=pre_notes.get(agent_id, []) if parsed is not None else None,
            )  # fmt: skip
            if info not in verdicts:
                meta = json.loads(info)
                stored = meta.get("embedder")
                if given is None:
                    given = embedder_identity(bank.embedder)
                if stored is None or not EmbedderIdentity.from_json(stored).matches(given):
                    verdicts[info] = describe_mismatch(
                        EmbedderIdentity.from_json(stored) if stored else meta.get("embedder_name"),
                        given,
                    )
                else:
                    verdicts[info] = None
            reason = verdicts[info]
            if reason is not None and any(e is not None for e in embeddings):
                if on_mismatch == "refuse":
                    raise EmbedderMismatchError(
                        f"{where}: agent {agent_id!r}: {reason}; refusing to mix them — serve "
                        "the bank with its own embedder (--embedder), or re-embed "
                        "(--on-embedder-mismatch reembed)"
                    )
                embeddings = embed_notes(notes, bank.embedder) if notes else []
                bank.reembedded = reason
            elif any(e is None for e in embeddings):
                missing = [i for i, e in enumerate(embeddings) if e is None]
                fresh = embed_notes([notes[i] for i in missing], bank.embedder)
                for i, e in zip(missing, fresh):
                    embeddings[i] = e
            mem = SoulMem(embedder=bank.embedder, device=bank.device,
                          window_capacity=bank.window_capacity)  # fmt: skip
            mem.working_memory.add_nodes(notes, embeddings)
            mem.readable_ids.update(readable)
            out.append((agent_id, Agent(mem=mem)))
        except EmbedderMismatchError:
            raise
        except (StoreError, ValueError, TypeError, KeyError) as exc:
            damaged[agent_id] = str(exc)
    return out


def _load_legacy(bank: Any, root: Path) -> None:
    """A bank directory of the previous format (``bank.json`` + one store per agent)."""
    from soulmem_torch.api import SoulMem
    from soulmem_torch.graph import MemoryGraph
    from soulmem_torch.model import MemoryId

    manifest_path = root / LEGACY_MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"path: cannot read {str(manifest_path)!r}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "soulmem-bank":
        raise StoreError(f"path: {str(manifest_path)!r} is not a soulmem-bank manifest")
    if manifest.get("version") != 1:
        raise StoreError(f"path: bank format version {manifest.get('version')!r}; expected 1")
    entries = manifest.get("agents")
    if not isinstance(entries, list):
        raise StoreError(f"path: {str(manifest_path)!r}: 'agents' must be a list")
    seen: set[str] = set()
    for n, entry in enumerate(entries):
        agent_id = entry.get("id") if isinstance(entry, dict) else None
        label = agent_id if isinstance(agent_id, str) and agent_id else f"entry {n}"
        try:
            if not isinstance(agent_id, str) or not agent_id:
                raise StoreError(f"{manifest_path}: entry {n}: bad agent id {agent_id!r}")
            if agent_id in seen:
                raise StoreError(f"{manifest_path}: agent {agent_id!r} is listed twice")
            seen.add(agent_id)
            target = root / str(entry.get("dir"))
            if target.resolve().parent != (root / "agents").resolve():
                raise StoreError(
                    f"{manifest_path}: agent {agent_id!r}: bad dir {entry.get('dir')!r}"
                )
            if entry.get("kind", "notes") == "graph":
                try:
                    payload = torch.load(target / "graph.pt", weights_only=True)
                    ids = [MemoryId(i) for i in payload.pop("ids")]
                    ei = payload.pop("edge_index")
                    graph = MemoryGraph.from_tensors(
                        ei, num_nodes=int(payload["node_type"].shape[0]), ids=ids,
                        **{k: v for k, v in payload.items() if v is not None},
                    )  # fmt: skip
                except Exception as exc:  # torch raises many kinds on a bad file
                    raise StoreError(f"{target / 'graph.pt'}: unreadable ({exc})") from None
                bank._register(agent_id, Agent(graph=graph.cpu()))
            else:
                mem = SoulMem.load(target, embedder=bank.embedder, device=bank.device,
                                   window_capacity=bank.window_capacity)  # fmt: skip
                bank._register(agent_id, Agent(mem=mem))
        except (StoreError, ValueError, TypeError, KeyError, AttributeError) as exc:
            bank.damaged[label] = str(exc)


@contextlib.contextmanager
def durable(bank: Any, path: str | os.PathLike[str], agent_id: str,
            changed: Iterable[Any] | None = None) -> Iterator[None]:  # fmt: skip
    """Runs a change of one agent and persists it in one transaction; if the change or the
    write fails, the agent is put back as it is on disk (a new agent is dropped) and the
    error propagates — memory and disk stay as they were."""
    existed = agent_id in bank._agents
    try:
        yield
        if agent_id in bank._agents:
            write_agents(bank, path, [agent_id],
                         changed=None if changed is None else {agent_id: list(changed)})  # fmt: skip
    except BaseException:
        _roll_back(bank, path, agent_id, existed)
        raise


def _roll_back(bank: Any, path: str | os.PathLike[str], agent_id: str, existed: bool) -> None:
    if not existed:
        bank._unregister(agent_id)
        return
    try:
        stored = read_agent(bank, path, agent_id)
        if stored is None and (Path(path) / LEGACY_MANIFEST).exists():
            probe = type(bank)(embedder=bank.embedder, device=bank.device)
            _load_legacy(probe, Path(path))
            stored = probe._agents.get(agent_id)
    except StoreError as exc:
        bank.damaged[agent_id] = f"could not be re-read after a failed write ({exc})"
        bank._unregister(agent_id)
        return
    if stored is None:
        bank._unregister(agent_id)
    else:
        bank._replace(agent_id, stored)
