"""The legacy directory store (format 1, ``DirectoryStore``): round trips, atomic writes, and
clear errors on damaged stores. It is still read, and migrated into SQLite by the first write
(``tests/store/test_sqlite_store.py`` holds the same guarantees for the SQLite store)."""

from __future__ import annotations

import io
import json
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import soulmem_torch.store._legacy as store_mod
from soulmem_torch.embedding.fields import FIELD_NAMES, EmbeddedMemoryNote, MemoryEmbedding
from soulmem_torch.errors import StoreError, ValidationError
from soulmem_torch.model import (
    AbstractSituation,
    AbstractToSpecific,
    Action,
    ActionType,
    Context,
    Emotion,
    Environment,
    Event,
    Location,
    MemoryId,
    MemoryLink,
    MemoryNote,
    Participant,
    ProcMemory,
    SemMemLink,
    SemMemory,
    SensoryData,
    SpecificSituation,
    SpecificToAbstract,
    TrigToAction,
)
from soulmem_torch.model.serde_io import load_notes_json
from soulmem_torch.store import (
    EMBEDDINGS_FILE,
    MANIFEST_FILE,
    NOTES_FILE,
    PENDING_FILE,
    READABLE_IDS_FILE,
    pack_embeddings,
    unpack_embeddings,
)
from soulmem_torch.store import DirectoryStore as MemoryStore
from tests.conftest import fixture_path

T0 = datetime(2026, 3, 1, 9, 30, tzinfo=timezone.utc)
D = 8


# ---- builders ------------------------------------------------------------------------------
def _world() -> tuple[list[MemoryNote], dict[MemoryId, str], MemoryId]:
    """Five notes of every kind, links of every type, and one link to a note not in the store."""
    ids = {name: MemoryId.new() for name in ("sem", "sit", "abs", "proc", "sem2")}
    absent = MemoryId.new()
    sem = MemoryNote.build(
        SemMemory(content="拿铁 latte", aliases=["latte", "拿铁咖啡"], concept_type="Entity",
                  description="espresso with steamed milk / 浓缩咖啡加蒸奶"),
        id=ids["sem"], tags=["饮品", "coffee"], create_time=T0,
        mem_links=[
            MemoryLink.new(ids["sem"], ids["sem2"], SemMemLink(verb="是一种", confidence=0.9),
                           intensity=0.8),
            MemoryLink.new(ids["sem"], absent, SemMemLink(verb="pairs with", confidence=0.3)),
        ],
    )  # fmt: skip
    sit = MemoryNote.build(
        SpecificSituation(
            narrative="Rainy Monday morning: Lin spilled a latte on the counter.",
            time_span=T0,
            context=Context.new(
                location=Location(name="云朵咖啡馆", coordinates="Xuhui, Shanghai"),
                participants=[Participant(name="Lin", role="regular")],
                emotions=[Emotion(name="surprise", intensity=0.6)],
                sensory_data=[SensoryData(name="smell of coffee", intensity=0.8)],
                environment=Environment(atmosphere="busy", tone="light"),
                event=[Event(action="spill", action_intensity=0.7, initiator="Lin",
                             target="latte")],
            ),
        ),
        id=ids["sit"], tags=["event"], create_time=T0,
        mem_links=[
            MemoryLink.new(ids["sit"], ids["abs"], SpecificToAbstract()),
            MemoryLink.new(ids["sit"], ids["proc"], TrigToAction(prob=0.7)),
        ],
    )  # fmt: skip
    abstract = MemoryNote.build(
        AbstractSituation(Participant(name="Lin", role="regular")),
        id=ids["abs"], tags=["人物"], create_time=T0,
        mem_links=[MemoryLink.new(ids["abs"], ids["sit"], AbstractToSpecific(), intensity=0.85)],
    )  # fmt: skip
    proc = MemoryNote.build(
        ProcMemory(action=Action(content="Hand over a towel", action_type=ActionType.SKILL)),
        id=ids["proc"], tags=["habit"], create_time=T0,
    )  # fmt: skip
    sem2 = MemoryNote.build(
        SemMemory(content="coffee", aliases=[], concept_type="Abstract", description=""),
        id=ids["sem2"], tags=[], create_time=T0, retrieval_count=3,
    )  # fmt: skip
    notes = [sem, sit, abstract, proc, sem2]
    readable = {ids["sem"]: "sem_latte", ids["sit"]: "sit_spill", ids["abs"]: "sit_abstract_lin",
                ids["proc"]: "proc_towel", ids["sem2"]: "sem_coffee"}  # fmt: skip
    return notes, readable, absent


