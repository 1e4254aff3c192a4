"""The text channel of the fused pipeline: whole-note BM25 over words and character bigrams.

Every note kind (concepts, situations, actions) is one document: all of its strings (content,
aliases, description, narrative, names, roles, atmospheres, actions, …; not its tags or enum
variant names). A query is the set of its strings' terms. Terms (:func:`text_terms`): NFKC +
casefold; inside a run of CJK characters the character bigrams (a one-character run: the
character); other text: its words, English stopwords left out and every word reduced to its
Snowball (Porter 2) stem (``snowballstemmer``: "visited", "visits" → "visit"). Bigrams are the
usual index unit for Chinese / Japanese without a dictionary; stems and stopwords the usual
ones for English (docs/spec.md §7, DECISION "text terms"). No model, no download.

The note-term matrix and its BM25 weights (IDF and average length of *this* memory's notes) are
built once per graph snapshot and cached on it (:func:`text_index`); queries are turned into a
``(B, V)`` term matrix and scored by one sparse product
(:func:`soulmem_torch.functional.fusion.bm25_scores`).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.fusion import (
    bm25_candidate_scores,
    bm25_note_weights,
    bm25_scores,
    bm25_term_major,
)

if TYPE_CHECKING:
    from soulmem_torch.graph import MemoryGraph
    from soulmem_torch.model import MemoryNote
    from soulmem_torch.retrieve._types import MemorySource

__all__ = [
    "STOPWORDS",
    "TextIndex",
    "candidate_text_scores",
    "note_strings",
    "query_strings",
    "text_index",
    "text_scores",
    "text_terms",
]

_RUNS = re.compile(
    r"(?P<cjk>[\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
    r"\U00020000-\U0003134f]+)|(?P<word>[^\W_]+)"
)
_SKIP_KEYS = frozenset({"concept_type", "action_type", "time_span"})


# The classic English stopword list (Snowball's, as shipped by NLTK and Lucene), apostrophes
# stripped to match the word pattern; words that carry meaning in questions ("first", "last",
# "before", "after") stay.
STOPWORDS: frozenset[str] = frozenset(
    """a about am an and any are as at be been being both but by can could d did do does doing
    down during each few for from further had has have having he her here hers herself him
    himself his how i if in into is it its itself just ll m ma me mightn more most my myself
    needn no nor not now o of off on once only or other our ours ourselves out own re s same
    shan she should so some such t than that the their theirs them themselves then there these
    they this those through to too under until up ve very was we were what when where which
    while who whom why will with would y you your yours yourself yourselves""".split()
)


@functools.lru_cache(maxsize=1)
def _stemmer() -> Any:
    import snowballstemmer

    return snowballstemmer.stemmer("english")


_WORD_TERMS: dict[str, str] = {}


def _word_term(word: str) -> str:
    """The term of one casefolded word: its Snowball stem, ``""`` for a stopword (cached)."""
    term = _WORD_TERMS.get(word)
    if term is None:
        term = "" if word in STOPWORDS else _stemmer().stemWord(word)
        if len(_WORD_TERMS) < 500_000:
            _WORD_TERMS[word] = term
    return term


@functools.lru_cache(maxsize=8192)
def _terms(text: str) -> tuple[str, ...]:
    return tuple(_split(text))


def text_terms(text: str) -> list[str]:
    """Terms of a text: CJK character bigrams (a lone CJK character as itself), other words
    stemmed, English stopwords left out.

    >>> text_terms("I visited the museums")
    ['visit', 'museum']
    """
    return list(_terms(text))


def _split(text: str) -> list[str]:
    norm = unicodedata.normalize("NFKC", text).casefold()
    out: list[str] = []
    get = _WORD_TERMS.get
    for run, word in _RUNS.findall(norm):
        if word:
            term = get(word)
            if term is None:
                term = _word_term(word)
            if term:
                out.append(term)
        elif len(run) == 1:
            out.append(run)
        else:
            out.extend([run[i : i + 2] for i in range(len(run) - 1)])
    return out


def _strings(obj: Any, out: list[str]) -> list[str]:
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            if key not in _SKIP_KEYS:
                _strings(value, out)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _strings(value, out)
    return out


def note_strings(note: MemoryNote) -> list[str]:
    """Every string of a note's content (not its tags, ids, times or enum variant names)."""
    return _strings(note.mem_type.model_dump(mode="json"), [])


