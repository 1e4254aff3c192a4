"""forget_cluster: per-note equivalence, bounded concurrency, failures, re-embedding, pruning."""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from soulmem_torch.errors import ValidationError
from soulmem_torch.forget import (
    ClusterAdapter,
    FakeLLM,
    ForgetConfig,
    MaskOnly,
    NoAction,
    Revised,
    edge_decay_intensity,
    forget_cluster,
    get_summary,
    lazy_forget,
)
from soulmem_torch.forget import cluster as cluster_mod
from tests.forget._notes import T0, hours, link, make_abstract, make_proc, make_sem, make_sit

NOW = T0 + hours(24 * 10)
TEXTS = [
    "鲁迅原名周树人浙江绍兴人",
    "今天下午我和张三在北京王府井的星巴克讨论了项目进展",
    "On a quiet night, I spent hours polishing the silver cutlery.",
    "那天深夜我在红魔馆的大厅擦洗 silver cutlery，Patchouli 小姐突然要我泡一壶茶。",
]


def mixed_notes(n: int = 40) -> list[Any]:
    """Every kind, ages from fresh to very old, a few retrievals."""
    ages = [0, 1, 2, 3, 5, 6, 20, 31, 32, 100, 240]
    notes = []
    for i in range(n):
        created = NOW - hours(ages[i % len(ages)])
        text = TEXTS[i % len(TEXTS)] + f" #{i}"
        kind = i % 5
        if kind in (0, 1):
            notes.append(make_sem(text, created, retrieval_count=i % 4, aliases=["x"]))
        elif kind == 2:
            notes.append(make_sit(text, created))
        elif kind == 3:
            notes.append(make_proc(text, created))
        else:
            notes.append(make_abstract(text, created))
    return notes


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_same_result_as_lazy_forget_note_by_note() -> None:
    notes = mixed_notes()
    twins = copy.deepcopy(notes)
    report = run(forget_cluster(notes, FakeLLM(), now=NOW, progress=False, concurrency=4))
    expected = [run(lazy_forget(t, NOW, None, FakeLLM())) for t in twins]
    assert list(report.actions.values()) == expected
    assert list(report.actions) == [n.id for n in notes]
    assert [get_summary(n) for n in notes] == [get_summary(t) for t in twins]
    counts = report.counts
    assert counts == {
        k: sum(type(a).__name__ == k for a in expected) for k in ("NoAction", "MaskOnly", "Revised")
    }
    assert counts["Revised"] > 0 and counts["MaskOnly"] > 0 and counts["NoAction"] > 0
    assert report.total == 40
    assert report.eligible == counts["Revised"] + counts["MaskOnly"]
    assert report.failures == []
    assert report.elapsed_s > 0 and report.notes_per_second > 0
    assert "revised" in report.summary()


def test_bounded_concurrency() -> None:
    state = {"now": 0, "max": 0}

    async def slow(system: str, user: str) -> str:
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(0.01)
        state["now"] -= 1
        return "recalled"

    notes = [make_sem(f"记忆 {i}", T0) for i in range(30)]
    report = run(forget_cluster(notes, slow, now=NOW, progress=False, concurrency=3))
    assert report.revised == 30
    assert state["max"] == 3


def test_failures_are_reported_and_masked() -> None:
    async def flaky(system: str, user: str) -> str:
        if "raise" in user:
            raise ConnectionError("offline")
        if "hang" in user:
            await asyncio.sleep(10)
        return "ok"

    words = ["ok", "raise", "ok", "raise", "ok", "hang", "ok", "ok"]
    notes = [make_sem(f"alpha beta gamma delta {w} epsilon zeta eta theta", T0) for w in words]
    now = T0 + hours(7)  # md ≈ 0.18: a few of the 17 tokens are masked
    report = run(forget_cluster(notes, flaky, now=now, progress=False, timeout=0.05))
    assert all(w in get_summary(n) or w == "ok" for w, n in zip(words, notes))
    failed = {f.note_id: f for f in report.failures}
    assert list(failed) == [notes[1].id, notes[3].id, notes[5].id]  # in note order
    assert all(f.stage == "llm" for f in failed.values())
    assert "ConnectionError" in failed[notes[1].id].error
    assert "timeout" in failed[notes[5].id].error
    assert report.revised == 5 and report.mask_only == 3
    for i in (1, 3, 5):
        assert isinstance(report.actions[notes[i].id], MaskOnly)
        assert "[masked]" in get_summary(notes[i])


def test_unexpected_error_is_isolated() -> None:
    def bad_tokenizer(text: str) -> list[str]:
        if "boom" in text:
            raise RuntimeError("tokenizer broke")
        return list(text)

    notes = [make_sem("fine text", T0), make_sem("boom text", T0)]
    report = run(forget_cluster(notes, FakeLLM(), now=NOW, tokenizer=bad_tokenizer, progress=False))
    assert [f.stage for f in report.failures] == ["forget"]
    assert "tokenizer broke" in report.failures[0].error
    assert get_summary(notes[1]) == "boom text"
    assert notes[1].id not in report.actions
    assert isinstance(report.actions[notes[0].id], Revised)


