"""The string channel (docs/spec.md §4): exact-identifier string similarity, batched.

``sds(a, b)`` = 1 if both are empty, 0 if one is, else
``max(JaroWinkler(a, b), 1 − Levenshtein(a, b) / max_len)`` over Unicode characters (code
points, like Rust's ``chars()``), each cast to float32 as the original does. Jaro's match window
is ``max(len) // 2 − 1`` (0 for strings of up to 3 characters: only same-position matches), the
Winkler bonus is 0.1 per common-prefix character, up to 4, applied only when Jaro > 0.7.

The batched path uses rapidfuzz's ``JaroWinkler.similarity`` and
``Levenshtein.normalized_similarity`` (C++, ``process.cdist``), which were checked against the
pure-Python reference implementations below (:func:`jaro_winkler_similarity`,
:func:`normalized_levenshtein_similarity`) on CJK, Latin, mixed and astral-plane strings of
length 0–150, including short CJK strings with window 0; they agree to the last bit. The
reference functions stay for tests and as a fallback.

Which strings are compared (the original's ``compute_note_string_score_weighted``):

* Semantic note vs Semantic query: max over units with a concept identifier of
  ``max(sds(id, content), sds(id, alias) for each alias)``.
* AbstractSituation note vs Situation query: Location → max over query locations of
  ``sds(names)``; Participant → max over named query participants of ``sds(names)``;
  Environment → max over units with an atmosphere of ``sds(atmospheres)``; Event → per query
  event ``sds`` of action / initiator / target combined 0.3/0.3/0.4 (both), 0.4/0.6 (one),
  action alone (none); max over events.
* Everything else → 0.

:class:`IdentifierIndex` (built once per set of notes) and :class:`QueryIdentifiers` (one per
query) are plain data; :func:`string_channel_scores` computes every distinct
(query string, identifier string) pair once and max-pools into a ``(B, N)`` tensor.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "IdentifierColumns",
    "IdentifierIndex",
    "QueryIdentifiers",
    "jaro_similarity",
    "jaro_winkler_similarity",
    "normalized_levenshtein_similarity",
    "string_channel_scores",
    "string_channel_scores_segments",
    "string_distance_matrix",
    "string_distance_score",
    "string_distance_score_reference",
]


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


# -------------------------------------------------------------------------------------------
# reference implementations (pure Python, the docs/spec.md definition)
# -------------------------------------------------------------------------------------------
def jaro_similarity(a: str, b: str) -> float:
    """Jaro similarity on code points; window ``max(len) // 2 − 1`` (at least 0)."""
    la, lb = len(a), len(b)
    if la == 0 and lb == 0:
        return 1.0
    if la == 0 or lb == 0:
        return 0.0
    window = max(max(la, lb) // 2 - 1, 0)
    a_hit = [False] * la
    b_hit = [False] * lb
    matches = 0
    for i, ch in enumerate(a):
        for j in range(max(0, i - window), min(lb, i + window + 1)):
            if not b_hit[j] and b[j] == ch:
                a_hit[i] = b_hit[j] = True
                matches += 1
                break
    if matches == 0:
        return 0.0
    transpositions = 0
    j = 0
    for i in range(la):
        if a_hit[i]:
            while not b_hit[j]:
                j += 1
            if a[i] != b[j]:
                transpositions += 1
            j += 1
    transpositions //= 2
    return (matches / la + matches / lb + (matches - transpositions) / matches) / 3.0


def jaro_winkler_similarity(a: str, b: str) -> float:
    """Jaro-Winkler: ``jaro + 0.1·prefix·(1 − jaro)`` (prefix ≤ 4) when ``jaro > 0.7``."""
    sim = jaro_similarity(a, b)
    if sim > 0.7:
        prefix = 0
        for x, y in zip(a[:4], b[:4]):
            if x != y:
                break
            prefix += 1
        sim += 0.1 * prefix * (1.0 - sim)
    return sim


def normalized_levenshtein_similarity(a: str, b: str) -> float:
    """``1 − levenshtein(a, b) / max(len(a), len(b))``; 1.0 for two empty strings."""
    la, lb = len(a), len(b)
    if max(la, lb) == 0:
        return 1.0
    prev = list(range(lb + 1))
    for i in range(1, la + 1):
        cur = [i] + [0] * lb
        ca = a[i - 1]
        for j in range(1, lb + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != b[j - 1]))
        prev = cur
    return 1.0 - prev[lb] / max(la, lb)


