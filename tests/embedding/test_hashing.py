"""HashingEmbedder: shape, norms, the baseline identity, determinism across processes with
different hash seeds, fitted IDF, and bad arguments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from soulmem_torch.embedding import Embedder, HashingEmbedder, run_embedder
from soulmem_torch.errors import ValidationError

REPO = Path(__file__).resolve().parents[2]
TEXTS = [
    "守护穗织的剑灵少女",
    "剑灵守护穗织",
    "The night raid, running fast",
    "running",
    "",
    "。，！",
    "B",  # (a lone "A" is a stopword now: no feature)
]


def test_shape_norms_and_protocol() -> None:
    emb = HashingEmbedder(dim=64)
    assert isinstance(emb, Embedder) and emb.dim == 64
    x = emb(TEXTS)
    assert x.shape == (len(TEXTS), 64) and x.dtype == torch.float32
    norms = x.norm(dim=1)
    assert torch.allclose(norms[[0, 1, 2, 3, 6]], torch.ones(5), atol=1e-6)
    assert (x[4] == 0).all() and (x[5] == 0).all()  # no feature -> zero vector
    assert run_embedder(emb, TEXTS).shape == (len(TEXTS), 64)


def test_baseline_identity() -> None:
    base = HashingEmbedder(dim=256, baseline=0.0)
    shifted = HashingEmbedder(dim=256, baseline=0.3)
    a, b = base(TEXTS[:4]), shifted(TEXTS[:4])
    np.testing.assert_allclose((b @ b.T).numpy(), (0.3 + 0.7 * (a @ a.T)).numpy(), atol=1e-6)


def test_lexical_overlap_ranks_higher() -> None:
    emb = HashingEmbedder()
    x = emb(
        [
            "深夜突袭将臣的房间表白",
            "夜里偷偷去将臣房间说出心意",
            "在学校吃午饭",
            "running shoes",
            "run in shoes",
        ]
    )
    sims = x @ x.T
    assert sims[0, 1] > sims[0, 2]
    assert sims[3, 4] > sims[3, 0]  # trigrams relate run / running


def test_deterministic_across_processes() -> None:
    code = (
        "import sys, json; from soulmem_torch.embedding import HashingEmbedder;"
        f"x = HashingEmbedder(dim=96)({TEXTS!r});"
        "sys.stdout.write(json.dumps(x.tolist()))"
    )
    outs = []
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        res = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            cwd=REPO,
        )
        outs.append(res.stdout)
    assert outs[0] == outs[1]
    local = HashingEmbedder(dim=96)(TEXTS)
    import json

    assert torch.equal(torch.tensor(json.loads(outs[0])), local)


def test_fit_idf() -> None:
    corpus = ["的的的 丛雨", "的 将臣", "的 芳乃", "的 茉子"]
    emb = HashingEmbedder(dim=128, baseline=0.0).fit(corpus)
    assert emb.idf is not None and "c的" in emb.idf and emb.idf["c的"] < emb.idf["c丛"]
    x = emb(["的丛雨", "的将臣", "丛雨"])
    plain = HashingEmbedder(dim=128, baseline=0.0)(["的丛雨", "的将臣", "丛雨"])
    # the shared common character counts less after fitting
    assert (x[0] @ x[1]) < (plain[0] @ plain[1])
    assert "fitted" in repr(emb)
    with pytest.raises(ValidationError):
        HashingEmbedder().fit(["ok", 3])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "kwargs", [{"dim": 2}, {"dim": 8.0}, {"baseline": 1.0}, {"baseline": -0.1}, {"link_weight": -1}]
)
def test_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValidationError):
        HashingEmbedder(**kwargs)


def test_bad_texts() -> None:
    emb = HashingEmbedder(dim=16)
    with pytest.raises(ValidationError, match="one str"):
        emb("abc")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"texts\[1\]"):
        emb(["a", None])  # type: ignore[list-item]


def test_stopwords_match_the_text_channel() -> None:
    from soulmem_torch.embedding.hashing import _STOPWORDS
    from soulmem_torch.retrieve.text import STOPWORDS

    assert _STOPWORDS == STOPWORDS


def test_english_stopwords_do_not_make_texts_alike() -> None:
    from soulmem_torch.embedding import HashingEmbedder

    emb = HashingEmbedder()
    x = emb(["I did it and I was there with the", "a cat", "the cat", ""])
    # only function words: no feature at all (the zero vector), like an empty text
    assert float(x[0].norm()) == 0.0 and float(x[3].norm()) == 0.0
    assert torch.allclose(x[1], x[2])  # "the" adds nothing
