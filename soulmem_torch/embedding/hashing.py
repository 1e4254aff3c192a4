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

How it is computed (the same numbers as the rules above, for a batch at a time): every
distinct text of a batch is tokenized in one C-level pass (ASCII texts by one byte-table
``translate`` and ``split``, the others by one NFKC / case fold / regex pass over the joined
texts); tokens map to cached ids in bulk, and a per-process registry holds each token's
feature ids and each feature's BLAKE2b value (hashed once per process). The feature streams of
all texts are then built with numpy (gathers, one vectorized pass for the word pairs), the
per-text counts found by one sort (each text's features keep their first-occurrence order, so
every column sums its values in the order the per-text definition adds them), and only the
non-zero cells are computed: each cell's sum in that order, each row norm as numpy's pairwise
sum of the dense row (:func:`_row_norms` replays it on the cells), the same divisions and
products. The vectors are bit for bit those of the text-by-text computation, which
``tests/embedding/test_hashing.py`` keeps as the reference. Python work per text is none; per
new token or feature, a registry entry. :meth:`HashingEmbedder.cells` hands out the non-zero
cells themselves (each text's columns and values, and its baseline): the note and query plans
(``embedding/_plan.py``) sum their fields from them, without the dense ``(texts, D)`` matrix.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import unicodedata
from collections.abc import Iterable, Sequence
from functools import cache
from itertools import repeat

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
_CJK = (
    r"\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
    r"\U00020000-\U0003134f"
)
# A run of CJK characters, a run of other letters / digits (which may go on into CJK
# characters: the alternation tries CJK first only where a run starts), or the separator that
# joins the texts of a batch.
_TOKENS = re.compile(rf"[{_CJK}]+|[^\W_]+|\x00")
_CJK_START = re.compile(rf"[{_CJK}]")
_SEP = "\x00"
# ASCII text: NFKC is the identity, the case fold is ``lower`` and the letter / digit runs are
# ``[a-z0-9]+``: one byte table lowers letters and blanks everything else (the separator kept).
_ASCII_TABLE = bytes(
    c + 32 if 65 <= c <= 90 else c if (97 <= c <= 122 or 48 <= c <= 57 or c == 0) else 32
    for c in range(256)
)
_SORT_KEY_LIMIT = 2**62
"""Above this ``texts · features · stream length``, :func:`_counts` sorts stably instead."""
_BLOCK_ROWS = 2048
"""Distinct texts per dense block (bounds the float64 work matrices to ~16 MB each)."""

_WORD, _STOP, _RUN, _SEPARATOR = 0, 1, 2, 3


class _Grow:
    """An append-only numpy array (amortized doubling)."""

    def __init__(self, dtype: type) -> None:
        self.data = np.zeros(1024, dtype=dtype)
        self.size = 0

    def extend(self, values: Sequence[int] | np.ndarray) -> None:
        values = np.asarray(values, dtype=self.data.dtype)
        end = self.size + len(values)
        if end > len(self.data):
            grown = np.zeros(max(end, 2 * len(self.data)), dtype=self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size : end] = values
        self.size = end

    def view(self) -> np.ndarray:
        return self.data[: self.size]


_HASH_BASE = hashlib.blake2b(digest_size=8, key=_KEY)


def _digest(feature: str) -> bytes:
    """``blake2b(feature, digest_size=8, key=_KEY)`` (a copy of the keyed state: no re-keying)."""
    h = _HASH_BASE.copy()
    h.update(feature.encode("utf-8"))
    return h.digest()


class _Registry:
    """Per-process token and feature tables (a chat history repeats its words).

    Tokens (a word, a CJK run, the separator) get ids; each token lists its atom and link
    feature ids (CSR); each feature keeps its name and its 64-bit keyed BLAKE2b value, from
    which a width's column (``value % size``) and sign (the top bit) follow. Word pairs are
    features keyed by their two token ids. The tables are dropped and rebuilt when they grow
    past their limits (ids are only used within one call).
    """

    MAX_TOKENS = 500_000
    MAX_FEATURES = 2_000_000
    MAX_ENTRIES = 8_000_000

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        self.vocab: dict[str, int] = {}
        self.tok_str: list[str] = []
        self.pair_head: list[str] = []  # each token's ``"p" + token + " "`` (its pairs' start)
        self.kind = _Grow(np.int8)
        self.atom_ptr = _Grow(np.int64)
        self.atom_len = _Grow(np.int64)
        self.atom_feat = _Grow(np.int64)
        self.link_ptr = _Grow(np.int64)
        self.link_len = _Grow(np.int64)
        self.link_feat = _Grow(np.int64)
        self.feat_id: dict[str, int] = {}
        self.feat_str: list[str] = []
        self.feat_hash = _Grow(np.uint64)
        # word pairs: their keys ``first << 32 | second`` (token ids) sorted, with feature ids
        self.pair_key = np.zeros(0, dtype=np.int64)
        self.pair_feat = np.zeros(0, dtype=np.int64)
        self._pending: list[str] = []
        self.generation = getattr(self, "generation", 0) + 1
        self._add_tokens([_SEP])

    def trim(self) -> None:
        """Drops the tables if they are past their limits (at the start of a call)."""
        if (
            len(self.tok_str) > self.MAX_TOKENS
            or len(self.feat_str) > self.MAX_FEATURES
            or self.atom_feat.size + self.link_feat.size > self.MAX_ENTRIES
        ):
            self.clear()

    # -- registration (Python per new token / feature only) -------------------------------
    def _features(self, names: list[str]) -> np.ndarray:
        """The ids of feature ``names`` (new ones registered, their hashes computed)."""
        ids = np.fromiter(map(self.feat_id.get, names, repeat(-1)), np.int64, len(names))
        missing = np.flatnonzero(ids < 0)
        if len(missing):
            new = list(dict.fromkeys(map(names.__getitem__, missing.tolist())))
            start = len(self.feat_str)
            self.feat_id.update(zip(new, range(start, start + len(new))))
            self.feat_str.extend(new)
            self._pending.extend(new)
            ids[missing] = np.fromiter(
                map(self.feat_id.__getitem__, map(names.__getitem__, missing.tolist())),
                np.int64,
                len(missing),
            )
        return ids

    def _flush_hashes(self) -> None:
        if self._pending:
            digests = b"".join(map(_digest, self._pending))
            self.feat_hash.extend(np.frombuffer(digests, dtype="<u8"))
            self._pending = []

    def _add_tokens(self, tokens: list[str]) -> None:
        kinds: list[int] = []
        atoms: list[str] = []
        links: list[str] = []
        a_len: list[int] = []
        l_len: list[int] = []
        for tok in tokens:
            if tok == _SEP or tok in _STOPWORDS:
                kinds.append(_SEPARATOR if tok == _SEP else _STOP)
                a_len.append(0)
                l_len.append(0)
            elif _CJK_START.match(tok):  # a CJK run: its characters, its bigrams
                kinds.append(_RUN)
                atoms.extend(["c" + ch for ch in tok])
                links.extend(["b" + tok[i : i + 2] for i in range(len(tok) - 1)])
                a_len.append(len(tok))
                l_len.append(len(tok) - 1)
            else:  # a word: itself, its boundary-marked character trigrams
                kinds.append(_WORD)
                atoms.append("w" + tok)
                marked = f"<{tok}>"
                links.extend(["t" + marked[i : i + 3] for i in range(len(tok))])
                a_len.append(1)
                l_len.append(len(tok))
        start = len(self.tok_str)
        self.vocab.update(zip(tokens, range(start, start + len(tokens))))
        self.tok_str.extend(tokens)
        self.pair_head.extend([f"p{tok} " for tok in tokens])
        self.kind.extend(kinds)
        a_len_arr = np.asarray(a_len, dtype=np.int64)
        l_len_arr = np.asarray(l_len, dtype=np.int64)
        self.atom_ptr.extend(self.atom_feat.size + np.cumsum(a_len_arr) - a_len_arr)
        self.link_ptr.extend(self.link_feat.size + np.cumsum(l_len_arr) - l_len_arr)
        self.atom_len.extend(a_len_arr)
        self.link_len.extend(l_len_arr)
        self.atom_feat.extend(self._features(atoms))
        self.link_feat.extend(self._features(links))
        self._flush_hashes()

    def token_ids(self, tokens: list[str]) -> np.ndarray:
        """The ids of ``tokens`` (new ones registered), int64: one lookup pass."""
        ids = np.fromiter(map(self.vocab.get, tokens, repeat(-1)), np.int64, len(tokens))
        missing = np.flatnonzero(ids < 0)
        if len(missing):
            # in their first-occurrence order (ids independent of the string hash seed)
            new = list(dict.fromkeys(map(tokens.__getitem__, missing.tolist())))
            self._add_tokens(new)
            ids[missing] = np.fromiter(
                map(self.vocab.__getitem__, map(tokens.__getitem__, missing.tolist())),
                np.int64,
                len(missing),
            )
        return ids

    def pair_ids(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """The feature ids of the word pairs ``"p" + first + " " + second`` (token ids), new
        ones registered: one sorted lookup for the distinct pairs of the call."""
        keys, inverse = np.unique((first << 32) | second, return_inverse=True)
        at = np.searchsorted(self.pair_key, keys)
        known = at < len(self.pair_key)
        known[known] = self.pair_key[at[known]] == keys[known]
        out = np.empty(len(keys), dtype=np.int64)
        out[known] = self.pair_feat[at[known]]
        new = keys[~known]
        if len(new):
            head, word = self.pair_head.__getitem__, self.tok_str.__getitem__
            names = list(
                map(
                    str.__add__,
                    map(head, (new >> 32).tolist()),
                    map(word, (new & 0xFFFFFFFF).tolist()),
                )
            )
            start = len(self.feat_str)
            fids = np.arange(start, start + len(new), dtype=np.int64)
            self.feat_str.extend(names)
            self._pending.extend(names)
            self._flush_hashes()
            out[~known] = fids
            self.pair_key = np.insert(self.pair_key, at[~known], new)
            self.pair_feat = np.insert(self.pair_feat, at[~known], fids)
        return out[inverse.reshape(-1)]


_REGISTRY = _Registry()


def _gather(ptr: np.ndarray, length: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The concatenation of ``values[ptr[i] : ptr[i] + length[i]]`` over ``i``."""
    total = int(length.sum())
    if total == 0:
        return np.zeros(0, dtype=values.dtype)
    ends = np.cumsum(length)
    offset = np.repeat(ptr - (ends - length), length)
    return values[offset + np.arange(total, dtype=np.int64)]


def _tokenize(reg: _Registry, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(token ids, row of each token)`` of ``texts`` in reading order, separators dropped."""
    if not texts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ascii_mask = np.fromiter(map(str.isascii, texts), bool, len(texts))
    ids_parts: list[np.ndarray] = []
    row_parts: list[np.ndarray] = []
    for is_ascii in (True, False):
        rows = np.flatnonzero(ascii_mask == is_ascii)
        if not len(rows):
            continue
        group = [texts[i] for i in rows.tolist()]
        joined = (" \x00 " if is_ascii else _SEP).join(group)
        if joined.count(_SEP) != len(group) - 1:
            # a text holds the separator itself (NUL separates runs like any punctuation):
            # those texts are read one by one
            alone = [k for k, t in enumerate(group) if _SEP in t]
            for k in alone:  # (the regex reads NUL as a token of its own: dropped)
                ids = _group_ids(reg, group[k], is_ascii=False)
                ids = ids[ids != 0]
                ids_parts.append(ids)
                row_parts.append(np.full(len(ids), rows[k], dtype=np.int64))
            keep = np.ones(len(group), dtype=bool)
            keep[alone] = False
            rows = rows[keep]
            group = [t for t, k in zip(group, keep.tolist()) if k]
            if not group:
                continue
            joined = (" \x00 " if is_ascii else _SEP).join(group)
        ids = _group_ids(reg, joined, is_ascii)
        sep = ids == 0
        local = np.cumsum(sep)
        keep_tok = ~sep
        ids_parts.append(ids[keep_tok])
        row_parts.append(rows[local[keep_tok]])
    return np.concatenate(ids_parts), np.concatenate(row_parts)


def _group_ids(reg: _Registry, joined: str, is_ascii: bool) -> np.ndarray:
    if is_ascii:
        tokens = joined.encode("ascii").translate(_ASCII_TABLE).decode("ascii").split()
    else:
        tokens = _TOKENS.findall(unicodedata.normalize("NFKC", joined).casefold())
    return reg.token_ids(tokens)


def _streams(
    reg: _Registry, ids: np.ndarray, rows: np.ndarray
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The atom and link feature streams ``(feature ids, rows)`` in each text's reading order:
    atoms — each token's; links — each token's, then (for a word) its pair with the previous
    word of the text, stopwords skipped, a CJK run in between breaking the pair."""
    kind = reg.kind.view()[ids]
    a_len = reg.atom_len.view()[ids]
    atoms = _gather(reg.atom_ptr.view()[ids], a_len, reg.atom_feat.view())
    a_rows = np.repeat(rows, a_len)
    # the pairs: over the tokens that are not stopwords, a word right after a word of its text
    content = np.flatnonzero(kind != _STOP)
    c_kind = kind[content]
    c_rows = rows[content]
    paired = np.zeros(len(content), dtype=bool)
    paired[1:] = (c_kind[1:] == _WORD) & (c_kind[:-1] == _WORD) & (c_rows[1:] == c_rows[:-1])
    at = np.flatnonzero(paired)
    has_pair = np.zeros(len(ids), dtype=np.int64)
    pair_tok = content[at]
    has_pair[pair_tok] = 1
    l_len = reg.link_len.view()[ids]
    links = _gather(reg.link_ptr.view()[ids], l_len, reg.link_feat.view())
    if len(at):  # each pair right after its word's own links
        links = np.insert(
            links,
            np.cumsum(l_len)[pair_tok],
            reg.pair_ids(ids[content[at - 1]], ids[pair_tok]),
        )
    l_rows = np.repeat(rows, l_len + has_pair)
    return (atoms, a_rows), (links, l_rows)


def _counts(feats: np.ndarray, rows: np.ndarray, num_features: int) -> tuple[np.ndarray, ...]:
    """Each text's distinct features with their counts, in first-occurrence order (the order
    of a ``Counter`` of the text): ``(features, rows, counts)``."""
    n = len(feats)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    key = rows * num_features + feats
    count_at = np.zeros(n, dtype=np.int64)
    if (int(rows.max()) + 1) * num_features * n < _SORT_KEY_LIMIT:
        # (text, feature, position) keys are distinct: a plain sort puts each text's feature
        # group in order with its first occurrence at the head
        key = np.sort(key * n + np.arange(n, dtype=np.int64))
        group = key // n
        starts = np.flatnonzero(np.concatenate(([True], group[1:] != group[:-1])))
        count_at[key[starts] % n] = np.diff(np.append(starts, n))
    else:  # (huge texts) a stable sort does the same
        order = np.argsort(key, kind="stable")
        ordered = key[order]
        starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
        count_at[order[starts]] = np.diff(np.append(starts, n))
    first = count_at > 0
    return feats[first], rows[first], count_at[first]


def _cells(
    rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, size: int
) -> tuple[np.ndarray, ...]:
    """The non-zero cells of the ``(texts, size)`` block: ``(rows, cols, sums)`` in row, column
    order, each cell's values summed in their input order (as a dense ``bincount`` adds them)."""
    m = len(rows)
    if m == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0, dtype=np.float64)
    # (cell, position) keys are distinct: a plain sort groups each cell in input order
    key = np.sort((rows * size + cols) * m + np.arange(m, dtype=np.int64))
    cell = key // m
    head = np.concatenate(([True], cell[1:] != cell[:-1]))
    sums = np.bincount(np.cumsum(head) - 1, weights=vals[key % m])
    first = cell[head]
    return first // size, first % size, sums


@cache
def _pairwise_plan(length: int) -> tuple[np.ndarray, int, tuple]:
    """numpy's pairwise summation of a row of ``length`` values (``add.reduce``, float64) as
    accumulator slots: ``(slot of each column, slot count, the summation tree)``.

    numpy sums fewer than 8 values in order; up to 128 values in 8 interleaved accumulators
    (lane ``i % 8``) combined as ``((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))``, then the
    remainder in order; longer rows as two halves (the first a multiple of 8 long), added.
    """
    slot_of = np.empty(length, dtype=np.int64)
    count = 0

    def slots(k: int) -> tuple[int, ...]:
        nonlocal count
        count += k
        return tuple(range(count - k, count))

    def build(start: int, n: int) -> tuple:
        if n < 8:
            seq = slots(n)
            slot_of[start : start + n] = seq
            return ("seq", seq)
        if n <= 128:
            lanes = slots(8)
            body = n - n % 8
            slot_of[start : start + body] = np.tile(lanes, body // 8)
            tail = slots(n - body)
            slot_of[start + body : start + n] = tail
            return ("lanes", lanes, tail)
        half = n // 2 - (n // 2) % 8
        return ("add", build(start, half), build(start + half, n - half))

    tree = build(0, length)
    return slot_of, count, tree


def _replay(tree: tuple, acc: np.ndarray) -> np.ndarray:
    if tree[0] == "add":
        return _replay(tree[1], acc) + _replay(tree[2], acc)
    if tree[0] == "seq":
        res = acc[:, tree[1][0]]
        for s in tree[1][1:]:
            res = res + acc[:, s]
        return res
    r = [acc[:, s] for s in tree[1]]
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    for s in tree[2]:
        res = res + acc[:, s]
    return res


def _row_norms(
    rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n: int, length: int
) -> np.ndarray:
    """``np.linalg.norm(dense, axis=1)`` of the ``(n, length)`` matrix holding ``vals`` at
    ``(rows, cols)`` (distinct cells in row, column order) and zeros elsewhere, bit for bit:
    each accumulator of numpy's pairwise sum adds its cells' squares in column order (adding
    the zeros in between changes nothing), then the accumulators are combined as numpy does."""
    slot_of, count, tree = _pairwise_plan(length)
    acc = np.bincount(
        rows * count + slot_of[cols], weights=vals * vals, minlength=n * count
    ).reshape(n, count)
    return np.sqrt(_replay(tree, acc))


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
        texts = list(corpus)
        for text in texts:
            if not isinstance(text, str):
                raise ValidationError(f"corpus: expected strings, found {type(text).__name__}")
        reg = _REGISTRY
        df: dict[str, int] = {}
        with reg.lock:
            reg.trim()
            for start in range(0, len(texts), _BLOCK_ROWS):
                ids, rows = _tokenize(reg, texts[start : start + _BLOCK_ROWS])
                for feats, frows in _streams(reg, ids, rows):
                    distinct, _, _ = _counts(feats, frows, len(reg.feat_str))
                    per_feature = np.bincount(distinct, minlength=len(reg.feat_str))
                    for f in np.flatnonzero(per_feature).tolist():
                        name = reg.feat_str[f]
                        df[name] = df.get(name, 0) + int(per_feature[f])
        n = len(texts)
        self.idf = {feat: math.log((1 + n) / (1 + c)) + 1.0 for feat, c in df.items()}
        self._idf_default = math.log(1 + n) + 1.0
        return self

    # -- embedding ------------------------------------------------------------------------
    def __call__(self, texts: Sequence[str]) -> Tensor:
        """Embeds a batch: ``(len(texts), dim)`` float32, rows unit-norm or zero (no feature)."""
        ptr, cols, vals, base = self.cells(texts)
        n = len(ptr) - 1
        out = np.zeros((n, self.dim), dtype=np.float32)
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))
        out.reshape(-1)[rows * self.dim + cols] = vals
        out[:, -1] = base
        return torch.from_numpy(out)

    def cells(self, texts: Sequence[str]) -> tuple[np.ndarray, ...]:
        """The non-zero values of ``self(texts)`` without the dense matrix: ``(ptr, cols,
        vals, base)`` — text ``i``'s lexical cells are ``cols[ptr[i]:ptr[i + 1]]`` (int64, in
        column order, all below ``dim - 1``) with their float32 ``vals``, and ``base[i]`` (float32)
        is its last column, the baseline (0 for a text without features). The same values, bit
        for bit, as the rows of ``self(texts)``."""
        if isinstance(texts, str):
            raise ValidationError("texts: expected a sequence of strings, found one str")
        texts = list(texts)
        if not all(map(str.__instancecheck__, texts)):
            row = next(i for i, t in enumerate(texts) if not isinstance(t, str))
            raise ValidationError(
                f"texts[{row}]: expected a str, found {type(texts[row]).__name__}"
            )
        distinct = list(dict.fromkeys(texts))  # (times, speakers, empty fields repeat)
        parts = []
        reg = _REGISTRY
        with reg.lock:
            reg.trim()
            for start in range(0, len(distinct), _BLOCK_ROWS):
                parts.append(self._block(reg, distinct[start : start + _BLOCK_ROWS]))
        if parts:
            counts = np.concatenate([c for c, _, _, _ in parts])
            cols = np.concatenate([c for _, c, _, _ in parts])
            vals = np.concatenate([v for _, _, v, _ in parts])
            base = np.concatenate([b for _, _, _, b in parts])
        else:
            counts = cols = np.zeros(0, dtype=np.int64)
            vals = base = np.zeros(0, dtype=np.float32)
        if len(distinct) < len(texts):  # each text's row of the distinct ones
            position = dict(zip(distinct, range(len(distinct))))
            which = np.fromiter(map(position.__getitem__, texts), np.int64, len(texts))
            start = np.cumsum(counts) - counts
            at = _gather(start[which], counts[which], np.arange(len(cols), dtype=np.int64))
            counts, cols, vals, base = counts[which], cols[at], vals[at], base[which]
        ptr = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        return ptr, cols, vals, base

    def _values(
        self, reg: _Registry, feats: np.ndarray, counts: np.ndarray, size: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Columns and signed ``(1 + ln tf)·idf`` values of the features."""
        value = reg.feat_hash.view()[feats]
        cols = (value % np.uint64(size)).astype(np.int64)
        signs = np.where(value >> np.uint64(63), -1.0, 1.0)
        weight = 1.0 + np.log(counts.astype(np.float64))
        if self.idf is not None:
            idf, default, names = self.idf, self._idf_default, reg.feat_str
            weight *= np.fromiter(
                (idf.get(names[f], default) for f in feats.tolist()),
                dtype=np.float64,
                count=len(feats),
            )
        return cols, signs * weight

    def _block(self, reg: _Registry, texts: list[str]) -> tuple[np.ndarray, ...]:
        """The cells of distinct ``texts``: ``(cells per text, cols, float32 vals, float32
        baseline per text)``, each text's cells in column order.

        Only the non-zero cells are computed, each with the roundings of the dense definition:
        a cell sums its values in stream order (as the dense ``bincount``), each row norm is
        numpy's pairwise sum of the dense row replayed on its cells (:func:`_row_norms`), and
        the divisions and products are the same elementwise operations."""
        n = len(texts)
        ids, rows = _tokenize(reg, texts)
        cells = []
        for (feats, frows), size in zip(
            _streams(reg, ids, rows), (self._atom_size, self._link_size)
        ):
            f, r, c = _counts(feats, frows, len(reg.feat_str))
            cols, vals = self._values(reg, f, c, size)
            b_rows, b_cols, sums = _cells(r, cols, vals, size)
            norm = _row_norms(b_rows, b_cols, sums, n, size)
            cells.append((b_rows, b_cols, sums / np.where(norm > 0, norm, 1.0)[b_rows]))
        (a_rows, a_cols, a_vals), (l_rows, l_cols, l_vals) = cells
        # the lexical row: atoms, then the links times link_weight (cells in row, column order)
        order = np.argsort(np.concatenate([a_rows, l_rows]), kind="stable")
        lex_rows = np.concatenate([a_rows, l_rows])[order]
        lex_cols = np.concatenate([a_cols, l_cols + self._atom_size])[order]
        lex_vals = np.concatenate([a_vals, l_vals * self.link_weight])[order]
        lex_norm = _row_norms(lex_rows, lex_cols, lex_vals, n, self.dim - 1)
        nonempty = lex_norm > 0
        final = (
            lex_vals / np.where(nonempty, lex_norm, 1.0)[lex_rows] * math.sqrt(1.0 - self.baseline)
        )
        base = (math.sqrt(self.baseline) * nonempty).astype(np.float32)
        return np.bincount(lex_rows, minlength=n), lex_cols, final.astype(np.float32), base