def string_distance_score_reference(a: str, b: str) -> float:
    """``sds(a, b)`` from the reference implementations (float32 semantics)."""
    if not a and not b:
        return 1.0
    if not a or not b:
        return 0.0
    return max(_f32(jaro_winkler_similarity(a, b)), _f32(normalized_levenshtein_similarity(a, b)))


# -------------------------------------------------------------------------------------------
# fast path (rapidfuzz)
# -------------------------------------------------------------------------------------------
def string_distance_score(a: str, b: str) -> float:
    """``sds(a, b)`` (rapidfuzz), a float32 value returned as a Python float."""
    from rapidfuzz.distance import JaroWinkler, Levenshtein

    if not a and not b:
        return 1.0
    if not a or not b:
        return 0.0
    return max(_f32(JaroWinkler.similarity(a, b)), _f32(Levenshtein.normalized_similarity(a, b)))


def string_distance_matrix(queries: Sequence[str], choices: Sequence[str]) -> np.ndarray:
    """``sds`` of every query string against every choice: shape (Q, C), float32."""
    q, c = len(queries), len(choices)
    if q == 0 or c == 0:
        return np.zeros((q, c), dtype=np.float32)
    from rapidfuzz import process
    from rapidfuzz.distance import JaroWinkler, Levenshtein

    jw = process.cdist(queries, choices, scorer=JaroWinkler.similarity, dtype=np.float64)
    lev = process.cdist(
        queries, choices, scorer=Levenshtein.normalized_similarity, dtype=np.float64
    )
    out = np.maximum(jw.astype(np.float32), lev.astype(np.float32))
    q_empty = np.array([len(s) == 0 for s in queries])
    c_empty = np.array([len(s) == 0 for s in choices])
    out[q_empty[:, None] ^ c_empty[None, :]] = 0.0
    out[q_empty[:, None] & c_empty[None, :]] = 1.0
    return out


