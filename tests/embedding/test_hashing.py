"""HashingEmbedder: shape, norms, the baseline identity, determinism across processes with
different hash seeds, fitted IDF, bad arguments, and the batched implementation bit for bit
against the text-by-text reference (CJK, emoji, NUL, case folds, long and empty texts)."""

from __future__ import annotations

import hashlib
import math
import os
import random
import re
import subprocess
import sys
import unicodedata
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
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


# -------------------------------------------------------------------------------------------
# the batched fast path against the text-by-text definition
# -------------------------------------------------------------------------------------------
# The reference: the text-by-text implementation the batched one replaced (each text's
# features counted in a Counter, hashed one by one, summed by one bincount per block), kept
# here verbatim in substance so every vector can be checked bit for bit.
_REF_RUNS = re.compile(
    r"(?P<cjk>[\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
    r"\U00020000-\U0003134f]+)|(?P<word>[^\W_]+)"
)


def _ref_features(text: str) -> tuple[Counter[str], Counter[str]]:
    from soulmem_torch.embedding.hashing import _STOPWORDS

    norm = unicodedata.normalize("NFKC", text).casefold()
    atoms: list[str] = []
    links: list[str] = []
    prev_word: str | None = None
    for run, word in _REF_RUNS.findall(norm):
        if run:
            prev_word = None
            atoms.extend(["c" + ch for ch in run])
            links.extend(["b" + run[i : i + 2] for i in range(len(run) - 1)])
            continue
        if word in _STOPWORDS:
            continue
        marked = f"<{word}>"
        atoms.append("w" + word)
        links.extend("t" + marked[i : i + 3] for i in range(len(marked) - 2))
        if prev_word is not None:
            links.append("p" + prev_word + " " + word)
        prev_word = word
    return Counter(atoms), Counter(links)


def _ref_block(
    counts: Counter[str], size: int, idf: dict[str, float] | None, default: float
) -> tuple[np.ndarray, np.ndarray]:
    cols, signs = [], []
    for feature in counts:
        digest = hashlib.blake2b(
            feature.encode("utf-8"), digest_size=8, key=b"soulmem-hashing-v1"
        ).digest()
        value = int.from_bytes(digest, "little")
        cols.append(value % size)
        signs.append(-1.0 if value >> 63 else 1.0)
    weight = 1.0 + np.log(np.fromiter(counts.values(), dtype=np.float64, count=len(counts)))
    if idf is not None:
        weight *= np.fromiter(
            (idf.get(f, default) for f in counts), dtype=np.float64, count=len(counts)
        )
    return np.asarray(cols, dtype=np.int64), np.asarray(signs, dtype=np.float64) * weight


def reference_embed(emb: HashingEmbedder, texts: list[str]) -> torch.Tensor:
    n, dim = len(texts), emb.dim
    a_size, l_size = emb._atom_size, emb._link_size
    parts: dict[str, list[list[np.ndarray]]] = {"a": [[], []], "l": [[], []]}
    for row, text in enumerate(texts):
        for name, counts, size in zip("al", _ref_features(text), (a_size, l_size)):
            if counts:
                cols, vals = _ref_block(counts, size, emb.idf, emb._idf_default)
                parts[name][0].append(cols + row * size)
                parts[name][1].append(vals)

    def summed(name: str, size: int) -> np.ndarray:
        cols, vals = parts[name]
        if not cols:
            return np.zeros((n, size))
        return np.bincount(
            np.concatenate(cols), weights=np.concatenate(vals), minlength=n * size
        ).reshape(n, size)

    atoms_m, links_m = summed("a", a_size), summed("l", l_size)
    a_norm = np.linalg.norm(atoms_m, axis=1, keepdims=True)
    l_norm = np.linalg.norm(links_m, axis=1, keepdims=True)
    atoms_m = np.divide(atoms_m, a_norm, out=np.zeros_like(atoms_m), where=a_norm > 0)
    links_m = np.divide(links_m, l_norm, out=np.zeros_like(links_m), where=l_norm > 0)
    lexical = np.concatenate([atoms_m, emb.link_weight * links_m], axis=1)
    lex_norm = np.linalg.norm(lexical, axis=1, keepdims=True)
    nonempty = lex_norm > 0
    lexical = np.divide(lexical, lex_norm, out=np.zeros_like(lexical), where=nonempty)
    out = np.concatenate(
        [math.sqrt(1.0 - emb.baseline) * lexical, math.sqrt(emb.baseline) * nonempty], axis=1
    )
    assert out.shape == (n, dim)
    return torch.from_numpy(out.astype(np.float32))


def reference_idf(corpus: list[str]) -> tuple[dict[str, float], float]:
    df: Counter[str] = Counter()
    for text in corpus:
        atoms, links = _ref_features(text)
        df.update(set(atoms) | set(links))
    n = len(corpus)
    return {f: math.log((1 + n) / (1 + c)) + 1.0 for f, c in df.items()}, math.log(1 + n) + 1.0


