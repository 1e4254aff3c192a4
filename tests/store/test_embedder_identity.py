"""Embedder identity: recorded at save, checked at load — same → reuse, different → re-embed
(warned) or refuse; never a silent mix. Specs build embedders for the command line."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from soulmem_torch import SoulMem
from soulmem_torch.embedding import EmbedderUnavailableError, HashingEmbedder
from soulmem_torch.embedding.identity import (
    PROBE_PROJECTIONS,
    PROBE_TEXTS,
    EmbedderIdentity,
    EmbedderMismatchError,
    EmbedderMismatchWarning,
    embedder_from_spec,
    embedder_identity,
    parse_embedder_spec,
)
from soulmem_torch.errors import StoreError, ValidationError
from soulmem_torch.store import MANIFEST_FILE, DirectoryStore, MemoryStore, manifest_checksum
from tests.store._helpers import notes


class Rotated:
    """The hashing embedder's vectors under a fixed permutation: same width, other space."""

    def __init__(self, dim: int = 64) -> None:
        self.inner = HashingEmbedder(dim)
        self.dim = dim
        self.perm = torch.randperm(dim, generator=torch.Generator().manual_seed(1))

    def __call__(self, texts: list[str]) -> torch.Tensor:
        return self.inner(texts)[:, self.perm]


def test_identity_same_and_different() -> None:
    a = embedder_identity(HashingEmbedder(64))
    assert a.dim == 64 and len(a.probe) == len(PROBE_TEXTS) * PROBE_PROJECTIONS
    assert a.matches(embedder_identity(HashingEmbedder(64)))
    assert a.fingerprint == embedder_identity(HashingEmbedder(64)).fingerprint
    for other in (HashingEmbedder(65), HashingEmbedder(64, link_weight=1.0), Rotated(64)):
        assert not a.matches(embedder_identity(other)), other
    fitted = HashingEmbedder(64).fit(["咖啡 latte", "雨天", "towel"])
    assert not a.matches(embedder_identity(fitted))


def test_identity_tolerates_tiny_numeric_noise() -> None:
    base = HashingEmbedder(64)

    def noisy(texts: list[str]) -> torch.Tensor:
        return base(texts) * 1.0001 + 1e-6

    assert embedder_identity(base).matches(embedder_identity(noisy))


def test_identity_json_round_trip_and_errors() -> None:
    a = embedder_identity(HashingEmbedder(64), spec="hashing")
    back = EmbedderIdentity.from_json(json.loads(json.dumps(a.to_json())))
    assert back == a and back.spec == "hashing" and a.name == "hashing"
    data = a.to_json()
    for key, value, message in [
        ("dim", 0, r"embedder.dim: expected an int > 0"),
        ("probe", [1.0, 2.0], r"embedder.probe: expected 96 finite numbers"),
        ("name", "", r"embedder.name: expected a non-empty string"),
        ("spec", 3, r"embedder.spec: expected a string or null"),
    ]:
        with pytest.raises(ValidationError, match=message):
            EmbedderIdentity.from_json({**data, key: value})
    with pytest.raises(ValidationError, match="expected an object"):
        EmbedderIdentity.from_json([1])


def _store(path: Path, embedder: object) -> None:
    mem = SoulMem(embedder=embedder)
    mem.add_notes(notes(0, 6))
    mem.save(path)


def test_save_records_the_identity(tmp_path: Path) -> None:
    _store(tmp_path, HashingEmbedder(64))
    contents = MemoryStore(tmp_path).load()
    assert contents.embedder_identity is not None
    assert contents.embedder_identity.matches(embedder_identity(HashingEmbedder(64)))
    assert contents.embedder_identity.name == "hashing(dim=64)"


def test_same_embedder_reuses_the_stored_vectors(tmp_path: Path) -> None:
    _store(tmp_path, HashingEmbedder(64))
    stored = MemoryStore(tmp_path).load().embeddings

    class Counting(HashingEmbedder):
        calls = 0

        def __call__(self, texts):  # type: ignore[no-untyped-def]
            Counting.calls += len(texts)
            return super().__call__(texts)

    mem = SoulMem.load(tmp_path, embedder=Counting(64))
    assert mem.reembedded is None
    assert Counting.calls == len(PROBE_TEXTS)  # only the identity probe
    for entry, emb in zip(mem.cluster, stored):
        assert torch.equal(entry.embedding.tag, emb.tag)


def test_other_embedder_same_width_reembeds_and_queries_work(tmp_path: Path) -> None:
    """The reported defect: same width, other embedder → stored vectors used, queries empty."""
    _store(tmp_path, HashingEmbedder(64))
    rotated = Rotated(64)
    with pytest.warns(EmbedderMismatchWarning, match=r"hashing\(dim=64\) .* re-embedding all 6"):
        mem = SoulMem.load(tmp_path, embedder=rotated)
    assert mem.reembedded and "test_embedder_identity.Rotated" in mem.reembedded
    fresh = SoulMem(embedder=rotated)
    fresh.add_notes(notes(0, 6))
    for a, b in zip(mem.cluster, fresh.cluster):
        assert torch.allclose(a.embedding.tag, b.embedding.tag)
    seeds = mem.ask(["concept 3 概念3"])[0].seeds
    assert seeds and seeds[0][0] == notes(3, 4)[0].id
    mem.save(tmp_path)  # the store now records the new embedder
    assert MemoryStore(tmp_path).load().embedder_identity.matches(embedder_identity(rotated))