# -------------------------------------------------------------------------------------------
# identifier index and batched scores
# -------------------------------------------------------------------------------------------
class _Strings:
    """A list of distinct strings with their positions."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self._pos: dict[str, int] = {}

    def __call__(self, s: str) -> int:
        pos = self._pos.get(s)
        if pos is None:
            pos = len(self.items)
            self._pos[s] = pos
            self.items.append(s)
        return pos


@dataclass
class _Members:
    """Which (note, string) pairs an identifier kind has."""

    strings: _Strings = field(default_factory=_Strings)
    notes: list[int] = field(default_factory=list)
    refs: list[int] = field(default_factory=list)

    def add(self, note: int, s: str) -> None:
        self.notes.append(note)
        self.refs.append(self.strings(s))


@dataclass
class IdentifierIndex:
    """The exact identifiers of N notes, grouped by kind (build with :meth:`add_*`).

    ``semantic``: content and aliases of Semantic notes; ``location`` / ``participant`` /
    ``environment``: the name / name / atmosphere of AbstractSituation leaves; ``events``:
    ``(note, action, initiator, target)`` of abstract Event leaves.
    """

    num_nodes: int = 0
    semantic: _Members = field(default_factory=_Members)
    location: _Members = field(default_factory=_Members)
    participant: _Members = field(default_factory=_Members)
    environment: _Members = field(default_factory=_Members)
    event_strings: _Strings = field(default_factory=_Strings)
    event_notes: list[int] = field(default_factory=list)
    event_refs: list[tuple[int, int, int]] = field(default_factory=list)

    def add_semantic(self, note: int, content: str, aliases: Sequence[str]) -> None:
        self.semantic.add(note, content)
        for alias in aliases:
            self.semantic.add(note, alias)

    def add_location(self, note: int, name: str) -> None:
        self.location.add(note, name)

    def add_participant(self, note: int, name: str) -> None:
        self.participant.add(note, name)

    def add_environment(self, note: int, atmosphere: str) -> None:
        self.environment.add(note, atmosphere)

    def add_event(self, note: int, action: str, initiator: str, target: str) -> None:
        s = self.event_strings
        self.event_notes.append(note)
        self.event_refs.append((s(action), s(initiator), s(target)))


@dataclass
class QueryIdentifiers:
    """The exact identifiers of one query.

    ``semantic``: True for a Semantic query. ``concepts``: identifiers of its units that have
    one; ``locations`` / ``participants`` / ``atmospheres``: location names, named participants'
    names and atmospheres over all units; ``events``: ``(action, initiator?, target?)`` over
    all units.
    """

    semantic: bool
    concepts: list[str] = field(default_factory=list)
    locations: list[str] = field(default_factory=list)
    participants: list[str] = field(default_factory=list)
    atmospheres: list[str] = field(default_factory=list)
    events: list[tuple[str, str | None, str | None]] = field(default_factory=list)


def _pool_kind(
    out: Tensor,
    members: _Members,
    per_query: Sequence[Sequence[str]],
) -> None:
    """out[b, note] = max(out, max over the query's strings q and the note's strings s of sds)."""
    if not members.notes:
        return
    rows = _Strings()
    pairs_q: list[int] = []
    pairs_r: list[int] = []
    for b, strings in enumerate(per_query):
        for s in strings:
            pairs_q.append(b)
            pairs_r.append(rows(s))
    if not pairs_q:
        return
    device = out.device
    sds = torch.from_numpy(string_distance_matrix(rows.items, members.strings.items)).to(device)
    bsz = out.shape[0]
    # best score of each query against each identifier string: (B, S)
    per_string = torch.zeros(bsz, sds.shape[1], dtype=torch.float32, device=device)
    q_idx = torch.tensor(pairs_q, dtype=torch.long, device=device)
    r_idx = torch.tensor(pairs_r, dtype=torch.long, device=device)
    src = sds[r_idx]
    per_string.scatter_reduce_(0, q_idx.unsqueeze(1).expand_as(src), src, "amax")
    # best over each note's strings: (B, N)
    notes = torch.tensor(members.notes, dtype=torch.long, device=device)
    refs = torch.tensor(members.refs, dtype=torch.long, device=device)
    src = per_string[:, refs]
    out.scatter_reduce_(1, notes.unsqueeze(0).expand_as(src), src, "amax")


def string_channel_scores(
    index: IdentifierIndex,
    queries: Sequence[QueryIdentifiers],
    *,
    event_weights: tuple[float, float, float, float, float] = (0.3, 0.3, 0.4, 0.6, 0.6),
    device: torch.device | str | None = None,
) -> Tensor:
    """String-channel scores of B queries against the N indexed notes: (B, N), float32.

    Args:
        index: the notes' identifiers.
        queries: one :class:`QueryIdentifiers` per query.
        event_weights: ``(initiator, target, action, initiator_only_action,
            target_only_action)`` — the ``sit_event_*`` blend weights.
        device: ``None`` → CPU.

    Returns:
        shape (B, N); 0 where the channel does not apply.
    """
    dev = torch.device("cpu") if device is None else torch.device(device)
    bsz = len(queries)
    out = torch.zeros(bsz, index.num_nodes, dtype=torch.float32, device=dev)
    if bsz == 0 or index.num_nodes == 0:
        return out
    sem = [q.concepts if q.semantic else [] for q in queries]
    _pool_kind(out, index.semantic, sem)
    sit = [not q.semantic for q in queries]
    _pool_kind(out, index.location, [q.locations if s else [] for q, s in zip(queries, sit)])
    _pool_kind(out, index.participant, [q.participants if s else [] for q, s in zip(queries, sit)])
    _pool_kind(out, index.environment, [q.atmospheres if s else [] for q, s in zip(queries, sit)])
    _event_scores(out, index, queries, sit, event_weights)
    return out


def _event_scores(
    out: Tensor,
    index: IdentifierIndex,
    queries: Sequence[QueryIdentifiers],
    sit: Sequence[bool],
    weights: tuple[float, float, float, float, float],
) -> None:
    if not index.event_notes:
        return
    rows = _Strings()
    ev_query: list[int] = []
    ev_refs: list[tuple[int, int, int]] = []
    ev_has: list[tuple[bool, bool]] = []
    for b, (q, s) in enumerate(zip(queries, sit)):
        if not s:
            continue
        for action, initiator, target in q.events:
            ev_query.append(b)
            ev_refs.append((rows(action), rows(initiator or ""), rows(target or "")))
            ev_has.append((initiator is not None, target is not None))
    if not ev_query:
        return
    device = out.device
    sds = torch.from_numpy(string_distance_matrix(rows.items, index.event_strings.items)).to(device)
    q_refs = torch.tensor(ev_refs, dtype=torch.long, device=device)  # (E, 3)
    n_refs = torch.tensor(index.event_refs, dtype=torch.long, device=device)  # (M, 3)
    has = torch.tensor(ev_has, dtype=torch.bool, device=device)  # (E, 2)
    action = sds[q_refs[:, 0].unsqueeze(1), n_refs[:, 0].unsqueeze(0)]  # (E, M)
    initiator = sds[q_refs[:, 1].unsqueeze(1), n_refs[:, 1].unsqueeze(0)]
    target = sds[q_refs[:, 2].unsqueeze(1), n_refs[:, 2].unsqueeze(0)]
    score = _event_blend(action, initiator, target, has[:, :1], has[:, 1:], weights)
    per_note = torch.zeros(out.shape[0], score.shape[1], dtype=torch.float32, device=device)
    q_idx = torch.tensor(ev_query, dtype=torch.long, device=device)
    per_note.scatter_reduce_(0, q_idx.unsqueeze(1).expand_as(score), score, "amax")
    notes = torch.tensor(index.event_notes, dtype=torch.long, device=device)
    out.scatter_reduce_(1, notes.unsqueeze(0).expand_as(per_note), per_note, "amax")


def _event_blend(
    action: Tensor,
    initiator: Tensor,
    target: Tensor,
    has_initiator: Tensor,
    has_target: Tensor,
    weights: tuple[float, float, float, float, float],
) -> Tensor:
    """An event leaf's score from the ``sds`` of its action, initiator and target (float32;
    the ``has_*`` masks broadcast against them: which parts the query's event names)."""
    initiator = torch.where(has_initiator, initiator, 0.0)
    target = torch.where(has_target, target, 0.0)
    w_i, w_t, w_a, a_i, a_t = (_f32(w) for w in weights)
    both = w_i * initiator + w_t * target + w_a * action
    only_i = _f32(1.0 - a_i) * initiator + a_i * action
    only_t = _f32(1.0 - a_t) * target + a_t * action
    return torch.where(
        has_initiator & has_target,
        both,
        torch.where(has_initiator, only_i, torch.where(has_target, only_t, action)),
    )