_rng = random.Random(16)
_VOCAB = [
    "cat", "Cats", "running", "RUN", "x", "naïve", "Straße", "ΟΔΟΣ", "ﬁne", "ＡＢＣ１２３", "e\u0301",
    "under_score", "3.14", "😀", "🎉🎉", "守护", "穗织", "剑灵", "안녕하세요", "カタカナ", "ひらがな",
    "abc中文", "中文abc", "the", "and", "I", "\x00", "\n\n", ",", "—", "\U00020000\U00020001",
    "k8s", "don't", "  ", "\t", "Ǆ", "İstanbul", "ß", "ǅungla",
]  # fmt: skip
FAST_TEXTS = [
    *TEXTS,
    "",
    " ",
    "the and of I",
    "Hello WORLD hello world 你好世界 abc中文 def",
    "emoji 😀 party 🎉🎉 now 👍🏽 👨‍👩‍👧",
    "a\x00b c\x00d\x00",
    "\x00",
    "ΟΔΟΣ Straße ﬁne café ＡＢＣ１２３ ½ ℌ",
    "e\u0301 cafe\u0301 \u0301lead",
    "안녕하세요 세계 カタカナ ひらがな 漢字かな交じり",
    "x" * 5000,
    "long " * 2000,
    " ".join(f"word{i % 37} w{i % 5}" for i in range(3000)),
    "中" * 3000 + " and " + "文字" * 500,
    "repeat repeat repeat repeat the repeat",
    "Dates: 2023/05/20 (Sat) 10:02, 1:56 pm on 8 May, 2023",
    *(" ".join(_rng.choice(_VOCAB) for _ in range(_rng.randint(0, 60))) for _ in range(200)),
]


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"dim": 64}, {"dim": 3}, {"dim": 97, "link_weight": 0.0, "baseline": 0.0},
     {"dim": 256, "link_weight": 2.5, "baseline": 0.9}],
)  # fmt: skip
def test_batched_path_is_bit_identical_to_the_reference(kwargs: dict) -> None:
    emb = HashingEmbedder(**kwargs)
    want = reference_embed(emb, FAST_TEXTS)
    assert torch.equal(emb(FAST_TEXTS), want)
    # any batching, repeated texts, reversed order: the same rows
    assert torch.equal(torch.cat([emb([t]) for t in FAST_TEXTS[:40]]), want[:40])
    doubled = FAST_TEXTS[::-1] + FAST_TEXTS
    assert torch.equal(emb(doubled), torch.cat([want.flip(0), want]))
    assert emb([]).shape == (0, emb.dim)


@pytest.mark.parametrize(
    "kwargs", [{}, {"dim": 3}, {"dim": 97, "link_weight": 0.0, "baseline": 0.0}]
)
def test_cells_are_the_non_zero_values_of_the_rows(kwargs: dict) -> None:
    emb = HashingEmbedder(**kwargs)
    texts = FAST_TEXTS[::-1] + FAST_TEXTS[:30]  # repeated texts too
    ptr, cols, vals, base = emb.cells(texts)
    assert ptr.shape == (len(texts) + 1,) and ptr[0] == 0 and vals.dtype == np.float32
    dense = np.zeros((len(texts), emb.dim), dtype=np.float32)
    for i in range(len(texts)):
        row = cols[ptr[i] : ptr[i + 1]]
        assert (np.diff(row) > 0).all() and (row < emb.dim - 1).all()
        dense[i, row] = vals[ptr[i] : ptr[i + 1]]
    dense[:, -1] = base
    assert np.array_equal(dense, emb(texts).numpy())
    assert np.array_equal(dense, reference_embed(emb, texts).numpy())
    empty = emb.cells([])
    assert [len(a) for a in empty] == [1, 0, 0, 0]
    with pytest.raises(ValidationError, match="one str"):
        emb.cells("text")


def test_fitted_idf_matches_the_reference() -> None:
    corpus = FAST_TEXTS[:150] + FAST_TEXTS[:20]  # repeats count once per text
    idf, default = reference_idf(corpus)
    emb = HashingEmbedder(dim=128).fit(corpus)
    assert emb.idf == idf and emb._idf_default == default
    assert torch.equal(emb(FAST_TEXTS), reference_embed(emb, FAST_TEXTS))
    assert torch.equal(
        HashingEmbedder(dim=128, idf={"wcat": 0.5, "c守": 2.0})(FAST_TEXTS),
        reference_embed(HashingEmbedder(dim=128, idf={"wcat": 0.5, "c守": 2.0}), FAST_TEXTS),
    )


def test_tables_dropped_past_their_limits_and_stable_sort_fallback(monkeypatch) -> None:
    from soulmem_torch.embedding import hashing

    emb = HashingEmbedder(dim=64)
    want = reference_embed(emb, FAST_TEXTS)
    reg = hashing._REGISTRY
    monkeypatch.setattr(type(reg), "MAX_FEATURES", 10)
    generation = reg.generation
    assert torch.equal(emb(FAST_TEXTS[:50]), want[:50])
    assert torch.equal(emb(FAST_TEXTS), want)  # the next call starts from empty tables
    assert reg.generation > generation
    monkeypatch.setattr(hashing, "_SORT_KEY_LIMIT", 0)
    assert torch.equal(emb(FAST_TEXTS), want)


def test_threads_share_the_tables() -> None:
    emb = HashingEmbedder(dim=128)
    want = reference_embed(emb, FAST_TEXTS)
    parts = [FAST_TEXTS[i::4] for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(emb, parts))
    for i, x in enumerate(got):
        assert torch.equal(x, want[i::4])


def test_row_norms_replay_numpys_pairwise_sum() -> None:
    # the sparse row norms equal np.linalg.norm of the dense rows bit for bit (if a numpy
    # release changed its summation order, this names the cause before any vector differs)
    from soulmem_torch.embedding.hashing import _row_norms

    rng = np.random.default_rng(7)
    for length in [*range(1, 20), 63, 64, 65, 127, 128, 129, 136, 255, 256, 511, 512, 1023, 2047]:
        for density in (0.05, 0.3, 1.0):
            dense = np.zeros((40, length))
            mask = rng.random(dense.shape) < density
            dense[mask] = rng.standard_normal(mask.sum()) * np.exp(rng.uniform(-9, 9, mask.sum()))
            dense[0] = 0.0
            rows, cols = np.nonzero(dense)
            got = _row_norms(rows, cols, dense[rows, cols], 40, length)
            assert np.array_equal(got, np.linalg.norm(dense, axis=1)), (length, density)