def test_refuse_names_both_identities(tmp_path: Path) -> None:
    _store(tmp_path, HashingEmbedder(64))
    with pytest.raises(EmbedderMismatchError, match=r"hashing\(dim=64\) .*Rotated .*refusing"):
        SoulMem.load(tmp_path, embedder=Rotated(64), on_embedder_mismatch="refuse")
    with pytest.raises(ValidationError, match="on_embedder_mismatch: expected 'reembed' or"):
        SoulMem.load(tmp_path, embedder=HashingEmbedder(64), on_embedder_mismatch="mix")


def _directory_store(path: Path, embedder: object) -> None:
    """A store in the legacy directory format (still read; migrated by the first write)."""
    from soulmem_torch.embedding import embed_notes
    from soulmem_torch.embedding.identity import embedder_identity

    ns = notes(0, 6)
    DirectoryStore(path).save(ns, embed_notes(ns, embedder), embedder_name=type(embedder).__name__,
                              embedder_identity=embedder_identity(embedder))  # fmt: skip


def _make_legacy(path: Path) -> None:
    store = DirectoryStore(path)
    mpath = path / "versions" / store.current_version() / MANIFEST_FILE
    data = json.loads(mpath.read_text(encoding="utf-8"))
    data.pop("embedder")
    data.pop("manifest_sha256")
    mpath.write_text(json.dumps(data), encoding="utf-8")


def test_legacy_store_is_trusted_only_for_the_same_class_and_width(tmp_path: Path) -> None:
    _directory_store(tmp_path, HashingEmbedder(64))
    _make_legacy(tmp_path)
    mem = SoulMem.load(tmp_path, embedder=HashingEmbedder(64))
    assert mem.reembedded is None  # what older versions did: same class name, same width
    with pytest.warns(EmbedderMismatchWarning, match="legacy store without an identity"):
        mem = SoulMem.load(tmp_path, embedder=Rotated(64))
    assert mem.reembedded


def test_corrupt_identity_in_the_manifest_is_a_store_error(tmp_path: Path) -> None:
    _directory_store(tmp_path, HashingEmbedder(64))
    store = MemoryStore(tmp_path)  # reads the legacy directory format
    mpath = tmp_path / "versions" / store.current_version() / MANIFEST_FILE
    data = json.loads(mpath.read_text(encoding="utf-8"))
    data["embedder"]["dim"] = "wide"
    data["manifest_sha256"] = manifest_checksum(data)
    mpath.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(StoreError, match=r"manifest.json: 'embedder'.dim: expected an int"):
        store.load()


# ---- specs ---------------------------------------------------------------------------------
def test_parse_embedder_spec() -> None:
    assert parse_embedder_spec("hashing") == "hashing"
    assert parse_embedder_spec(" st:BAAI/bge-small-zh-v1.5 ") == "st:BAAI/bge-small-zh-v1.5"
    assert parse_embedder_spec("pkg.mod:make") == "pkg.mod:make"
    for bad, message in [
        ("st:", "st: needs a model name"),
        ("nothing", "expected hashing .*found 'nothing'"),
        (":f", "found ':f'"),
        ("mod:", "found 'mod:'"),
    ]:
        with pytest.raises(ValidationError, match=message):
            parse_embedder_spec(bad)


def test_embedder_from_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hashing = embedder_from_spec("hashing")
    assert isinstance(hashing, HashingEmbedder) and hashing.soulmem_spec == "hashing"
    assert embedder_identity(hashing).name == "hashing"
    module = tmp_path / "my_embedders.py"
    module.write_text(
        textwrap.dedent(
            """
            from soulmem_torch.embedding import HashingEmbedder
            def small():
                return HashingEmbedder(32)
            def broken():
                raise RuntimeError("no model here")
            def not_an_embedder():
                return 42
            VALUE = 3
            """
        ),
        encoding="utf-8",
    )
    by_path = embedder_from_spec(f"{module}:small")
    assert by_path.dim == 32 and by_path.soulmem_spec == f"{module}:small"
    monkeypatch.syspath_prepend(str(tmp_path))
    by_name = embedder_from_spec("my_embedders:small")
    assert embedder_identity(by_name).name == "my_embedders:small"
    assert embedder_identity(by_name).matches(embedder_identity(by_path))
    for spec, message in [
        ("my_embedders:broken", "calling it raised RuntimeError: no model here"),
        ("my_embedders:not_an_embedder", "expected the function to return an Embedder"),
        ("my_embedders:VALUE", "expected a function returning an Embedder, found int"),
        ("my_embedders:missing", "has no attribute 'missing'"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        (f"{tmp_path}/absent.py:f", "no such file"),
    ]:
        with pytest.raises(ValidationError, match=message):
            embedder_from_spec(spec)


def test_st_spec_without_sentence_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import fails
    with pytest.raises(EmbedderUnavailableError, match="pip install 'soulmem_torch\\[st\\]'"):
        embedder_from_spec("st:BAAI/bge-small-zh-v1.5")