# -------------------------------------------------------------------------------------------
# many indexes at once: each query against its own index (the bank's segments)
# -------------------------------------------------------------------------------------------
_KINDS = ("semantic", "location", "participant", "environment")


@dataclass(frozen=True)
class IdentifierColumns:
    """One :class:`IdentifierIndex` as flat arrays (see :meth:`of`): per kind, the member
    strings (an object array, in member order), whether each is empty, and its note; for
    events, the ``(action, initiator, target)`` strings of each event leaf, their emptiness
    and its note. Concatenating several agents' columns is a few ``numpy`` calls."""

    strings: dict[str, np.ndarray]
    empty: dict[str, np.ndarray]
    notes: dict[str, np.ndarray]
    event_strings: np.ndarray  # (E, 3) object
    event_empty: np.ndarray  # (E, 3) bool
    event_notes: np.ndarray  # (E,) int64

    @classmethod
    def of(cls, index: IdentifierIndex) -> IdentifierColumns:
        strings, empty, notes = {}, {}, {}
        for kind in _KINDS:
            members: _Members = getattr(index, kind)
            refs = np.asarray(members.refs, dtype=np.int64)
            strings[kind] = _objects(members.strings.items)[refs]
            empty[kind] = _empties(members.strings.items)[refs]
            notes[kind] = np.asarray(members.notes, dtype=np.int64)
        refs = np.asarray(index.event_refs, dtype=np.int64).reshape(-1, 3)
        items = index.event_strings.items
        return cls(
            strings, empty, notes, _objects(items)[refs], _empties(items)[refs],
            np.asarray(index.event_notes, dtype=np.int64),
        )  # fmt: skip