def _embeddings(notes: list[MemoryNote], *, seed: int = 0) -> list[MemoryEmbedding | None]:
    gen = torch.Generator().manual_seed(seed)
    fields_by_kind = {
        "Semantic": ["content", "aliases", "description"],
        "SpecificSituation": ["narrative", "location_name", "location_coordinates",
                              "participant_name", "participant_role", "participant_fused",
                              "environment_atmosphere", "environment_tone", "event_action",
                              "event_initiator", "event_target"],
        "AbstractSituation": ["participant_name", "participant_role", "participant_fused",
                              "fused_self"],
        "Procedure": [],
    }  # fmt: skip
    out: list[MemoryEmbedding | None] = []
    for i, note in enumerate(notes):
        if i == len(notes) - 1:  # the last note has no embedding
            out.append(None)
            continue
        names = fields_by_kind[note.kind]
        out.append(
            MemoryEmbedding(
                tag=torch.randn(D, generator=gen),
                fields={name: torch.randn(D, generator=gen) for name in reversed(names)},
            )
        )
    return out


def _assert_same_embeddings(
    a: list[MemoryEmbedding | None], b: list[MemoryEmbedding | None]
) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is None or y is None:
            continue
        assert torch.equal(x.tag.cpu(), y.tag)
        assert sorted(x.fields) == sorted(y.fields)
        for name in x.fields:
            assert torch.equal(x.fields[name].cpu(), y.fields[name]), name


def _version_dir(store: MemoryStore) -> Path:
    return store.path / "versions" / store.current_version()


