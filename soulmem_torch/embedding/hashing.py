"""``HashingEmbedder``: the built-in offline embedder (no download, Chinese and English).

How a text becomes a vector (all steps deterministic, independent of ``PYTHONHASHSEED``):

1. NFKC-normalize and case-fold; split into runs of CJK characters (Han, kana, Hangul) and runs
   of other letters / digits ("words"). Punctuation and spaces separate runs. English
   stopwords ("the", "I", "did", …: the text channel's list) are left out: in long English
   text they are most of the words and make every pair of texts look alike (docs/spec.md §3).
2. Two feature blocks:

   * **atoms** — each CJK character and each word. In Chinese the character is the unit of
     meaning that paraphrases share (夫君 / 丈夫, 肉身 / 身体), so it carries most of the signal.
   * **links** — CJK character bigrams inside a run (the words of the text) and, for words,
     their character trigrams with boundary marks (``<running>`` → ``<ru``, ``run``, …, the
     morphology) plus adjacent word pairs.

3. Each feature counts ``1 + ln(tf)`` (sublinear: repeating a word adds little), times an
   optional IDF fitted with :meth:`HashingEmbedder.fit`; it is added with a ``±1`` sign into one
   of the block's columns, both picked by a keyed BLAKE2b hash of the feature (the signed
   hashing trick: collisions cancel in expectation).
4. Each block is L2-normalized and weighted (atoms 1, links ``link_weight``), so a long text's
   many bigrams cannot drown its characters and the cosine is a fixed mix of the two levels.
5. A constant **baseline** component is appended and the vector normalized, so that for any two
   non-empty texts ``cos = baseline + (1 − baseline)·cos_lexical``. Dense sentence encoders
   (BGE, the original's model) give unrelated texts a cosine around 0.3–0.5, and the
   retrieval constants of SoulMem (similarity threshold 0.35, the string-channel blend
   ``max(emb, 0.6·emb + 0.4·str)``, the tag / variant blend) assume that scale: with raw
   lexical cosines (near 0 for unrelated text) a single shared character in an identifier
   would outweigh the embedding score. Text with no feature (empty, punctuation only) stays
   the zero vector (cosine 0 by definition).

Defaults: ``dim=1024`` (atoms 512, links 511, baseline 1), ``link_weight=0.5``,
``baseline=0.3``. On the original's ``congyu`` retrieval suite (64 sub-queries, MRR of the fused
similarity ranking) these defaults score 0.885 (0.88–0.92 over six different hash keys, mean
0.895), against 0.76 for a plain character-bigram TF-IDF; without the baseline the same
features score 0.85 (mean over keys), with ``dim=512`` 0.87 (more hash collisions), and a
fitted IDF changed nothing on that small corpus. Character trigrams and a general-corpus IDF
prior (jieba's) were tried and lowered the score.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError

__all__ = ["HashingEmbedder"]

_KEY = b"soulmem-hashing-v1"
# The text channel's English stopword list (soulmem_torch.retrieve.text.STOPWORDS), kept here so
# the embedding layer does not import the retrieve layer; a test holds the two equal.
_STOPWORDS: frozenset[str] = frozenset(
    """a about am an and any are as at be been being both but by can could d did do does doing
    down during each few for from further had has have having he her here hers herself him
    himself his how i if in into is it its itself just ll m ma me mightn more most my myself
    needn no nor not now o of off on once only or other our ours ourselves out own re s same
    shan she should so some such t than that the their theirs them themselves then there these
    they this those through to too under until up ve very was we were what when where which
    while who whom why will with would y you your yours yourself yourselves""".split()
)
_RUNS = re.compile(
    r"(?P<cjk>[\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
    r"\U00020000-\U0003134f]+)|(?P<word>[^\W_]+)"
)


_WORD_FEATURES: dict[str, tuple[str, tuple[str, ...]] | None] = {}
_SLOTS: dict[int, dict[str, tuple[int, float]]] = {}


def _word_features(word: str) -> tuple[str, tuple[str, ...]] | None:
    """``("w" + word, its boundary-marked trigram features)``, ``None`` for a stopword (cached:
    a chat history repeats its words)."""
    got = _WORD_FEATURES.get(word, False)
    if got is not False:
        return got  # type: ignore[return-value]
    if word in _STOPWORDS:
        out = None
    else:
        marked = f"<{word}>"
        out = ("w" + word, tuple("t" + marked[i : i + 3] for i in range(len(marked) - 2)))
    if len(_WORD_FEATURES) < 500_000:
        _WORD_FEATURES[word] = out
    return out


def _features(text: str) -> tuple[Counter[str], Counter[str]]:
    """(atoms, links) feature counts of one text."""
    norm = unicodedata.normalize("NFKC", text).casefold()
    atoms: list[str] = []
    links: list[str] = []
    prev_word: str | None = None
    for run, word in _RUNS.findall(norm):
        if run:
            prev_word = None
            atoms.extend(["c" + ch for ch in run])
            links.extend(["b" + run[i : i + 2] for i in range(len(run) - 1)])
            continue
        feats = _word_features(word)
        if feats is None:  # function words: in nearly every English text, they only
            continue  # flatten the cosines (a pair skips over them)
        atoms.append(feats[0])
        links.extend(feats[1])
        if prev_word is not None:
            links.append("p" + prev_word + " " + word)
        prev_word = word
    return Counter(atoms), Counter(links)


def _sum_into(cols: list[np.ndarray], vals: list[np.ndarray], n: int, size: int) -> np.ndarray:
    """``(n, size)`` float64: the values summed into their flat ``row · size + column`` bins."""
    if not cols:
        return np.zeros((n, size), dtype=np.float64)
    return np.bincount(
        np.concatenate(cols), weights=np.concatenate(vals), minlength=n * size
    ).reshape(n, size)


class HashingEmbedder:
    """Offline hashed character / word n-gram embedder (see the module docstring).

    Args:
        dim: >= 3. Output width ``D`` (one column for the baseline, the rest split between the
            atom and link blocks).
        link_weight: >= 0. Weight of the link block (bigrams / trigrams) against the atoms.
        baseline: in [0, 1). Cosine floor shared by any two non-empty texts.
        idf: optional ``{feature: weight}`` (as made by :meth:`fit`).

    Example:
        >>> emb = HashingEmbedder(dim=64)
        >>> x = emb(["守护穗织的剑灵", "剑灵守护穗织", "the night raid"])
        >>> x.shape, bool(x[0] @ x[1] > x[0] @ x[2])
        (torch.Size([3, 64]), True)
    """

    def __init__(
        self,
        dim: int = 1024,
        *,
        link_weight: float = 0.5,
        baseline: float = 0.3,
        idf: dict[str, float] | None = None,
    ) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 3:
            raise ValidationError(f"dim: expected an int >= 3, found {dim!r}")
        if not (isinstance(link_weight, (int, float)) and math.isfinite(link_weight)) or (
            link_weight < 0
        ):
            raise ValidationError(
                f"link_weight: expected a finite float >= 0, found {link_weight!r}"
            )
        if not (isinstance(baseline, (int, float)) and 0.0 <= baseline < 1.0):
            raise ValidationError(f"baseline: expected a float in [0, 1), found {baseline!r}")
        self.dim = dim
        self.link_weight = float(link_weight)
        self.baseline = float(baseline)
        rest = dim - 1
        self._atom_size = rest - rest // 2
        self._link_size = rest // 2
        self.idf: dict[str, float] | None = dict(idf) if idf is not None else None
        self._idf_default = 1.0
        if self.idf:
            self._idf_default = max(self.idf.values())
        # a feature's (column, sign) depends only on the width: one cache per width, shared by
        # every embedder of that width (a bank's agents, a loop of memories)
        self._slots = _SLOTS.setdefault(dim, {})

    def __repr__(self) -> str:
        fitted = f", fitted on {len(self.idf)} features" if self.idf else ""
        return (
            f"HashingEmbedder(dim={self.dim}, link_weight={self.link_weight}, "
            f"baseline={self.baseline}{fitted})"
        )

    # -- fitting --------------------------------------------------------------------------
    def fit(self, corpus: Iterable[str]) -> HashingEmbedder:
        """Fits a smoothed IDF ``ln((1 + n) / (1 + df)) + 1`` over ``corpus`` (one doc per text).

        Unseen features get the largest weight (``ln(1 + n) + 1``). Returns ``self``.
        Useful for large, homogeneous memories; the unfitted embedder needs no corpus.
        """
        df: Counter[str] = Counter()
        n = 0
        for text in corpus:
            if not isinstance(text, str):
                raise ValidationError(f"corpus: expected strings, found {type(text).__name__}")
            atoms, links = _features(text)
            df.update(set(atoms) | set(links))
            n += 1
        self.idf = {feat: math.log((1 + n) / (1 + c)) + 1.0 for feat, c in df.items()}
        self._idf_default = math.log(1 + n) + 1.0
        return self

    # -- hashing --------------------------------------------------------------------------
    def _slot(self, feature: str, size: int) -> tuple[int, float]:
        # Atom and link features never share a name (distinct prefixes), so one cache serves
        # both blocks.
        cached = self._slots.get(feature)
        if cached is not None:
            return cached
        digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8, key=_KEY).digest()
        value = int.from_bytes(digest, "little")
        slot = (value % size, -1.0 if value >> 63 else 1.0)
        if len(self._slots) < 1_000_000:
            self._slots[feature] = slot
        return slot

    def _block(self, counts: Counter[str], size: int) -> tuple[np.ndarray, np.ndarray]:
        """Columns and signed ``(1 + ln tf)·idf`` values of one text's features."""
        slots = self._slots
        found = list(map(slots.get, counts))
        if None in found:
            found = [f if f is not None else self._slot(k, size) for f, k in zip(found, counts)]
        if not found:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        cols, signs = zip(*found)
        weight = 1.0 + np.log(np.fromiter(counts.values(), dtype=np.float64, count=len(counts)))
        if self.idf is not None:
            idf, default = self.idf, self._idf_default
            weight *= np.fromiter(
                (idf.get(f, default) for f in counts), dtype=np.float64, count=len(counts)
            )
        return np.asarray(cols, dtype=np.int64), np.asarray(signs, dtype=np.float64) * weight

    # -- embedding ------------------------------------------------------------------------
    def __call__(self, texts: Sequence[str]) -> Tensor:
        """Embeds a batch: ``(len(texts), dim)`` float32, rows unit-norm or zero (no feature)."""
        if isinstance(texts, str):
            raise ValidationError("texts: expected a sequence of strings, found one str")
        n = len(texts)
        a_size, l_size = self._atom_size, self._link_size
        # every text's signed feature values, summed per (row, column) by one bincount per
        # block: bins add their values in input order, as an in-place add would row by row
        a_cols: list[np.ndarray] = []
        a_vals: list[np.ndarray] = []
        l_cols: list[np.ndarray] = []
        l_vals: list[np.ndarray] = []
        for row, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValidationError(f"texts[{row}]: expected a str, found {type(text).__name__}")
            atoms, links = _features(text)
            if atoms:
                cols, vals = self._block(atoms, a_size)
                a_cols.append(cols + row * a_size)
                a_vals.append(vals)
            if links:
                cols, vals = self._block(links, l_size)
                l_cols.append(cols + row * l_size)
                l_vals.append(vals)
        atoms_m = _sum_into(a_cols, a_vals, n, a_size)
        links_m = _sum_into(l_cols, l_vals, n, l_size)
        a_norm = np.linalg.norm(atoms_m, axis=1, keepdims=True)
        l_norm = np.linalg.norm(links_m, axis=1, keepdims=True)
        atoms_m = np.divide(atoms_m, a_norm, out=np.zeros_like(atoms_m), where=a_norm > 0)
        links_m = np.divide(links_m, l_norm, out=np.zeros_like(links_m), where=l_norm > 0)
        lexical = np.concatenate([atoms_m, self.link_weight * links_m], axis=1)
        lex_norm = np.linalg.norm(lexical, axis=1, keepdims=True)
        nonempty = lex_norm > 0
        lexical = np.divide(lexical, lex_norm, out=np.zeros_like(lexical), where=nonempty)
        out = np.concatenate(
            [math.sqrt(1.0 - self.baseline) * lexical, math.sqrt(self.baseline) * nonempty],
            axis=1,
        )
        return torch.from_numpy(out.astype(np.float32))