def _empties(items: Sequence[str]) -> np.ndarray:
    return np.fromiter((not s for s in items), dtype=bool, count=len(items))


def _objects(items: Sequence[str]) -> np.ndarray:
    """A 1-D object array of strings (``np.array`` would make a ``<U`` array or, for equal
    tuples, a 2-D one)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _pair_sds(
    a: np.ndarray,
    b: np.ndarray,
    a_empty: np.ndarray,
    b_empty: np.ndarray,
    ai: np.ndarray | None = None,
    bi: np.ndarray | None = None,
    *,
    b_chars: _Chars | None = None,
) -> np.ndarray:
    """``sds(a[ai[k]], b[bi[k]])`` of paired strings (``ai`` / ``bi`` ``None``: ``a[k]`` with
    ``b[k]``; ``*_empty``: which strings of ``a`` / ``b`` are empty): (P,) float32, the values
    :func:`string_distance_matrix` gives those pairs (rapidfuzz's pairwise ``cpdist``).
    ``b_chars``: ``_chars(b)``, when the caller keeps it.

    Only pairs that can score above 0 are handed to rapidfuzz, and the Levenshtein term only
    where it can beat Jaro-Winkler: with ``c`` an upper bound of the characters two strings
    share (:func:`_shared_chars`), ``c = 0`` means no Jaro match and an edit distance of
    ``max(len)`` (both terms exactly 0), and ``1 − lev / max(len) ≤ c / max(len)`` (each kept
    character is a shared one), so where that bound is at most the Jaro-Winkler value the
    maximum is Jaro-Winkler's. The same bits as scoring every pair with both."""
    if ai is None or bi is None:
        ai = bi = np.arange(a.size, dtype=np.int64)
    pairs = int(ai.size)
    out = np.zeros(pairs, dtype=np.float32)
    if pairs == 0:
        return out
    a_chars = _chars(a)
    b_chars = _chars(b) if b_chars is None else b_chars
    a_len, b_len = a_chars[0], b_chars[0]
    shared = _shared_chars(a_chars, ai, b_chars, bi)
    live = np.flatnonzero(shared > 0)
    if live.size:
        from rapidfuzz import process
        from rapidfuzz.distance import JaroWinkler, Levenshtein

        al, bl = a[ai[live]], b[bi[live]]
        jw = process.cpdist(
            al.tolist(), bl.tolist(), scorer=JaroWinkler.similarity, dtype=np.float64
        )
        longest = np.maximum(a_len[ai[live]], b_len[bi[live]])
        # (1e-9: well above the rounding of either side, so no pair that could win is left out)
        need = np.flatnonzero(shared[live] / longest + 1e-9 > jw)
        lev = np.zeros(live.size, dtype=np.float64)
        if need.size:
            lev[need] = process.cpdist(
                al[need].tolist(), bl[need].tolist(),
                scorer=Levenshtein.normalized_similarity, dtype=np.float64,
            )  # fmt: skip
        out[live] = np.maximum(jw.astype(np.float32), lev.astype(np.float32))
    ea, eb = a_empty[ai], b_empty[bi]
    out[ea ^ eb] = 0.0
    out[ea & eb] = 1.0
    return out


_Chars = tuple[np.ndarray, "tuple[np.ndarray, np.ndarray] | None"]
"""A string array's lengths, and its code points one after another (uint32) with each
string's first (``None``: a string UTF-32 cannot hold, a lone surrogate)."""


def _chars(strings: np.ndarray) -> _Chars:
    """The :data:`_Chars` of a 1-D object array of strings."""
    items = strings.tolist()
    lengths = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
    try:
        raw = "".join(items).encode("utf-32-le")
    except UnicodeEncodeError:
        return lengths, None
    first = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=first[1:])
    return lengths, (np.frombuffer(raw, dtype=np.uint32), first)