def query_strings(query: Any) -> list[str]:
    """Every string of a structured query's variant (not its tags); a text query is itself."""
    if isinstance(query, str):
        return [query]
    variant = getattr(query, "variant", None)
    if variant is None:
        return []
    return _strings(variant.model_dump(mode="json"), [])


@dataclass(frozen=True)
class TextIndex:
    """BM25 weights of one memory's notes: ``vocab`` term → column, ``weights`` sparse (N, V)
    and the same transposed, ``term_major`` (V, N)."""

    vocab: dict[str, int]
    weights: Tensor
    term_major: Tensor

    def term_ids(self, strings: Iterable[str]) -> set[int]:
        """The columns of the known terms of ``strings`` (each once)."""
        vocab = self.vocab
        return {vocab[t] for s in strings for t in _terms(s) if t in vocab}

    def query_terms(self, queries: Sequence[Iterable[str]], *, device: torch.device) -> Tensor:
        """Sparse COO (B, V) float64: 1 for each distinct known term of each query's strings."""
        rows: list[int] = []
        cols: list[int] = []
        for j, strings in enumerate(queries):
            seen = self.term_ids(strings)
            rows.extend([j] * len(seen))
            cols.extend(seen)
        out = torch.sparse_coo_tensor(
            torch.tensor([rows, cols], dtype=torch.int64).reshape(2, -1),
            torch.ones(len(rows), dtype=torch.float64),
            (len(queries), len(self.vocab)),
            check_invariants=False,
        )
        return out.coalesce().to(device)


# One pass over all notes' strings: strings joined by \x00 (no term crosses it, as none
# crosses a string's end) and notes by \x01, which the pattern's ``sep`` group reports.
_BULK_RUNS = re.compile(_RUNS.pattern + r"|(?P<sep>\x01)")


def _bulk_text(notes: Sequence[MemoryNote]) -> str:
    text = "\x01".join("\x00".join(note_strings(note)) for note in notes)
    if text.count("\x01") != max(len(notes) - 1, 0):  # a note's own text holds \x01
        text = "\x01".join(
            "\x00".join(s.replace("\x01", " ") for s in note_strings(note)) for note in notes
        )  # (a control character splits words as a space does: the terms are the same)
    return text


