"""The legacy directory store (``DirectoryStore``, still read and migrated): a damaged pointer is refused (never taken for an empty store), versions are listed and a
verified one restored; the manifest's own checksum is verified; legacy manifests still load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from soulmem_torch.errors import StoreError
from soulmem_torch.store import (
    MANIFEST_FILE,
    NOTES_FILE,
    StoreDamagedError,
    manifest_checksum,
)
from soulmem_torch.store import DirectoryStore as MemoryStore
from tests.store._helpers import notes


def _three_versions(root: Path) -> tuple[MemoryStore, list[str]]:
    store = MemoryStore(root, keep_versions=3)
    names = []
    for n in (2, 4, 6):
        store.save(notes(0, n))
        names.append(store.current_version())
    return store, names


def _version_names(root: Path) -> set[str]:
    return {p.name for p in (root / "versions").iterdir()}


@pytest.mark.parametrize(
    "damage",
    ["dangling", "garbage", "binary", "empty", "missing", "directory"],
)
def test_damaged_pointer_is_refused_and_nothing_pruned(tmp_path: Path, damage: str) -> None:
    store, names = _three_versions(tmp_path)
    pointer = tmp_path / "CURRENT"
    if damage == "dangling":
        pointer.write_text("g000009-0badf00d\n")
    elif damage == "garbage":
        pointer.write_text("not a version\n")
    elif damage == "binary":
        pointer.write_bytes(b"\xff\xfe\x00garbage")
    elif damage == "empty":
        pointer.write_bytes(b"")
    elif damage == "missing":
        pointer.unlink()
    else:
        pointer.unlink()
        pointer.mkdir()
    assert store.exists()  # a damaged store is still a store, never "absent"
    with pytest.raises(StoreDamagedError, match="soulmem versions .*soulmem restore") as info:
        store.load()
    assert isinstance(info.value, StoreError) and isinstance(info.value, OSError)
    with pytest.raises(StoreDamagedError):
        store.check()
    # a save (e.g. the next import) is refused too: nothing written, nothing pruned
    for _ in range(3):
        with pytest.raises(StoreDamagedError):
            store.save(notes(0, 1))
    assert _version_names(tmp_path) == set(names)


def test_versions_lists_counts_dates_and_validity(tmp_path: Path) -> None:
    store, names = _three_versions(tmp_path)
    # corrupt the middle version's notes file
    bad = tmp_path / "versions" / names[1] / NOTES_FILE
    bad.write_bytes(bad.read_bytes()[:-10])
    (tmp_path / "CURRENT").write_text("g000042-deadbeef\n")
    infos = store.versions()
    assert [v.name for v in infos] == names
    assert [v.generation for v in infos] == [1, 2, 3]
    assert [v.notes for v in infos] == [2, 4, 6]
    assert [v.valid for v in infos] == [True, False, True]
    assert "truncated or corrupted" in (infos[1].problem or "")
    assert all(v.written_at and v.written_at.endswith("Z") for v in infos)
    assert not any(v.current for v in infos)


def test_restore_verifies_then_repoints(tmp_path: Path) -> None:
    store, names = _three_versions(tmp_path)
    bad = tmp_path / "versions" / names[2] / NOTES_FILE
    bad.write_bytes(b"x" + bad.read_bytes()[1:])  # same size, checksum mismatch
    (tmp_path / "CURRENT").write_text("garbage\n")
    with pytest.raises(StoreError, match=rf"cannot restore {names[2]}: .*checksum mismatch"):
        store.restore(names[2])
    assert (tmp_path / "CURRENT").read_text() == "garbage\n"  # untouched
    with pytest.raises(StoreError, match="matches no version; versions on disk: g000001"):
        store.restore("g000099")
    with pytest.raises(StoreError, match="is ambiguous"):
        store.restore("g00000")
    restored = store.restore(2)  # by generation number
    assert restored.version == names[1] and len(restored.notes) == 4
    assert store.current_version() == names[1]
    assert len(store.load().notes) == 4
    store.restore(names[0][:9])  # by unique prefix
    assert len(store.load().notes) == 2
    assert _version_names(tmp_path) == set(names)  # restore deletes nothing
    store.save(notes(0, 3))  # saving works again
    assert len(store.load().notes) == 3


def test_restore_on_a_path_without_versions(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="not a memory store"):
        MemoryStore(tmp_path / "none").restore(1)


def test_manifest_is_checksummed(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    manifest = store.save(notes(0, 3))
    assert manifest["manifest_sha256"] == manifest_checksum(manifest)
    path = tmp_path / "versions" / store.current_version() / MANIFEST_FILE
    data = json.loads(path.read_text(encoding="utf-8"))
    data["counts"]["links"] = 7  # a flipped number that is still valid JSON
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(StoreError, match=r"manifest.json: checksum mismatch .* the manifest is"):
        store.load()
    assert not store.versions()[0].valid


def test_legacy_manifest_without_checksum_or_identity_loads(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    store.save(notes(0, 3))
    path = tmp_path / "versions" / store.current_version() / MANIFEST_FILE
    data = json.loads(path.read_text(encoding="utf-8"))
    for key in ("manifest_sha256", "embedder"):
        data.pop(key, None)
    path.write_text(json.dumps(data), encoding="utf-8")
    contents = store.load()
    assert contents.legacy and contents.embedder_identity is None
    assert [n.id for n in contents.notes] == [n.id for n in notes(0, 3)]


def test_absent_store_is_not_damaged(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "new")
    assert not store.exists() and store.check() is None and store.versions() == []
    with pytest.raises(StoreError, match="CURRENT: missing — .* not a memory store") as info:
        store.load()
    assert not isinstance(info.value, StoreDamagedError)
    store.save(notes(0, 1))
    assert store.check() == store.current_version()


def test_a_damaged_live_version_names_the_recovery_path(tmp_path: Path) -> None:
    store, names = _three_versions(tmp_path)
    live = tmp_path / "versions" / names[2] / NOTES_FILE
    live.write_bytes(live.read_bytes()[:-3])
    with pytest.raises(
        StoreError,
        match=rf"truncated .* live version {names[2]} is damaged .*"
        rf"soulmem restore {tmp_path} VERSION",
    ):
        store.load()
    store.restore(names[1])
    assert len(store.load().notes) == 4