def test_no_llm_masks_only() -> None:
    notes = [make_sem("今天下午我和张三在北京", T0)]
    report = run(forget_cluster(notes, None, now=NOW, progress=False))
    assert report.mask_only == 1 and report.failures[0].stage == "llm"


def test_progress_bar_and_empty_input(capsys: pytest.CaptureFixture[str]) -> None:
    report = run(forget_cluster([make_sem("记忆", T0)], FakeLLM(), now=NOW, progress=True))
    assert report.revised == 1
    assert "forget" in capsys.readouterr().err
    empty = run(forget_cluster([], FakeLLM(), now=NOW, progress=False))
    assert (empty.total, empty.eligible, empty.counts["NoAction"]) == (0, 0, 0)


def test_config_and_options() -> None:
    notes = [make_sem("记忆", T0)]
    cfg = ForgetConfig(base_half_life_hours=1e9)  # nothing decays
    report = run(forget_cluster(notes, FakeLLM(), now=NOW, config=cfg, progress=False))
    assert report.no_action == 1
    with pytest.raises(ValidationError, match="concurrency"):
        run(forget_cluster(notes, FakeLLM(), now=NOW, concurrency=0))
    with pytest.raises(ValidationError, match="timeout"):
        run(forget_cluster(notes, FakeLLM(), now=NOW, timeout=float("inf")))
    with pytest.raises(ValidationError, match="unknown_option"):
        run(forget_cluster(notes, FakeLLM(), now=NOW, unknown_option=1))
    with pytest.raises(ValidationError, match="source: expected a MemoryCluster or an iterable"):
        run(forget_cluster(42, FakeLLM()))  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="source\\[0\\]: expected a MemoryNote"):
        run(forget_cluster(["text"], FakeLLM()))


def test_align_revised_semantic_notes() -> None:
    async def llm(system: str, user: str) -> str:
        if user.startswith("Content: "):
            return "Aliases: y\nDescription: 新描述\nConceptType: Abstract"
        return "recalled"

    notes = [make_sem("记忆一", T0), make_sit("情景", T0)]
    report = run(forget_cluster(notes, llm, now=NOW, progress=False, align=True))
    assert report.aligned == [notes[0].id]
    assert notes[0].mem_type.description == "新描述"

    async def align_fails(system: str, user: str) -> str:
        if user.startswith("Content: "):
            raise RuntimeError("no")
        return "recalled"

    notes = [make_sem("记忆二", T0)]
    report = run(forget_cluster(notes, align_fails, now=NOW, progress=False, align=True))
    assert [f.stage for f in report.failures] == ["align"]
    assert report.revised == 1


# ---- re-embedding ---------------------------------------------------------------------------
def fake_embed_notes(calls: list[list[Any]]) -> Any:
    from soulmem_torch.embedding.fields import MemoryEmbedding

    def embed_notes(notes: list[Any], embedder: Any) -> list[Any]:
        calls.append(list(notes))
        return [
            MemoryEmbedding(tag=torch.ones(4), fields={"content": embedder(get_summary(n) or "")})
            for n in notes
        ]

    return embed_notes


def toy_embedder(text: str) -> torch.Tensor:
    return torch.tensor([len(text), 1.0, 2.0, 3.0])


def test_reembeds_changed_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[Any]] = []
    monkeypatch.setattr(cluster_mod, "_default_embed_notes", lambda: fake_embed_notes(calls))
    fresh, masked, old = (
        make_sem("新", NOW),
        make_sem("我和张三在北京", NOW - hours(3)),
        make_sem("旧", T0),
    )
    items = [SimpleNamespace(note=n, embedding=None) for n in (fresh, masked, old)]
    report = run(forget_cluster(items, FakeLLM(), now=NOW, embedder=toy_embedder, progress=False))
    assert [n.id for n in calls[0]] == [masked.id, old.id]  # one batch, note order
    assert report.reembedded == [masked.id, old.id]
    assert items[0].embedding is None
    assert items[1].embedding is report.embeddings[masked.id]
    assert items[2].embedding.fields["content"][0] == len(get_summary(old))
    # plain notes: nowhere to store, but the report has them
    report = run(
        forget_cluster(
            [make_sem("旧", T0)], FakeLLM(), now=NOW, embedder=toy_embedder, progress=False
        )
    )
    assert len(report.embeddings) == 1
    # reembed=False
    report = run(
        forget_cluster(
            [make_sem("旧", T0)],
            FakeLLM(),
            now=NOW,
            embedder=toy_embedder,
            progress=False,
            reembed=False,
        )
    )
    assert report.reembedded == []


def test_embedding_failure_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> Any:
        def embed_notes(notes: list[Any], embedder: Any) -> list[Any]:
            raise RuntimeError("embedder down")

        return embed_notes

    monkeypatch.setattr(cluster_mod, "_default_embed_notes", broken)
    report = run(
        forget_cluster([make_sem("旧", T0)], FakeLLM(), now=NOW, embedder=object(), progress=False)
    )
    assert [(f.note_id, f.stage) for f in report.failures] == [(None, "embed")]
    assert "embedder down" in report.failures[0].error