_CHAR_BITS = 1024
"""Width of the per-string character bitmap of :func:`_shared_chars` (a power of two)."""


def _shared_chars(a: _Chars, ai: np.ndarray, b: _Chars, bi: np.ndarray) -> np.ndarray:
    """(P,) int64: an upper bound of the characters (with repeats) pair ``k`` = ``(a[ai[k]],
    b[bi[k]])`` has in common (``a`` / ``b``: the two string arrays' :data:`_Chars`) — the
    characters of one side (the one with fewer over the batch) whose bit is set in the other
    string's character bitmap (code point modulo ``_CHAR_BITS``: every shared character is
    counted, a collision only loosens the bound); 0 only when the two share no character. No
    Python loop over pairs."""
    a_len, b_len = a[0], b[0]
    if int(b_len[bi].sum()) > int(a_len[ai].sum()):  # walk the side with fewer characters
        a, ai, b, bi = b, bi, a, ai
        a_len, b_len = b_len, a_len
    a_codes, b_codes = a[1], b[1]
    if a_codes is None or b_codes is None:  # no bound: every pair is scored
        return np.maximum(a_len[ai], b_len[bi])
    (a_cp, _), (b_cp, b_first) = a_codes, b_codes
    counts = b_len[bi]
    total = int(counts.sum())
    if total == 0 or a_cp.size == 0:
        return np.zeros(ai.size, dtype=np.int64)
    width = _CHAR_BITS
    while width > 64 and a_len.size * width > (1 << 22):  # the bitmaps stay a few MiB
        width //= 2
    bits = np.zeros((a_len.size, width), dtype=bool)
    bits[np.repeat(np.arange(a_len.size, dtype=np.int64), a_len), a_cp & (width - 1)] = True
    ends = np.cumsum(counts)
    cells = np.repeat(b_first[bi] - (ends - counts), counts) + np.arange(total, dtype=np.int64)
    hit = bits[np.repeat(ai, counts), b_cp[cells] & (width - 1)]
    pair = np.repeat(np.arange(ai.size, dtype=np.int64), counts)
    return np.bincount(pair[hit], minlength=ai.size)