def _rewrite(store: MemoryStore, name: str, data: bytes, *, fix_manifest: bool) -> None:
    """Replaces a file of the live version; optionally updates the manifest checksum too."""
    vdir = _version_dir(store)
    (vdir / name).write_bytes(data)
    if fix_manifest:
        manifest = json.loads((vdir / MANIFEST_FILE).read_text(encoding="utf-8"))
        manifest["files"][name] = {"sha256": store_mod._sha256(data), "bytes": len(data)}
        manifest["manifest_sha256"] = store_mod.manifest_checksum(manifest)
        (vdir / MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")


# ---- round trips ---------------------------------------------------------------------------
def test_round_trip_everything(tmp_path: Path) -> None:
    notes, readable, absent = _world()
    embeddings = _embeddings(notes)
    store = MemoryStore(tmp_path / "mem")
    assert not store.exists()
    manifest = store.save(notes, embeddings, readable_ids=readable, embedder_name="hash-8")
    assert store.exists()

    back = store.load()
    assert [n.to_json() for n in back.notes] == [n.to_json() for n in notes]
    assert back.notes == notes
    _assert_same_embeddings(embeddings, back.embeddings)
    assert back.readable_ids == readable
    assert back.id_map == {rid: mid for mid, rid in readable.items()}
    assert back.embedder_name == "hash-8"
    assert back.embedding_dim == D
    assert back.manifest == manifest
    # the pending link survives, on its source note and in the listing
    assert [link.to for link in back.pending_links] == [absent]
    assert back.pending_links[0] in back.notes[0].mem_links

    counts = manifest["counts"]
    assert counts == {"notes": 5, "links": 5, "pending_links": 1, "embeddings": 4,
                      "readable_ids": 5}  # fmt: skip
    assert manifest["format_version"] == store_mod.FORMAT_VERSION
    assert manifest["embedding_dim"] == D and manifest["embedder_name"] == "hash-8"
    assert manifest["embedding"]["fields"] == list(FIELD_NAMES)  # the union, in layout order
    vdir = _version_dir(store)
    for name, entry in manifest["files"].items():
        data = (vdir / name).read_bytes()
        assert entry == {"sha256": store_mod._sha256(data), "bytes": len(data)}
    assert set(manifest["files"]) == {NOTES_FILE, PENDING_FILE, READABLE_IDS_FILE,
                                      EMBEDDINGS_FILE}  # fmt: skip


def test_stored_tensors_are_stacked_plain_tensors(tmp_path: Path) -> None:
    notes, _, _ = _world()
    embeddings = _embeddings(notes)
    store = MemoryStore(tmp_path)
    store.save(notes, embeddings)
    tensors = torch.load(_version_dir(store) / EMBEDDINGS_FILE, weights_only=True)
    assert sorted(tensors) == ["field_mask", "field_values", "has_embedding", "tag"]
    assert tensors["has_embedding"].tolist() == [True, True, True, True, False]
    assert tensors["tag"].shape == (4, D)
    num_fields = sum(len(e.fields) for e in embeddings if e is not None)
    assert tensors["field_values"].shape == (num_fields, D)
    assert int(tensors["field_mask"].sum()) == num_fields


def test_notes_file_is_byte_exact_rust_serde(tmp_path: Path) -> None:
    path = fixture_path("rust", "notes_written_by_rust.jsonl")
    notes = load_notes_json(path)
    store = MemoryStore(tmp_path)
    store.save(notes)
    written = (_version_dir(store) / NOTES_FILE).read_bytes()
    original = path.read_bytes()
    assert written == original if original.endswith(b"\n") else written == original + b"\n"
    assert [n.to_json() for n in store.load().notes] == original.decode().splitlines()


def test_without_embeddings(tmp_path: Path) -> None:
    notes, _, _ = _world()
    store = MemoryStore(tmp_path)
    manifest = store.save(notes)
    assert manifest["embedding"] is None and manifest["embedding_dim"] is None
    assert not (_version_dir(store) / EMBEDDINGS_FILE).exists()
    assert not (_version_dir(store) / READABLE_IDS_FILE).exists()
    back = store.load()
    assert back.embeddings == [None] * len(notes)
    assert back.readable_ids == {}
    assert back.embedding_dim is None and back.embedder_name is None
    # all-None embeddings are the same as no embeddings
    store.save(notes, [None] * len(notes))
    assert store.load().embeddings == [None] * len(notes)


def test_empty_store(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    store.save([])
    back = store.load()
    assert back.notes == [] and back.embeddings == [] and back.pending_links == []


def test_embeddings_as_mapping_and_inverse_readable_ids(tmp_path: Path) -> None:
    notes, readable, _ = _world()
    embeddings = _embeddings(notes)
    by_id = {n.id: e for n, e in zip(notes, embeddings) if e is not None}
    store = MemoryStore(tmp_path)
    store.save(notes, by_id, readable_ids={rid: mid for mid, rid in readable.items()})
    back = store.load()
    _assert_same_embeddings(embeddings, back.embeddings)
    assert back.readable_ids == readable


def test_dtype_is_kept(tmp_path: Path) -> None:
    notes, _, _ = _world()
    embeddings = [MemoryEmbedding(tag=torch.rand(3, dtype=torch.float64)) for _ in notes]
    store = MemoryStore(tmp_path)
    store.save(notes, embeddings)
    back = store.load().embeddings
    assert all(e is not None and e.tag.dtype == torch.float64 and e.fields == {} for e in back)
    _assert_same_embeddings(embeddings, back)


def test_embeddings_on_any_device_load_on_cpu(tmp_path: Path, device: torch.device) -> None:
    notes, _, _ = _world()
    embeddings = [
        None if e is None else MemoryEmbedding(
            tag=e.tag.to(device), fields={k: v.to(device) for k, v in e.fields.items()})
        for e in _embeddings(notes)
    ]  # fmt: skip
    store = MemoryStore(tmp_path)
    store.save(notes, embeddings)
    back = store.load().embeddings
    assert all(e is None or e.tag.device.type == "cpu" for e in back)
    _assert_same_embeddings(embeddings, back)


@settings(max_examples=30, deadline=None)
@given(
    presence=st.lists(st.one_of(st.none(), st.sets(st.sampled_from(FIELD_NAMES))), max_size=8),
    dim=st.integers(1, 5),
)
def test_pack_unpack_property(presence: list[set[str] | None], dim: int) -> None:
    embeddings = [
        None if names is None else MemoryEmbedding(
            tag=torch.randn(dim), fields={n: torch.randn(dim) for n in names})
        for names in presence
    ]  # fmt: skip
    packed = pack_embeddings(embeddings)
    if all(e is None for e in embeddings):
        assert packed is None
        return
    assert packed is not None
    tensors, layout = packed
    assert layout["fields"] == [f for f in FIELD_NAMES if any(f in (p or ()) for p in presence)]
    back = unpack_embeddings(tensors, layout, num_notes=len(embeddings))
    _assert_same_embeddings(embeddings, back)


def test_bad_arguments_write_nothing(tmp_path: Path) -> None:
    notes, _, _ = _world()
    store = MemoryStore(tmp_path)
    with pytest.raises(ValidationError, match="duplicate note id"):
        store.save([notes[0], notes[0]])
    with pytest.raises(ValidationError, match="expected 5 entries"):
        store.save(notes, [None])
    bad_dim = [MemoryEmbedding(tag=torch.zeros(3)), MemoryEmbedding(tag=torch.zeros(4))]
    with pytest.raises(ValidationError, match=r"embeddings\[1\]\.tag: expected width 3"):
        store.save(notes[:2], bad_dim)
    with pytest.raises(ValidationError, match="shape"):
        store.save(notes[:1], [MemoryEmbedding(tag=torch.zeros(2, 2))])
    with pytest.raises(ValidationError, match=r"embeddings\[0\]\.tag: expected finite"):
        store.save(notes[:1], [MemoryEmbedding(tag=torch.tensor([0.0, float("nan")]))])
    with pytest.raises(ValidationError, match=r"fields\['custom'\].*unknown field"):
        store.save(
            notes[:1], [MemoryEmbedding(tag=torch.zeros(2), fields={"custom": torch.zeros(2)})]
        )
    with pytest.raises(ValidationError, match="expected a torch.Tensor"):
        store.save(notes[:1], [MemoryEmbedding(tag=[0.0, 1.0])])  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="not the id of a saved note"):
        store.save(notes[:1], readable_ids={notes[1].id: "sit_x"})
    with pytest.raises(ValidationError, match="names two notes"):
        store.save(notes[:2], readable_ids={notes[0].id: "same", notes[1].id: "same"})
    assert not store.exists()


def test_versions_are_pruned(tmp_path: Path) -> None:
    notes, _, _ = _world()
    store = MemoryStore(tmp_path, keep_versions=2)
    for i in range(4):
        manifest = store.save(notes[: i + 1])
        assert manifest["generation"] == i + 1
    names = sorted(p.name for p in (tmp_path / "versions").iterdir())
    assert len(names) == 2 and names[-1] == store.current_version()
    assert names[-1].startswith("g000004-") and names[0].startswith("g000003-")
    assert len(store.load().notes) == 4


# ---- interrupted writes --------------------------------------------------------------------
def _no_leftovers(store: MemoryStore) -> None:
    assert not list((store.path / "versions").glob(".tmp-*"))
    assert not list(store.path.glob("CURRENT.tmp-*"))


def test_failure_at_the_pointer_swap_keeps_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notes, readable, _ = _world()
    embeddings = _embeddings(notes)
    store = MemoryStore(tmp_path)
    store.save(notes, embeddings, readable_ids=readable)
    before = store.current_version()

    real_replace = os.replace

    def crash_on_current(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(dst).name == "CURRENT":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_current)
    with pytest.raises(StoreError, match="previous version is unchanged"):
        store.save(notes[:2], embeddings[:2])
    monkeypatch.undo()

    assert store.current_version() == before
    back = store.load()
    assert back.notes == notes and back.readable_ids == readable
    _assert_same_embeddings(embeddings, back.embeddings)
    _no_leftovers(store)
    assert len(list((tmp_path / "versions").iterdir())) == 1  # the half version is gone
    store.save(notes[:2])  # and the store still works
    assert len(store.load().notes) == 2


def test_failure_inside_the_embedding_writer_keeps_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notes, readable, _ = _world()
    store = MemoryStore(tmp_path)
    store.save(notes, _embeddings(notes), readable_ids=readable)
    before = store.load()

    real_write = store_mod._write_file
    written: list[str] = []

    def crash_on_embeddings(path: Path, data: bytes) -> None:
        if path.name == EMBEDDINGS_FILE:
            real_write(path, data[: len(data) // 2])  # half a file on disk, then the crash
            raise RuntimeError("killed while writing embeddings")
        written.append(path.name)
        real_write(path, data)

    monkeypatch.setattr(store_mod, "_write_file", crash_on_embeddings)
    with pytest.raises(RuntimeError, match="killed while writing"):
        store.save(notes[:3], _embeddings(notes[:3], seed=1))
    monkeypatch.undo()

    assert NOTES_FILE in written  # some files of the new version were written
    after = store.load()
    assert after.notes == before.notes and after.readable_ids == before.readable_ids
    _assert_same_embeddings(before.embeddings, after.embeddings)
    _no_leftovers(store)


def test_hard_crash_leftovers_are_ignored_then_cleaned(tmp_path: Path) -> None:
    notes, _, _ = _world()
    store = MemoryStore(tmp_path)
    store.save(notes)
    live = store.current_version()
    # A writer killed mid-way: a half temporary dir, a complete but never-committed version,
    # and a temporary pointer that was never renamed.
    (tmp_path / "versions" / ".tmp-g000002-deadbeef").mkdir()
    (tmp_path / "versions" / ".tmp-g000002-deadbeef" / NOTES_FILE).write_text("{trunc")
    orphan = tmp_path / "versions" / "g000002-0badf00d"
    orphan.mkdir()
    (orphan / NOTES_FILE).write_text("")
    (tmp_path / "CURRENT.tmp-0badf00d").write_text("g000002-0badf00d\n")

    assert store.current_version() == live
    assert store.load().notes == notes
    manifest = store.save(notes[:1])
    assert manifest["generation"] == 3  # past every directory on disk
    _no_leftovers(store)
    assert len(store.load().notes) == 1
    # the never-committed version is gone; the previous live one is kept
    names = {p.name for p in (tmp_path / "versions").iterdir()}
    assert names == {live, store.current_version()}


def test_lost_pointer_is_refused_until_restored(tmp_path: Path) -> None:
    notes, _, _ = _world()
    store = MemoryStore(tmp_path, keep_versions=1)
    store.save(notes)
    first = store.current_version()
    (tmp_path / "CURRENT").unlink()
    assert store.exists() and store.current_version() is None  # damaged, not absent
    with pytest.raises(store_mod.StoreDamagedError, match="CURRENT: missing, but .* 1 version"):
        store.load()
    with pytest.raises(store_mod.StoreDamagedError, match="soulmem restore"):
        store.save(notes[:2])  # never written over, never pruned
    assert {p.name for p in (tmp_path / "versions").iterdir()} == {first}
    store.restore(first)
    assert store.load().notes == notes
    store.save(notes[:3])  # with a live version again, keep_versions applies
    assert {p.name for p in (tmp_path / "versions").iterdir()} == {store.current_version()}


# ---- damaged stores ------------------------------------------------------------------------
def test_missing_store(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "nowhere")
    assert not store.exists() and store.current_version() is None
    with pytest.raises(StoreError, match="CURRENT: missing"):
        store.load()


def test_truncated_notes_file(tmp_path: Path) -> None:
    notes, _, _ = _world()
    store = MemoryStore(tmp_path)
    store.save(notes)
    data = (_version_dir(store) / NOTES_FILE).read_bytes()
    _rewrite(store, NOTES_FILE, data[: len(data) // 2], fix_manifest=False)
    with pytest.raises(StoreError, match=rf"{NOTES_FILE}: truncated or corrupted") as info:
        store.load()
    assert isinstance(info.value, OSError)
    # even with a manifest that agrees, the damage is found and the line named
    _rewrite(store, NOTES_FILE, data[: len(data) // 2], fix_manifest=True)
    with pytest.raises(StoreError, match=rf"{NOTES_FILE}: truncated \(the last line"):
        store.load()
    _rewrite(store, NOTES_FILE, data[: len(data) // 2] + b"\n", fix_manifest=True)
    with pytest.raises(StoreError, match=rf"{NOTES_FILE}: line \d+: not a valid note"):
        store.load()


def test_corrupted_tensor_file(tmp_path: Path) -> None:
    notes, _, _ = _world()
    store = MemoryStore(tmp_path)
    store.save(notes, _embeddings(notes))
    data = bytearray((_version_dir(store) / EMBEDDINGS_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    _rewrite(store, EMBEDDINGS_FILE, bytes(data), fix_manifest=False)
    with pytest.raises(StoreError, match=rf"{EMBEDDINGS_FILE}: checksum mismatch"):
        store.load()
    _rewrite(store, EMBEDDINGS_FILE, b"not a zip file", fix_manifest=True)
    with pytest.raises(StoreError, match=rf"{EMBEDDINGS_FILE}: not a readable tensor file"):
        store.load()


def test_tensor_file_with_wrong_shapes(tmp_path: Path) -> None:
    notes, _, _ = _world()
    store = MemoryStore(tmp_path)
    store.save(notes, _embeddings(notes))
    path = _version_dir(store) / EMBEDDINGS_FILE
    tensors = torch.load(path, weights_only=True)
    tensors["tag"] = tensors["tag"][:, :3]
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    _rewrite(store, EMBEDDINGS_FILE, buffer.getvalue(), fix_manifest=True)
    with pytest.raises(StoreError, match=rf"{EMBEDDINGS_FILE}: tensor 'tag': expected shape"):
        store.load()


class _Exploit:
    ran = False

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (setattr, (_Exploit, "ran", True))


def test_loading_never_executes_code(tmp_path: Path) -> None:
    notes, _, _ = _world()
    store = MemoryStore(tmp_path)
    store.save(notes, _embeddings(notes))
    buffer = io.BytesIO()
    torch.save({"tag": torch.zeros(1), "evil": _Exploit()}, buffer, pickle_protocol=2)
    _rewrite(store, EMBEDDINGS_FILE, buffer.getvalue(), fix_manifest=True)
    with pytest.raises(StoreError, match=rf"{EMBEDDINGS_FILE}: not a readable tensor file"):
        store.load()
    assert not _Exploit.ran


def test_unknown_format_version(tmp_path: Path) -> None:
    notes, _, _ = _world()
    store = MemoryStore(tmp_path)
    store.save(notes)
    path = _version_dir(store) / MANIFEST_FILE
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest["format_version"] = 99
    path.write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(StoreError, match=rf"{MANIFEST_FILE}: unknown format_version 99"):
        store.load()


def test_bad_manifest_and_missing_file(tmp_path: Path) -> None:
    notes, readable, _ = _world()
    store = MemoryStore(tmp_path)
    store.save(notes, readable_ids=readable)
    vdir = _version_dir(store)
    (vdir / READABLE_IDS_FILE).unlink()
    with pytest.raises(StoreError, match=rf"{READABLE_IDS_FILE}: missing"):
        store.load()
    text = (vdir / MANIFEST_FILE).read_text(encoding="utf-8")
    (vdir / MANIFEST_FILE).write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(StoreError, match=rf"{MANIFEST_FILE}: not valid JSON"):
        store.load()
    (vdir / MANIFEST_FILE).unlink()
    with pytest.raises(StoreError, match=rf"{MANIFEST_FILE}: missing"):
        store.load()
    (tmp_path / "CURRENT").write_text("../../etc\n")
    with pytest.raises(StoreError, match="CURRENT: expected a version directory name"):
        store.load()
    assert store.exists() and store.current_version() is None


def test_pending_listing_must_match_notes(tmp_path: Path) -> None:
    notes, _, _ = _world()
    store = MemoryStore(tmp_path)
    store.save(notes)
    _rewrite(store, PENDING_FILE, b"", fix_manifest=True)
    with pytest.raises(StoreError, match=rf"{PENDING_FILE}: lists 0 pending link"):
        store.load()


def test_sample_memory_round_trip(tmp_path: Path) -> None:
    """The bundled sample world (77 notes, readable ids) through the store, byte for byte."""
    from soulmem_torch.data import load_sample_memory

    graph = load_sample_memory()
    gen = torch.Generator().manual_seed(7)
    embeddings = [
        None if n.kind == "Procedure" else MemoryEmbedding(
            tag=torch.randn(16, generator=gen),
            fields={"content" if n.kind == "Semantic" else "narrative": torch.randn(16, generator=gen)})
        for n in graph.notes
    ]  # fmt: skip
    store = MemoryStore(tmp_path)
    manifest = store.save(
        graph.notes, embeddings, readable_ids=graph.readable_ids, embedder_name="random-16"
    )
    assert manifest["counts"]["notes"] == len(graph.notes)
    assert manifest["counts"]["links"] == graph.num_links
    assert manifest["counts"]["pending_links"] == 0
    back = store.load()
    assert [n.to_json() for n in back.notes] == [n.to_json() for n in graph.notes]
    assert back.id_map == graph.id_map
    _assert_same_embeddings(embeddings, back.embeddings)


# ---- cluster helpers -----------------------------------------------------------------------
class _FakeCluster:
    """The duck-typed surface the store uses: iteration, add_note, pending_links."""

    def __init__(self) -> None:
        self.items: list[EmbeddedMemoryNote] = []
        self.extra_pending: list[MemoryLink] = []

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.items)

    def add_note(self, note: MemoryNote, embedding: MemoryEmbedding | None = None) -> None:
        self.items.append(EmbeddedMemoryNote(note, embedding))

    def pending_links(self) -> dict[MemoryId, list[MemoryLink]]:
        ids = {item.note.id for item in self.items}
        out: dict[MemoryId, list[MemoryLink]] = {}
        for item in self.items:
            for link in item.note.mem_links:
                if link.to not in ids:
                    out.setdefault(link.to, []).append(link)
        for link in self.extra_pending:
            out.setdefault(link.to, []).append(link)
        return out


def test_save_and_load_cluster_duck_typed(tmp_path: Path) -> None:
    notes, readable, absent = _world()
    embeddings = _embeddings(notes)
    cluster = _FakeCluster()
    for note, emb in zip(notes, embeddings):
        cluster.add_note(note, emb)
    # a parked link the cluster holds but the source note's mem_links lacks
    parked = MemoryLink.new(notes[1].id, absent, SemMemLink(verb="recalls", confidence=0.5))
    cluster.extra_pending.append(parked)

    store = MemoryStore(tmp_path)
    manifest = store.save_cluster(cluster, readable_ids=readable, embedder_name="fake")
    assert manifest["counts"]["pending_links"] == 2
    assert notes[1].mem_links[-1] != parked  # the caller's note is not modified

    loaded = store.load_cluster(_FakeCluster())
    assert [item.note.id for item in loaded] == [n.id for n in notes]
    _assert_same_embeddings(embeddings, [item.embedding for item in loaded])
    pending = loaded.pending_links()[absent]
    assert {link.id for link in pending} == {notes[0].mem_links[1].id, parked.id}


def test_cluster_round_trip_with_the_runtime(tmp_path: Path) -> None:
    runtime = pytest.importorskip("soulmem_torch.runtime")
    cluster_cls = getattr(runtime, "MemoryCluster", None)
    if cluster_cls is None:
        pytest.skip("soulmem_torch.runtime.MemoryCluster is not written yet")
    notes, readable, absent = _world()
    embeddings = _embeddings(notes)
    cluster = cluster_cls()
    for note, emb in zip(notes, embeddings):
        cluster.add_note(note, emb)
    cluster.remove_note(notes[3].id)  # re-parks the sit -> proc link
    store = MemoryStore(tmp_path)
    manifest = store.save_cluster(
        cluster, readable_ids={mid: rid for mid, rid in readable.items() if mid != notes[3].id}
    )
    assert manifest["counts"] == {"notes": 4, "links": 5, "pending_links": 2, "embeddings": 3,
                                  "readable_ids": 4}  # fmt: skip

    loaded = store.load_cluster()
    assert [item.note.id for item in loaded] == [item.note.id for item in cluster]
    _assert_same_embeddings(
        [item.embedding for item in cluster], [item.embedding for item in loaded]
    )

    def key(link):  # type: ignore[no-untyped-def]
        return (str(link.id), str(link.from_), str(link.to))

    assert sorted(map(key, loaded.links())) == sorted(map(key, cluster.links()))
    assert sorted(map(key, loaded.pending_links())) == sorted(map(key, cluster.pending_links()))
    assert {link.to for link in loaded.pending_links()} == {absent, notes[3].id}