def build_text_index(notes: Sequence[MemoryNote], *, device: torch.device) -> TextIndex:
    """The BM25 index of a memory's notes (in graph order).

    The terms of every note are :func:`text_terms` of each of its strings (the same terms,
    read in one normalization and one regular-expression pass over all notes); the term-count
    matrix is counted by one ``torch.unique`` of ``(note, term)`` keys."""
    norm = unicodedata.normalize("NFKC", _bulk_text(notes)).casefold()
    terms: list[str] = []
    ends: list[int] = []  # len(terms) at the end of each note
    add, extend = terms.append, terms.extend
    get = _WORD_TERMS.get
    for run, word, sep in _BULK_RUNS.findall(norm):
        if word:
            term = get(word)
            if term is None:
                term = _word_term(word)
            if term:
                add(term)
        elif sep:
            ends.append(len(terms))
        elif len(run) == 1:
            add(run)
        else:
            extend([run[k : k + 2] for k in range(len(run) - 1)])
    n = len(notes)
    if n:
        ends.append(len(terms))
    # term ids in order of first appearance (the order a per-note Counter would give them)
    vocab = {t: j for j, t in enumerate(dict.fromkeys(terms))}
    v = max(len(vocab), 1)
    per_note = torch.tensor(ends, dtype=torch.int64).diff(prepend=torch.zeros(1, dtype=torch.int64))
    keys = torch.repeat_interleave(torch.arange(n, dtype=torch.int64), per_note[:n]) * v
    keys += torch.tensor(list(map(vocab.__getitem__, terms)), dtype=torch.int64)
    uniq, counts = torch.unique(keys, sorted=True, return_counts=True)
    tf = torch.sparse_coo_tensor(
        torch.stack([uniq // v, uniq % v]),
        counts.to(torch.float64),
        (n, len(vocab)),
        is_coalesced=True,
        check_invariants=False,
    )
    weights = bm25_note_weights(tf).to(device)
    return TextIndex(vocab, weights, bm25_term_major(weights))


def _notes_of(memory: MemorySource) -> list[Any] | None:
    cluster = getattr(memory, "cluster", memory)
    notes = getattr(cluster, "notes", None)
    return list(notes()) if callable(notes) else None


def text_index(graph: MemoryGraph, memory: MemorySource) -> TextIndex | None:
    """The snapshot's text index, built once and cached; None when the notes are unknown (a bare
    ``MemoryGraph`` was passed) — the text channel then has nothing to say."""
    key = "text_index"
    cached = graph.cache.get(key)
    if cached is not None:
        return cached
    notes = _notes_of(memory)
    if notes is None or len(notes) != int(graph.num_nodes):
        return None  # not cached: another caller may pass the memory with its notes
    by_id = {n.id: n for n in notes}
    ordered = [by_id.get(i) for i in graph.ids]
    if any(n is None for n in ordered):
        return None
    graph.cache[key] = build_text_index(ordered, device=graph.device)
    return graph.cache[key]


def text_scores(graph: MemoryGraph, memory: MemorySource, queries: Sequence[Any]) -> Tensor:
    """BM25 of B queries (structured or text) against every note: (B, N) float64, zeros when
    the memory has no text index."""
    n = int(graph.num_nodes)
    index = text_index(graph, memory)
    if index is None or not index.vocab:
        return torch.zeros(len(queries), n, dtype=torch.float64, device=graph.device)
    terms = index.query_terms([query_strings(q) for q in queries], device=graph.device)
    return bm25_scores(terms, index.weights, term_major=index.term_major)


def candidate_text_scores(
    indices: Mapping[int, TextIndex | None] | Sequence[TextIndex | None],
    owners: Sequence[int],
    queries: Sequence[Any],
    width: int,
    *,
    device: torch.device,
) -> Tensor:
    """BM25 of each query against its own memory's notes, many memories in one pass:
    (B, width) float64, row ``b`` the scores of ``indices[owners[b]]``'s notes in graph order
    (zeros past them, for a memory without an index and for a negative owner: no memory) —
    the same bits as
    :func:`text_scores` on each memory alone.

    The memories' term-major weights are laid end to end (terms and notes offset per memory)
    and every query's postings are summed by one
    :func:`~soulmem_torch.functional.fusion.bm25_candidate_scores`; the only Python work is
    looking each query's terms up in its own memory's vocabulary.
    """
    b = len(queries)
    if len(owners) != b:
        raise ValidationError(f"owners: expected {b} entries (one per query), found {len(owners)}")
    used = sorted(set(owners))
    term_base: dict[int, int] = {}
    note_base: dict[int, int] = {}
    parts_t, parts_n, parts_w = [], [], []
    terms = notes = 0
    for p in used:
        index = indices[p] if p >= 0 else None
        if index is None or not index.vocab:
            continue
        t_of, n_of = index.term_major.indices()
        term_base[p], note_base[p] = terms, notes
        parts_t.append(t_of.to(device) + terms)
        parts_n.append(n_of.to(device) + notes)
        parts_w.append(index.term_major.values().to(device))
        terms += len(index.vocab)
        notes += int(index.weights.shape[0])
    if not parts_t:
        return torch.zeros(b, int(width), dtype=torch.float64, device=device)
    term_major = torch.sparse_coo_tensor(
        torch.stack([torch.cat(parts_t), torch.cat(parts_n)]),
        torch.cat(parts_w),
        (terms, notes),
        is_coalesced=True,  # each memory's rows are coalesced, and the memories follow in order
        check_invariants=False,
    )
    rows: list[int] = []
    cols: list[int] = []
    first = [0] * b
    for j, (q, p) in enumerate(zip(queries, owners)):
        base = term_base.get(p)
        if base is None:
            continue
        first[j] = note_base[p]
        seen = sorted(indices[p].term_ids(query_strings(q)))  # type: ignore[union-attr]
        rows.extend([j] * len(seen))
        cols.extend([base + c for c in seen])
    query_terms = torch.sparse_coo_tensor(
        torch.tensor([rows, cols], dtype=torch.int64).reshape(2, -1),
        torch.ones(len(rows), dtype=torch.float64),
        (b, terms),
        is_coalesced=True,  # rows in order, each row's terms sorted and distinct
        check_invariants=False,
    ).to(device)
    first_note = torch.tensor(first, dtype=torch.int64, device=device)
    return bm25_candidate_scores(query_terms, term_major, first_note, width)