def _ragged(owner_rows: np.ndarray, ptr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows owned by segments ``owner_rows``: every (row, member) pair, ``member`` running
    over ``ptr[o]:ptr[o + 1]`` of the row's segment — as two flat arrays (no Python loop)."""
    start, stop = ptr[owner_rows], ptr[owner_rows + 1]
    counts = stop - start
    rows = np.repeat(np.arange(owner_rows.size, dtype=np.int64), counts)
    first = np.repeat(start - (np.cumsum(counts) - counts), counts)
    return rows, first + np.arange(int(counts.sum()), dtype=np.int64)


def string_channel_scores_segments(
    columns: Sequence[IdentifierColumns | None],
    owners: Sequence[int],
    queries: Sequence[QueryIdentifiers | None],
    num_notes: int,
    *,
    event_weights: tuple[float, float, float, float, float] = (0.3, 0.3, 0.4, 0.6, 0.6),
    device: torch.device | str | None = None,
    cache: dict[Any, Any] | None = None,
) -> Tensor:
    """:func:`string_channel_scores` of each query against its own index, every query of
    the batch in one pass: (B, num_notes) float32, row ``b`` scored against
    ``columns[owners[b]]`` (its note numbers are columns; ``owners[b] < 0`` or a ``None``
    query: a zero row). Only the (query string, identifier) pairs of a query's own index are
    compared (pairwise, ``rapidfuzz.process.cpdist``), never every string against every
    index; the values equal the per-index function's.

    ``cache``: a dict kept with the indexes (a bank's union snapshot's): the indexes laid end
    to end (:class:`_JoinedColumns`) are kept there for the latest ``columns`` (one slot,
    checked by identity), so a warm batch of the same agents does not join them again."""
    dev = torch.device("cpu") if device is None else torch.device(device)
    bsz = len(queries)
    out = torch.zeros(bsz, num_notes, dtype=torch.float32, device=dev)
    if bsz == 0 or num_notes == 0:
        return out
    segs = [c if c is not None else _EMPTY_COLUMNS for c in columns]
    kept = None if cache is None else cache.get("string_columns_layout")
    if kept is not None and len(kept[0]) == len(segs) and all(map(operator.is_, kept[0], segs)):
        joined = kept[1]
    else:
        joined = _JoinedColumns.of(segs)
        if cache is not None:  # one slot: the latest set of indexes asked
            cache["string_columns_layout"] = (segs, joined)
    pos = joined.ptr
    flat = np.full(bsz * num_notes, -np.inf, dtype=np.float32)

    def pool(kind: str, per_query: Sequence[Sequence[str]]) -> None:
        qb, qs, qo = _query_rows(per_query, owners)
        if not qb.size:
            return
        rows, member = _ragged(qo, pos[kind])
        if not member.size:
            return
        q_empty = _empties(qs.tolist())
        sds = _pair_sds(
            qs, joined.strings[kind], q_empty, joined.empty[kind], rows, member,
            b_chars=joined.chars(kind),
        )  # fmt: skip
        notes = joined.notes[kind][member]
        np.maximum.at(flat, qb[rows] * num_notes + _within(notes, num_notes), sds)

    sit = [q is not None and not q.semantic for q in queries]
    pool("semantic", [q.concepts if q is not None and q.semantic else [] for q in queries])
    pool("location", [q.locations if s else [] for q, s in zip(queries, sit)])
    pool("participant", [q.participants if s else [] for q, s in zip(queries, sit)])
    pool("environment", [q.atmospheres if s else [] for q, s in zip(queries, sit)])
    _event_segments(flat, joined, owners, queries, sit, num_notes, event_weights)
    scores = torch.from_numpy(np.maximum(flat, 0.0).reshape(bsz, num_notes))
    return out.copy_(scores)


_EMPTY_COLUMNS = IdentifierColumns.of(IdentifierIndex())


class _JoinedColumns:
    """Several :class:`IdentifierColumns` laid end to end: per kind the strings, their
    emptiness, their notes and each index's first member (``ptr``, ``"events"`` for the
    event leaves), and the strings' :data:`_Chars` made on first use."""

    __slots__ = (
        "_chars",
        "empty",
        "event_empty",
        "event_notes",
        "event_strings",
        "notes",
        "ptr",
        "strings",
    )

    def __init__(self) -> None:
        self.strings: dict[str, np.ndarray] = {}
        self.empty: dict[str, np.ndarray] = {}
        self.notes: dict[str, np.ndarray] = {}
        self.ptr: dict[str, np.ndarray] = {}
        self._chars: dict[str, _Chars] = {}

    @classmethod
    def of(cls, segs: Sequence[IdentifierColumns]) -> _JoinedColumns:
        out = cls()
        for kind in _KINDS:
            out.strings[kind] = np.concatenate([c.strings[kind] for c in segs])
            out.empty[kind] = np.concatenate([c.empty[kind] for c in segs])
            out.notes[kind] = np.concatenate([c.notes[kind] for c in segs])
            out.ptr[kind] = _ptr([len(c.notes[kind]) for c in segs])
        out.ptr["events"] = _ptr([len(c.event_notes) for c in segs])
        out.event_strings = np.concatenate([c.event_strings for c in segs]).reshape(-1, 3)
        out.event_empty = np.concatenate([c.event_empty for c in segs]).reshape(-1, 3)
        out.event_notes = np.concatenate([c.event_notes for c in segs])
        return out

    def chars(self, kind: str) -> _Chars:
        found = self._chars.get(kind)
        if found is None:
            found = self._chars[kind] = _chars(self.strings[kind])
        return found


def _within(notes: np.ndarray, num_notes: int) -> np.ndarray:
    if notes.size and int(notes.max()) >= num_notes:
        from soulmem_torch.errors import ValidationError

        raise ValidationError(
            f"num_notes: expected more than every indexed note number, found note "
            f"{int(notes.max())} with num_notes={num_notes}"
        )
    return notes


def _ptr(sizes: Sequence[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))]).astype(np.int64)