def test_real_embed_notes_when_available() -> None:
    embedding = pytest.importorskip("soulmem_torch.embedding")
    if not hasattr(embedding, "embed_notes"):
        pytest.skip("soulmem_torch.embedding.embed_notes is not there yet")

    def embedder(texts: list[str]) -> torch.Tensor:
        return torch.stack([torch.tensor([float(len(t)), 1.0, 0.5]) for t in texts])

    item = SimpleNamespace(note=make_sem("很久以前的记忆内容", T0), embedding=None)
    report = run(forget_cluster([item], FakeLLM(), now=NOW, embedder=embedder, progress=False))
    assert report.failures == [] and report.reembedded == [item.note.id]
    assert item.embedding is not None


# ---- a MemoryCluster -------------------------------------------------------------------------
def test_with_a_memory_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = pytest.importorskip("soulmem_torch.runtime.cluster")
    calls: list[list[Any]] = []
    monkeypatch.setattr(cluster_mod, "_default_embed_notes", lambda: fake_embed_notes(calls))
    old, fresh, proc = make_sem("很久以前的记忆", T0), make_sem("新的记忆", NOW), make_proc("p", T0)
    weak = link(old, fresh, 0.8)  # decays with `old`: 0.8 · R(240 h) ≈ 0.0008
    strong = link(fresh, old, 0.8)  # decays with `fresh`: stays 0.8
    cluster = runtime.MemoryCluster()
    cluster.add_notes([old, fresh, proc])
    version = cluster.version
    report = run(
        forget_cluster(
            cluster, FakeLLM(), now=NOW, embedder=toy_embedder, progress=False, prune_below=0.1
        )
    )
    assert report.revised == 1 and report.reembedded == [old.id]
    assert cluster.get(old.id).embedding is report.embeddings[old.id]
    assert cluster.version > version
    assert [p.id for p in report.pruned] == [weak.id]
    assert report.pruned[0].decayed_intensity == edge_decay_intensity(0.8, T0, 0, NOW)
    assert [lk.id for lk in cluster.links()] == [strong.id]
    assert [lk.id for lk in old.mem_links] == []


class DuckCluster:
    """The MemoryCluster surface forget_cluster uses, recorded."""

    def __init__(self, notes: list[Any]) -> None:
        self.items = [SimpleNamespace(note=n, embedding=None) for n in notes]
        self.calls: list[tuple] = []

    def __iter__(self) -> Any:
        return iter(self.items)

    def set_embedding(self, id: Any, embedding: Any) -> None:
        self.calls.append(("set_embedding", id))

    def mark_changed(self, id: Any) -> None:
        self.calls.append(("mark_changed", id))

    def links(self) -> list[Any]:
        return [
            SimpleNamespace(id=lk.id, from_=lk.from_, to=lk.to, intensity=lk.intensity)
            for item in self.items
            for lk in item.note.mem_links
        ]

    def remove_link(self, link_id: Any) -> None:
        self.calls.append(("remove_link", link_id))


def test_duck_typed_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_mod, "_default_embed_notes", lambda: fake_embed_notes([]))
    old, fresh = make_sem("很久以前", T0), make_sem("新", NOW)
    lk = link(old, fresh, 0.5)
    duck = DuckCluster([old, fresh])
    run(
        forget_cluster(
            duck, FakeLLM(), now=NOW, embedder=toy_embedder, progress=False, prune_below=0.01
        )
    )
    assert ("mark_changed", old.id) in duck.calls
    assert ("set_embedding", old.id) in duck.calls
    assert ("remove_link", lk.id) in duck.calls
    assert all(c[1] != fresh.id for c in duck.calls)


def test_pruning_plain_notes_and_default_off() -> None:
    old, mid, fresh = make_sem("旧", T0), make_sem("中", NOW - hours(24)), make_sem("新", NOW)
    l_old, l_mid, l_fresh = link(old, mid, 1.0), link(mid, fresh, 1.0), link(fresh, old, 0.3)
    report = run(forget_cluster([old, mid, fresh], FakeLLM(), now=NOW, progress=False))
    assert report.pruned == [] and len(old.mem_links) == 1
    report = run(
        forget_cluster([old, mid, fresh], FakeLLM(), now=NOW, progress=False, prune_below=0.4)
    )
    # old: 1.0 · 2^-10 → pruned; mid: 1.0 · 0.5 = 0.5 → kept; fresh: 0.3 · 1 → pruned
    assert [p.id for p in report.pruned] == [l_old.id, l_fresh.id]
    assert (
        old.mem_links == []
        and fresh.mem_links == []
        and [x.id for x in mid.mem_links] == [l_mid.id]
    )
    assert report.pruned[1].decayed_intensity == 0.3


def test_adapter_without_storage() -> None:
    adapter = ClusterAdapter([make_sem("x", T0)])
    assert adapter.set_embedding(0, object()) is False
    adapter.mark_changed(0)  # no-op for plain notes
    assert isinstance(run(lazy_forget(adapter.notes[0], NOW, None, FakeLLM())), Revised)
    assert isinstance(NoAction(), NoAction)
