"""Embedder output validation, batching and chunking."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

from soulmem_torch.embedding import (
    EmbedderUnavailableError,
    SentenceTransformerEmbedder,
    chunk_text,
    embed_notes,
    embedder_dim,
    run_embedder,
)
from soulmem_torch.errors import SoulMemError, ValidationError
from soulmem_torch.model import ConceptType, MemoryNote, SemMemory
from tests.embedding.helpers import FakeEmbedder


class Broken:
    """An embedder whose outputs can be made wrong in several ways."""

    def __init__(self, mode: str, dim: int = 4) -> None:
        self.mode, self.dim = mode, dim

    def __call__(self, texts):
        n = len(texts)
        if self.mode == "width":
            return torch.zeros(n, self.dim + 1)
        if self.mode == "rows":
            return torch.zeros(n + 1, self.dim)
        if self.mode == "int":
            return torch.zeros(n, self.dim, dtype=torch.long)
        if self.mode == "numpy":
            return np.ones((n, self.dim))
        if self.mode == "junk":
            return "junk"
        out = torch.ones(n, self.dim)
        for i, t in enumerate(texts):
            if t == "bad":
                out[i, 1] = float("nan") if self.mode == "nan" else float("inf")
        return out


def test_run_embedder_batches_and_converts() -> None:
    fake = FakeEmbedder(dim=3)
    out = run_embedder(fake, [f"t{i}" for i in range(7)], batch_size=3)
    assert out.shape == (7, 3) and [len(c) for c in fake.calls] == [3, 3, 1]
    assert run_embedder(Broken("numpy"), ["a"]).dtype == torch.float32
    assert run_embedder(fake, []).shape == (0, 3)


@pytest.mark.parametrize(
    ("mode", "match"),
    [("width", r"expected shape \(2, 4\)"), ("rows", "expected shape"), ("int", "float"),
     ("junk", "expected a float tensor"), ("nan", "'bad'"), ("inf", "finite")],
)  # fmt: skip
def test_run_embedder_rejects_bad_outputs(mode: str, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        run_embedder(Broken(mode), ["ok", "bad"])


def test_bad_output_names_the_note_field() -> None:
    note = MemoryNote.build(
        SemMemory(content="ok", aliases=["bad"], concept_type=ConceptType.ENTITY, description="x")
    )
    with pytest.raises(ValidationError, match=r"notes\[0\].*aliases\[0\].*finite"):
        embed_notes([note], Broken("nan"))


def test_embedder_dim_and_batch_size() -> None:
    class NoDim:
        def __call__(self, texts):
            return torch.zeros(len(texts), 2)

    assert embedder_dim(NoDim()) == 2  # a plain callable: probed
    assert embedder_dim(NoDim(), probe=False) is None

    class BadDim(NoDim):
        dim = 0

    with pytest.raises(ValidationError, match="embedder.dim"):
        embedder_dim(BadDim())

    def plain(texts):  # SPEC §3: any callable; the width comes from its output
        return torch.ones(len(texts), 3)

    note = MemoryNote.build(
        SemMemory(content="a", aliases=[], concept_type=ConceptType.ENTITY, description="b")
    )
    (emb,) = embed_notes([note], plain)
    assert emb.dim == 3
    assert run_embedder(plain, []).shape == (0, 3)
    with pytest.raises(ValidationError, match="batch_size"):
        run_embedder(FakeEmbedder(), ["a"], batch_size=0)


def test_query_side_uses_embed_query() -> None:
    fake = FakeEmbedder(dim=3, query_shift=1.0)
    doc = run_embedder(fake, ["x"])
    query = run_embedder(fake, ["x"], query=True)
    assert fake.query_calls == [["x"]] and len(fake.calls) == 1
    assert torch.allclose(query, doc + 1.0)


def test_chunk_text() -> None:
    assert chunk_text("") == [] and chunk_text("  \n ") == []
    assert chunk_text("  短文本 ") == ["短文本"]
    text = "第一句很长很长。" * 40 + "\n\n" + "second paragraph " * 20
    chunks = chunk_text(text, 50)
    assert all(0 < len(c) <= 50 for c in chunks)
    assert "".join("".join(chunks).split()) == "".join(text.split())  # nothing lost
    assert chunk_text("x" * 450, 200) == ["x" * 200, "x" * 200, "x" * 50]
    with pytest.raises(ValidationError):
        chunk_text("a", 0)


def _reference_chunks(text: str, max_chars: int, levels: Sequence[Any] | None = None) -> list[str]:
    """The chunking rule level by level, every level tried (no level skipped); ``levels``:
    each level's splitter (text → pieces), the library's own by default."""
    from soulmem_torch.embedding.embedder import _LEVELS

    levels = _LEVELS if levels is None else levels

    def split(t: str, level: int) -> list[str]:
        if len(t) <= max_chars:
            return [t]
        if level >= len(levels):
            return [t[i : i + max_chars] for i in range(0, len(t), max_chars)]
        pieces = list(filter(None, levels[level](t)))
        if len(pieces) <= 1:
            return split(t, level + 1)
        return [q for p in pieces for q in (split(p, level + 1) if len(p) > max_chars else [p])]

    stripped = text.strip()
    if not stripped:
        return []
    chunks, current = [], ""
    for piece in split(stripped, 0):
        if len(current) + len(piece) <= max_chars:
            current += piece
            continue
        if current.strip():
            chunks.append(current.strip())
        current = piece
    if current.strip():
        chunks.append(current.strip())
    return chunks


def test_chunk_text_equals_the_level_by_level_rule() -> None:
    import random

    rng = random.Random(3)
    parts = ["word", "Word.", "x" * 70, "\n", "\n\n", " ", "，", "。", "a, b", "end!", "3.14"]
    for _ in range(300):
        text = "".join(rng.choice(parts) + rng.choice(["", " "]) for _ in range(rng.randint(0, 80)))
        for limit in (7, 40, 200):
            assert chunk_text(text, limit) == _reference_chunks(text, limit), (text, limit)


def test_sentence_transformers_adapter() -> None:
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        with pytest.raises(EmbedderUnavailableError, match="sentence-transformers") as info:
            SentenceTransformerEmbedder("BAAI/bge-small-zh-v1.5")
        assert isinstance(info.value, SoulMemError) and isinstance(info.value, ImportError)

    class FakeModel:  # an already built model is wrapped without importing the package
        def get_sentence_embedding_dimension(self) -> int:
            return 3

        def encode(self, texts, **kwargs):
            assert kwargs["normalize_embeddings"] is True
            return torch.tensor([[float(len(t)), 1.0, 0.0] for t in texts])

    emb = SentenceTransformerEmbedder(FakeModel(), query_prefix="q:")
    assert emb.dim == 3
    assert emb(["ab"]).tolist() == [[2.0, 1.0, 0.0]]
    assert emb.embed_query(["ab"]).tolist() == [[4.0, 1.0, 0.0]]
    with pytest.raises(ValidationError, match="model"):
        SentenceTransformerEmbedder(object())


# The splitter as first written: every level a zero-width split after its separators.
_REF_LEVELS = tuple(
    re.compile(p)
    for p in (r"(?<=\n\n)", r"(?<=\n)", r"(?<=[。！？!?；;…])|(?<=[.](?=\s))", r"(?<=[，,、：:])",
              r"(?<=\s)")
)  # fmt: skip


def test_chunk_text_matches_the_zero_width_splitter() -> None:
    rng = random.Random(3)
    alphabet = [*"ab .\n\t。！？!?；;…，,、：: \u3000\u00a0x\r\x1c", "\n\n", "...", ". "]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))) for _ in range(3000)]
    texts += ["a.b. c.\n\n\nd", "x" * 450, "。" * 250, "end." * 80, "，" * 201]
    for limit in (200, 7, 50):
        for text in texts:
            assert chunk_text(text, limit) == _reference_chunks(
                text, limit, [r.split for r in _REF_LEVELS]
            ), (limit, text)