def _query_rows(
    per_query: Sequence[Sequence[str]], owners: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(query, string, owner) of every string of every owned query, as flat arrays."""
    counts = np.fromiter(
        (len(s) if o >= 0 else 0 for s, o in zip(per_query, owners)), dtype=np.int64,
        count=len(per_query),
    )  # fmt: skip
    qb = np.repeat(np.arange(len(per_query), dtype=np.int64), counts)
    qs = _objects([s for strings, o in zip(per_query, owners) if o >= 0 for s in strings])
    return qb, qs, np.asarray(owners, dtype=np.int64)[qb] if qb.size else qb


def _event_segments(
    flat: np.ndarray,
    joined: _JoinedColumns,
    owners: Sequence[int],
    queries: Sequence[QueryIdentifiers | None],
    sit: Sequence[bool],
    num_notes: int,
    weights: tuple[float, float, float, float, float],
) -> None:
    """The event leaves' scores (as :func:`_event_scores`), every query against its index."""
    events = [(q.events if s and o >= 0 else []) for q, s, o in zip(queries, sit, owners)]
    counts = np.fromiter((len(e) for e in events), dtype=np.int64, count=len(events))
    if not counts.any():
        return
    qb = np.repeat(np.arange(len(events), dtype=np.int64), counts)
    ev = [e for evs in events for e in evs]
    q_str = _objects([s for a, i, t in ev for s in (a, i or "", t or "")]).reshape(-1, 3)
    has = np.array([(i is not None, t is not None) for _, i, t in ev], dtype=bool).reshape(-1, 2)
    rows, member = _ragged(np.asarray(owners, dtype=np.int64)[qb], joined.ptr["events"])
    if not member.size:
        return
    n_str, n_empty, n_notes = joined.event_strings, joined.event_empty, joined.event_notes
    q_empty = _empties(q_str.reshape(-1).tolist()).reshape(-1, 3)
    action, initiator, target = (
        _pair_sds(q_str[:, k], n_str[:, k], q_empty[:, k], n_empty[:, k], rows, member)
        for k in range(3)
    )
    t = torch.from_numpy
    score = _event_blend(
        t(action), t(initiator), t(target), t(has[rows, 0]), t(has[rows, 1]), weights
    )
    np.maximum.at(flat, qb[rows] * num_notes + _within(n_notes[member], num_notes), score.numpy())
