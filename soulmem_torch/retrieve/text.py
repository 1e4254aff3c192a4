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

import dataclasses
import functools
import itertools
import operator
import re
import threading
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import concat
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import BaseModel
from torch import Tensor

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.fusion import (
    bm25_candidate_scores,
    bm25_note_weights,
    bm25_scores,
    bm25_term_starts,
    candidate_term_hits,
)

if TYPE_CHECKING:
    from soulmem_torch.graph import MemoryGraph
    from soulmem_torch.model import MemoryNote
    from soulmem_torch.retrieve._types import MemorySource

__all__ = [
    "STOPWORDS",
    "TextIndex",
    "build_text_indexes",
    "CandidateTerms",
    "candidate_query_terms",
    "NoteTerms",
    "candidate_text_scores",
    "note_strings",
    "note_terms_of",
    "note_text",
    "remember_note_terms",
    "remember_notes_terms",
    "query_strings",
    "text_index",
    "text_indexes",
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


class _TermCache(dict):  # type: ignore[type-arg]
    """casefolded word → its term; ``cache[word]`` computes a missing one (so a ``map`` of
    ``__getitem__`` over a note's words runs without a Python call per known word)."""

    def __missing__(self, word: str) -> str:
        term = "" if word in STOPWORDS else _stemmer().stemWord(word)
        if len(self) < 500_000:
            self[word] = term
        return term


_WORD_TERMS: dict[str, str] = _TermCache()


def _word_term(word: str) -> str:
    """The term of one casefolded word: its Snowball stem, ``""`` for a stopword (cached)."""
    return _WORD_TERMS[word]


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
    mem_type = note.mem_type
    out: list[str] = []
    if _model_strings(mem_type, out):
        return out
    return _strings(mem_type.model_dump(mode="json"), [])  # a value the walk does not know


_FIELDS_OF: dict[type, tuple[str, ...]] = {}
_LEAVES = (int, float, type(None))
_LEAF_TYPES = frozenset({int, float, bool, type(None)})


def _model_strings(obj: Any, out: list[str]) -> bool:
    """The strings ``model_dump(mode="json")`` of a note's content would hold, in its order,
    read off the model's attributes (no dump: several times faster); ``False`` on a value
    whose JSON form it does not know (a ``str`` subclass, a datetime outside ``time_span``, …):
    the caller then reads the dump."""
    cls = type(obj)
    if cls is str:
        out.append(obj)
        return True
    if cls is list or cls is tuple:
        values: Iterable[Any] = obj
    else:
        names = _FIELDS_OF.get(cls)
        if names is None:
            if not isinstance(obj, BaseModel) or type(obj).__pydantic_computed_fields__:
                if cls in _LEAF_TYPES:
                    _FIELDS_OF[cls] = ()  # (numbers and None hold no string)
                return isinstance(obj, _LEAVES)
            names = _FIELDS_OF[cls] = tuple(
                name
                for name, info in cls.model_fields.items()
                if name not in _SKIP_KEYS and not info.exclude
            )
        if not names:
            return True
        if getattr(obj, "__pydantic_extra__", None):
            return False
        values = map(getattr, repeat(obj), names)
    for value in values:  # (a string inline: most values are)
        if type(value) is str:
            out.append(value)
        elif not _model_strings(value, out):
            return False
    return True


def query_strings(query: Any) -> list[str]:
    """Every string of a structured query's variant (not its tags); a text query is itself."""
    if isinstance(query, str):
        return [query]
    variant = getattr(query, "variant", None)
    if variant is None:
        return []
    out: list[str] = []
    if _model_strings(variant, out):  # (read off the attributes: no dump)
        return out
    return _strings(variant.model_dump(mode="json"), [])


class TextIndex:
    """BM25 weights of one memory's notes: ``vocab`` term → column, ``weights`` sparse (N, V)
    and the same transposed, ``term_major`` (V, N).

    Built by :func:`build_text_indexes`, an index holds its columns' terms as ids of the
    process's term numbering (``terms``: (V,) int64, ``numbering`` the :class:`_TermIds` they
    are in) and makes ``vocab`` only when it is read: a query's terms are found by their ids
    (one ``searchsorted``), so a first question to many memories builds no dict of terms."""

    __slots__ = ("_lookup", "_numbering", "_terms", "_vocab", "term_major", "weights")

    def __init__(
        self,
        vocab: dict[str, int] | None,
        weights: Tensor,
        term_major: Tensor,
        *,
        terms: np.ndarray | None = None,
        numbering: _TermIds | None = None,
    ) -> None:
        if vocab is None and (terms is None or numbering is None):
            raise ValidationError("vocab: expected a dict, or terms and their numbering")
        self._vocab, self.weights, self.term_major = vocab, weights, term_major
        self._terms, self._numbering = terms, numbering
        self._lookup: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def vocab(self) -> dict[str, int]:
        """term → column (columns numbered as the terms first appear in the memory)."""
        if self._vocab is None:
            self._vocab = dict(zip(self.term_names(), itertools.count()))
        return self._vocab

    @property
    def num_terms(self) -> int:
        """V, the number of columns."""
        return int(self.weights.shape[1])

    def term_names(self) -> list[str]:
        """The term of each column, in column order."""
        if self._vocab is not None:
            return list(self._vocab)
        return list(map(self._numbering.names.__getitem__, self._terms.tolist()))  # type: ignore[union-attr]

    def term_ids(self, strings: Iterable[str]) -> set[int]:
        """The columns of the known terms of ``strings`` (each once)."""
        # (a query repeats its text across fields: each distinct string's terms once)
        return self.term_columns(t for s in dict.fromkeys(strings) for t in _terms(s))

    def term_columns(self, terms: Iterable[str]) -> set[int]:
        """The columns of the known ``terms`` (terms as the index holds them: words already
        read by the text channel's tokenizer), each once; no ``vocab`` is made for it."""
        if self._vocab is not None or self._terms is None:
            vocab = self.vocab
            return {vocab[t] for t in terms if t in vocab}
        found = self._numbering.known(terms)  # type: ignore[union-attr]
        if not found or not len(self._terms):
            return set()
        if self._lookup is None:
            order = np.argsort(self._terms, kind="stable")
            self._lookup = (self._terms[order], order)
        ordered, column = self._lookup
        want = np.fromiter(found, np.int64, len(found))  # type: ignore[arg-type]
        at = np.minimum(np.searchsorted(ordered, want), len(ordered) - 1)
        return set(column[at[ordered[at] == want]].tolist())

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
            (len(queries), self.num_terms),
            check_invariants=False,
        )
        return out.coalesce().to(device)


# One pass over all notes' strings. ASCII notes (most English text): NFKC is the identity,
# the case fold is ``lower`` and the word runs are ``[a-z0-9]+``, so one byte table lowers
# their letters and blanks every other byte (the note separator kept) and ``split`` reads
# their words; the other notes are NFKC-normalized and case-folded together and read by the
# run pattern, as :func:`text_terms` reads a text. Words map to term ids through one
# per-build table (a word is stemmed once per process: ``_WORD_TERMS``).

_CJK = re.compile(_RUNS.pattern.split("|(?P<word>")[0])
_WORDS = re.compile(r"[^\W_]+")
_NOTE_SEP = "\x01"
_ASCII_WORDS = bytes(
    c + 32 if 65 <= c <= 90 else c if (97 <= c <= 122 or 48 <= c <= 57 or c == 1) else 32
    for c in range(256)
)
_SEP_ID, _STOP_ID = -2, -1
_TEXTS_PER_PASS = 1024
"""Note texts read per pass (a pass holds its words as Python strings)."""


class _Numbering(dict):  # type: ignore[type-arg]
    """term → its id in ``names``; ``numbering[term]`` numbers a missing term (so a ``map``
    of ``__getitem__`` over known terms runs without a Python call per term)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.names = names

    def __missing__(self, term: str) -> int:
        tid = self[term] = len(self.names)
        self.names.append(term)
        return tid


class _TermIds(dict):  # type: ignore[type-arg]
    """casefolded word → the id of its term in ``names`` (``-1``: a stopword; the note
    separator ``-2``): the process's numbering (:data:`_NUMBERING`); ``ids[word]`` fills a
    missing word."""

    def __init__(self) -> None:
        super().__init__({_NOTE_SEP: _SEP_ID})
        self.names: list[str] = []
        self.of_term = _Numbering(self.names)

    def term(self, term: str) -> int:
        """The id of a term (a CJK run's bigram or character)."""
        return self.of_term[term]

    def known(self, terms: Iterable[str]) -> set[int]:
        """The ids of the ``terms`` this numbering holds, each once (numbers nothing)."""
        found = set(map(self.of_term.get, terms))
        found.discard(None)
        return found  # type: ignore[return-value]

    def __missing__(self, word: str) -> int:
        term = _WORD_TERMS[word]
        tid = self.of_term[term] if term else _STOP_ID
        self[word] = tid
        return tid


_TERMS_MAX = 1 << 21
"""Words and terms the process numbering holds before it starts over (a new generation: the
texts held in the old numbering are read again when next indexed)."""


class _ProcessNumbering:
    """The process's term numbering: ``ids`` (a :class:`_TermIds`: casefolded word → term id,
    ``ids.names`` the terms) and its ``generation``; ``lock`` guards every read that may number
    a new word (reads from several threads number each word once)."""

    __slots__ = ("generation", "ids", "lock")

    def __init__(self) -> None:
        self.ids = _TermIds()
        self.generation = 0
        self.lock = threading.Lock()

    def current(self) -> tuple[_TermIds, int]:
        """The numbering to read with (a new generation once the words or terms outgrow
        ``_TERMS_MAX``). Call with ``lock`` held."""
        if len(self.ids) + len(self.ids.names) > _TERMS_MAX:
            self.ids, self.generation = _TermIds(), self.generation + 1
        return self.ids, self.generation


_NUMBERING = _ProcessNumbering()

_NO_IDS = np.zeros(0, dtype=np.int32)


class NoteTerms:
    """The terms of note texts, by the text (one memory's, kept on its cluster across
    snapshots: ``MemoryCluster.kept``). Content-addressed: a note whose strings did not change
    is not read again when the memory's text index is rebuilt after a write, and a changed
    note is a new text. Filled when notes are added (:func:`remember_note_terms`: the index
    is written with the notes, as a search engine's is) and by every index build, which keeps
    only the texts of the notes it indexed — so it holds the memory's texts, plus those added
    since the last build (bounded: :func:`remember_note_terms` drops the texts of notes gone
    when they outnumber the memory's).

    Each text is held as what its index rows need, counted: ``terms[text] = (ids, counts)``,
    two int32 arrays — its distinct terms (their ids in the process's term numbering, in order
    of first appearance) and how often each occurs. An index build concatenates them (no term
    string is looked up again). ``generation``: the numbering they are in (a store of an older
    one is read as empty).

    ``texts``: the text of each note read (:func:`note_text`), by the note object's identity —
    ``id(note) → (note, text)``, used only while the entry's note *is* the note asked about —
    so a snapshot's index does not walk every note's fields again for its content address. A
    note changed in place is declared so (``MemoryCluster.mark_changed``, which every change
    the library makes goes through, as the snapshot's own rebuild needs); the cluster then
    tells its kept values (:meth:`notes_changed`), and removing a note drops it too."""

    __slots__ = ("changes", "generation", "terms", "texts")

    def __init__(self) -> None:
        self.terms: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.texts: dict[int, tuple[MemoryNote, str]] = {}
        self.generation = _NUMBERING.generation
        self.changes = 0  # notes declared changed so far: a text read before one is not kept

    def notes_changed(self, notes: Iterable[Any]) -> None:
        """Forgets the texts read of ``notes`` (changed in place or removed)."""
        self.changes += 1
        for note in notes:
            self.texts.pop(id(note), None)

    def text_of(self, note: MemoryNote) -> str:
        """:func:`note_text` of ``note``, read once while the note is not declared changed."""
        held = self.texts.get(id(note))
        if held is not None and held[0] is note:
            return held[1]
        before = self.changes
        text = note_text(note)
        if self.changes == before:  # (not kept when a change was declared meanwhile)
            self.texts[id(note)] = (note, text)
        return text

    def __len__(self) -> int:
        return len(self.terms)

    def counts(self, text: str) -> dict[str, int] | None:
        """The terms of a held text and their counts, in order of first appearance (``None``:
        not held)."""
        held = self.terms.get(text) if self.generation == _NUMBERING.generation else None
        if held is None:
            return None
        names = _NUMBERING.ids.names
        return dict(zip(map(names.__getitem__, held[0].tolist()), held[1].tolist()))


def note_text(note: MemoryNote) -> str:
    """The text a note is indexed by: its strings (:func:`note_strings`) joined by NUL."""
    return "\x00".join(note_strings(note))


def note_terms_of(memory: Any) -> NoteTerms | None:
    """The :class:`NoteTerms` kept by a memory's cluster (a ``SoulMem``, working memory or
    cluster), or ``None`` for a source without one (a bare list of notes)."""
    cluster = getattr(memory, "cluster", memory)
    kept = getattr(cluster, "kept", None)
    return kept("text_terms", NoteTerms) if callable(kept) else None


def remember_note_terms(memory: Any, notes: Iterable[MemoryNote]) -> None:
    """Reads the terms of ``notes`` into their memory's :class:`NoteTerms` now (the texts it
    does not hold yet, in one pass: :func:`_read_texts`, each text's terms counted), so the
    memory's next text index reads none of them. Nothing happens for a memory without a
    cluster. :func:`remember_notes_terms` of one memory."""
    remember_notes_terms([memory], [notes])


def remember_notes_terms(memories: Sequence[Any], notes: Sequence[Iterable[MemoryNote]]) -> None:
    """:func:`remember_note_terms` of each memory and its notes (``notes[k]``: those of
    ``memories[k]``), every text read in one pass: a text several memories hold (a note many
    agents share) is read once, its arrays held by each of them (they are never written)."""
    from soulmem_torch.model import MemoryNote

    if len(memories) != len(notes):
        raise ValidationError(
            f"notes: expected {len(memories)} lists (one per memory), found {len(notes)}"
        )
    jobs: list[tuple[NoteTerms, Any, int, list[str]]] = []
    wanted: dict[str, None] = {}
    for memory, group in zip(memories, notes):
        store = note_terms_of(memory)
        if store is None:
            continue
        items = [getattr(n, "note", n) for n in group]  # an EmbeddedMemoryNote's note
        items = [n for n in items if isinstance(n, MemoryNote)]  # (the write validates the rest)
        if store.generation != _NUMBERING.generation:
            store.terms, store.generation = {}, _NUMBERING.generation
        held = store.terms
        texts = [t for t in dict.fromkeys(map(store.text_of, items)) if t not in held]
        cluster = getattr(memory, "cluster", memory)
        size = len(cluster) if hasattr(cluster, "__len__") else 0
        notes_now = getattr(cluster, "notes", None)
        if len(store.texts) > 2 * size + 1024 and callable(notes_now):  # notes gone (or a
            # failed write's): keep the memory's and these
            keep = {id(n) for n in notes_now()} | set(map(id, items))
            store.texts = {k: v for k, v in store.texts.items() if k in keep}
        if texts:
            jobs.append((store, notes_now, size, texts))
            wanted.update(dict.fromkeys(texts))
    if not wanted:
        return
    distinct = list(wanted)
    with _NUMBERING.lock:
        ids, generation = _NUMBERING.current()
        tid, text_of = _read_texts(ids, distinct, np.arange(len(distinct), dtype=np.int64))
    read = dict(zip(distinct, _counted(tid, text_of, len(distinct))))
    for store, notes_now, size, texts in jobs:
        terms = store.terms if store.generation == generation else {}
        if len(terms) + len(texts) > 2 * size + 1024:  # texts of notes gone: keep the memory's
            if callable(notes_now):
                current = set(map(store.text_of, notes_now()))
                terms = {t: v for t, v in terms.items() if t in current}
        terms.update(zip(texts, map(read.__getitem__, texts)))
        store.terms, store.generation = terms, generation


def _counted(tid: np.ndarray, text: np.ndarray, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each of ``n`` texts' distinct terms in order of first appearance and their counts
    (``(ids, counts)``, int32; empty for a text without terms), from its term stream (``tid``
    in text order, each text's in reading order; ``text`` the text of each): one
    ``numpy.unique`` of ``(text, term)`` keys, put back in order of first appearance."""
    if not len(tid):
        return [(_NO_IDS, _NO_IDS)] * n
    g = int(tid.max()) + 1
    key, first, count = np.unique(text * g + tid, return_index=True, return_counts=True)
    order = np.argsort(first)  # (text, first appearance): the texts stay in order
    key = key[order]
    ids = (key % g).astype(np.int32)
    count = count[order].astype(np.int32)
    cut = np.searchsorted(key // g, np.arange(n + 1, dtype=np.int64)).tolist()
    return [(ids[lo:hi], count[lo:hi]) for lo, hi in itertools.pairwise(cut)]


def _joined(texts: Sequence[str]) -> str:
    """``texts`` joined by the note separator (one in a text itself read as a space: a
    control character splits words as a space does, so the terms are the same)."""
    joined = _NOTE_SEP.join(texts)
    if joined.count(_NOTE_SEP) != max(len(texts) - 1, 0):
        joined = _NOTE_SEP.join(t.replace(_NOTE_SEP, " ") for t in texts)
    return joined


def _ascii_term_ids(ids: _TermIds, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(term ids, text of each)`` of ASCII ``texts`` in reading order (stopwords out)."""
    joined = _joined(texts).replace(_NOTE_SEP, " \x01 ")
    words = joined.encode("ascii").translate(_ASCII_WORDS).decode("ascii").split()
    tid = np.fromiter(map(ids.__getitem__, words), np.int64, len(words))
    text_of = np.cumsum(tid == _SEP_ID)
    keep = tid >= 0
    return tid[keep], text_of[keep]


def _other_term_ids(ids: _TermIds, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(term ids, text of each)`` of any ``texts`` in reading order: one NFKC / case fold
    over them all; a text without CJK runs read by one word pattern, one with some run by
    run, as :func:`text_terms` does."""
    norm = unicodedata.normalize("NFKC", _joined(texts)).casefold()
    lookup, term = ids.__getitem__, ids.term
    search, words = _CJK.search, _WORDS.findall
    out: list[int] = []
    add, extend = out.append, out.extend
    ends: list[int] = []
    for text in norm.split(_NOTE_SEP):
        if search(text) is None:
            extend(map(lookup, words(text)))
        else:
            for run, word in _RUNS.findall(text):
                if word:
                    add(lookup(word))
                elif len(run) == 1:
                    add(term(run))
                else:  # the run's character bigrams
                    extend(map(term, map(concat, run, run[1:])))
        ends.append(len(out))
    tid = np.asarray(out, dtype=np.int64)
    text_of = np.repeat(np.arange(len(ends)), np.diff(np.asarray([0, *ends], dtype=np.int64)))
    keep = tid >= 0
    return tid[keep], text_of[keep]


def _read_texts(
    ids: _TermIds, texts: Sequence[str], rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(term ids, text of each)`` of ``texts[rows]``, in text order and each text's terms in
    reading order (stopwords out): ASCII texts by one byte table, the others as
    :func:`text_terms` reads them."""
    is_ascii = np.fromiter((texts[i].isascii() for i in rows.tolist()), bool, len(rows))
    parts = []
    for reader, picked in ((_ascii_term_ids, rows[is_ascii]), (_other_term_ids, rows[~is_ascii])):
        for start in range(0, len(picked), _TEXTS_PER_PASS):  # (bounds the word lists held)
            block = picked[start : start + _TEXTS_PER_PASS]
            tid, text_of = reader(ids, [texts[i] for i in block.tolist()])
            parts.append((tid, block[text_of]))
    return _merged(parts)


def _merged(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Streams of ``(term ids, text of each)``, each in text order, as one in text order
    (a text's terms stay in their order)."""
    parts = [p for p in parts if len(p[0])]
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    if len(parts) == 1:
        return parts[0]
    tid = np.concatenate([t for t, _ in parts])
    text = np.concatenate([n for _, n in parts])
    order = np.argsort(text, kind="stable")
    return tid[order], text[order]


def _note_texts(
    notes: Sequence[MemoryNote], stores: Sequence[NoteTerms | None] | None
) -> list[str]:
    """:func:`note_text` of each note, the texts each note's store has read taken from it
    (:attr:`NoteTerms.texts`); each store then holds the texts of its notes here only."""
    if stores is None:
        return list(map(note_text, notes))
    out: list[str] = []
    kept: dict[int, dict[int, tuple[MemoryNote, str]]] = {}
    changes = {id(s): s.changes for s in stores if s is not None}
    for note, store in zip(notes, stores):
        if store is None:
            out.append(note_text(note))
            continue
        held = store.texts.get(id(note))
        text = held[1] if held is not None and held[0] is note else note_text(note)
        out.append(text)
        kept.setdefault(id(store), {})[id(note)] = (note, text)
    for store in stores:
        if store is not None and id(store) in kept:
            texts = kept.pop(id(store))
            if store.changes == changes[id(store)]:  # (else a note changed meanwhile)
                store.texts = texts
    return out


def _note_cells(
    notes: Sequence[MemoryNote], stores: Sequence[NoteTerms | None] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, _TermIds]:
    """``(term ids, counts, note of each, their numbering)``: every note's distinct terms with
    their counts, in note order, each note's in order of first appearance (the terms of
    :func:`text_terms` of each of its strings); a text that several notes hold (a session
    shared by several memories) is read once.

    ``stores``: each note's memory's :class:`NoteTerms` (``None``: none). A text one of them
    holds is not read again (its arrays are concatenated); the others are read and put
    there, and each store then keeps the texts of its notes here only (what this build
    indexed)."""
    position: dict[str, int] = {}
    text_of_note = [position.setdefault(t, len(position)) for t in _note_texts(notes, stores)]
    texts = list(position)
    known: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(texts)
    with _NUMBERING.lock:
        ids, generation = _NUMBERING.current()
        if stores is not None:
            for t, store in zip(text_of_note, stores):
                if store is not None and known[t] is None and store.generation == generation:
                    known[t] = store.terms.get(texts[t])
        fresh_rows = np.flatnonzero(np.fromiter((k is None for k in known), bool, len(texts)))
        tid_new, text_new = _read_texts(ids, texts, fresh_rows)
    if len(fresh_rows):
        local = np.full(len(texts), -1, dtype=np.int64)
        local[fresh_rows] = np.arange(len(fresh_rows), dtype=np.int64)
        read = _counted(tid_new, local[text_new], len(fresh_rows))
        for i, cells in zip(fresh_rows.tolist(), read):
            known[i] = cells
    if stores is not None and any(s is not None for s in stores):
        kept: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        for t, store in zip(text_of_note, stores):
            if store is not None:
                kept.setdefault(id(store), {})[texts[t]] = known[t]  # type: ignore[assignment]
        for store in stores:
            if store is not None and id(store) in kept:
                store.terms, store.generation = kept.pop(id(store)), generation
    per_note = [known[t] for t in text_of_note]
    length = np.fromiter((len(c[0]) for c in per_note), np.int64, len(per_note))  # type: ignore[index]
    if not int(length.sum()):
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, ids
    tid = np.concatenate([c[0] for c in per_note]).astype(np.int64)  # type: ignore[index]
    count = np.concatenate([c[1] for c in per_note])  # type: ignore[index]
    note = np.repeat(np.arange(len(notes), dtype=np.int64), length)
    return tid, count, note, ids


def build_text_index(notes: Sequence[MemoryNote], *, device: torch.device) -> TextIndex:
    """The BM25 index of a memory's notes (in graph order): :func:`build_text_indexes` of one
    memory."""
    return build_text_indexes([notes], device=device)[0]


def build_text_indexes(
    memories: Sequence[Sequence[MemoryNote]],
    *,
    device: torch.device,
    stores: Sequence[NoteTerms | None] | None = None,
) -> list[TextIndex]:
    """The BM25 index of each memory's notes (in graph order), every memory in one pass.

    The terms of every note are :func:`text_terms` of each of its strings (the same terms,
    read a thousand texts a pass: ASCII texts by one byte table and ``split``, the others by
    one normalization and the run pattern; a text several notes share is read once), counted
    per text (:func:`_counted`) or taken as counted from the memory's :class:`NoteTerms`;
    each memory numbers its own terms in order of first appearance (one ``numpy.unique`` of
    ``(memory, term)`` keys over the notes' distinct terms); the term-count matrix of all
    memories (block-diagonal: terms and notes offset per memory) is those counts put in
    ``(note, term)`` order by one sort and weighted by one segment-wise
    :func:`~soulmem_torch.functional.fusion.bm25_note_weights` (each memory's own IDF and
    average length); the blocks are then cut apart. Each index is the same, bit for bit, as
    the memory's alone.

    ``stores``: each memory's :class:`NoteTerms` (or ``None``), read and refreshed: the texts
    they hold are not read again (the same index, bit for bit)."""
    sizes = [len(notes) for notes in memories]
    everything = [note for notes in memories for note in notes]
    n = len(everything)
    per_note = None
    if stores is not None:
        if len(stores) != len(memories):
            raise ValidationError(
                f"stores: expected {len(memories)} (one per memory), found {len(stores)}"
            )
        per_note = [store for store, size in zip(stores, sizes) for _ in range(size)]
    tid, count, note, numbering = _note_cells(everything, per_note)
    # each memory's terms numbered in order of first appearance (what a per-note Counter
    # would give): the (memory, term) pairs in order of their first token, memory after
    # memory (the notes are), are the columns of the block-diagonal matrix
    size_arr = np.asarray(sizes, dtype=np.int64)
    memory_of_note = np.repeat(np.arange(len(sizes), dtype=np.int64), size_arr)
    column, is_first = _first_appearance(memory_of_note[note] * max(len(numbering.names), 1) + tid)
    vocab_sizes = np.bincount(memory_of_note[note[is_first]], minlength=len(sizes))
    vocab_base = [0, *np.cumsum(vocab_sizes).tolist()]
    note_base = [0, *np.cumsum(size_arr).tolist()]
    terms = tid[is_first]  # each column's term (its id in the numbering), in column order
    vocabs = [terms[vocab_base[k] : vocab_base[k + 1]] for k in range(len(sizes))]
    v_total = vocab_base[-1]
    v = max(v_total, 1)
    cells = note * v + column  # one per (note, term): sorted, they are the coalesced cells
    order = np.argsort(cells, kind="stable")  # (runs: each note's cells follow the last's)
    cells, counts = cells[order], count[order]
    cells_t = torch.from_numpy(cells)
    tf = torch.sparse_coo_tensor(
        torch.stack([cells_t // v, cells_t % v]),
        torch.from_numpy(counts).to(torch.float64),
        (n, v_total),
        is_coalesced=True,
        check_invariants=False,
    )
    segment = torch.repeat_interleave(
        torch.arange(len(sizes), dtype=torch.int64), torch.tensor(sizes, dtype=torch.int64)
    )
    weights = bm25_note_weights(tf, segment=segment)
    if len(sizes) == 1:
        weights = weights.to(device)
        return [
            TextIndex(None, weights, _term_major(weights), terms=vocabs[0], numbering=numbering)
        ]
    term_major = _term_major(weights)
    # the blocks: entries of memory k lie between its first note's (term's) and the next's
    w_index, w_values = weights.indices(), weights.values()
    t_index, t_values = term_major.indices(), term_major.values()
    w_cut = torch.searchsorted(w_index[0], torch.tensor(note_base, dtype=torch.int64)).tolist()
    t_cut = torch.searchsorted(t_index[0], torch.tensor(vocab_base, dtype=torch.int64)).tolist()
    out = []
    for k, (size, own_terms) in enumerate(zip(sizes, vocabs)):
        shift = torch.tensor([[note_base[k]], [vocab_base[k]]], dtype=torch.int64)
        a, b = w_cut[k], w_cut[k + 1]
        own = torch.sparse_coo_tensor(
            w_index[:, a:b] - shift, w_values[a:b].clone(), (size, len(own_terms)),
            is_coalesced=True, check_invariants=False,
        ).to(device)  # fmt: skip
        a, b = t_cut[k], t_cut[k + 1]
        own_t = torch.sparse_coo_tensor(
            t_index[:, a:b] - shift.flip(0), t_values[a:b].clone(), (len(own_terms), size),
            is_coalesced=True, check_invariants=False,
        ).to(device)  # fmt: skip
        out.append(TextIndex(None, own, own_t, terms=own_terms, numbering=numbering))
    return out


def _first_appearance(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(column, is_first)`` of a stream of keys: each distinct key numbered in order of its
    first appearance (``column[i]``, int64) and the positions where a key first appears —
    ``numpy.unique`` with ``return_index`` / ``return_inverse``, its keys then ranked by first
    index, done with one stable sort and linear passes."""
    m = len(key)
    if not m:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    perm = np.argsort(key, kind="stable")  # (equal keys: earliest position first)
    ordered = key[perm]
    starts = np.empty(m, dtype=bool)
    starts[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    firsts = perm[starts]
    is_first = np.zeros(m, dtype=bool)
    is_first[firsts] = True
    number = np.cumsum(is_first) - 1  # a first position's column: how many came before it
    column = np.empty(m, dtype=np.int64)
    column[perm] = number[firsts][np.cumsum(starts) - 1]
    return column, is_first


def _term_major(weights: Tensor) -> Tensor:
    """:func:`~soulmem_torch.functional.fusion.bm25_term_major` of coalesced weights (the same
    tensor): the entries put in (term, note) order by one stable sort of their terms (the
    notes are in order already)."""
    rows, cols = weights.indices()
    n, v = weights.shape
    order = torch.sort(cols, stable=True).indices
    return torch.sparse_coo_tensor(
        torch.stack([cols[order], rows[order]]),
        weights.values()[order],
        (v, n),
        is_coalesced=True,
        check_invariants=False,
    )


_ID = operator.attrgetter("id")


def _notes_of(memory: MemorySource) -> list[Any] | None:
    cluster = getattr(memory, "cluster", memory)
    notes = getattr(cluster, "notes", None)
    return list(notes()) if callable(notes) else None


def text_index(graph: MemoryGraph, memory: MemorySource) -> TextIndex | None:
    """The snapshot's text index, built once and cached; None when the notes are unknown (a bare
    ``MemoryGraph`` was passed) — the text channel then has nothing to say."""
    return text_indexes([graph], [memory])[0]


def text_indexes(
    graphs: Sequence[MemoryGraph], memories: Sequence[MemorySource]
) -> list[TextIndex | None]:
    """:func:`text_index` of each (snapshot, memory) pair, the missing indexes built in one
    pass (:func:`build_text_indexes`: what a bank's first question to many new agents wants)
    and each cached on its own snapshot."""
    if len(graphs) != len(memories):
        raise ValidationError(
            f"memories: expected {len(graphs)} (one per graph), found {len(memories)}"
        )
    key = "text_index"
    out: list[TextIndex | None] = [graph.cache.get(key) for graph in graphs]
    todo: dict[int, tuple[Any, list[Any], Any]] = {}  # id(graph) → (graph, notes, memory)
    for graph, memory, cached in zip(graphs, memories, out):
        if cached is not None or id(graph) in todo:
            continue
        notes = _notes_of(memory)
        if notes is None or len(notes) != int(graph.num_nodes):
            continue  # not cached: another caller may pass the memory with its notes
        ids = graph.ids
        if all(map(operator.is_, map(_ID, notes), ids)):
            ordered = notes  # the snapshot's own notes, in its order (its ids are theirs)
        else:
            by_id = {n.id: n for n in notes}
            ordered = [by_id.get(i) for i in ids]
            if any(n is None for n in ordered):
                continue
        todo[id(graph)] = (graph, ordered, memory)
    by_device: dict[Any, list[tuple[Any, list[Any], Any]]] = {}
    for entry in todo.values():
        by_device.setdefault(entry[0].device, []).append(entry)
    for device, group in by_device.items():
        built = build_text_indexes(
            [ordered for _, ordered, _ in group],
            device=device,
            stores=[note_terms_of(memory) for _, _, memory in group],
        )
        for (graph, _, _), index in zip(group, built):
            graph.cache[key] = index
    return [graph.cache.get(key) for graph in graphs]


def text_scores(graph: MemoryGraph, memory: MemorySource, queries: Sequence[Any]) -> Tensor:
    """BM25 of B queries (structured or text) against every note: (B, N) float64, zeros when
    the memory has no text index."""
    n = int(graph.num_nodes)
    index = text_index(graph, memory)
    if index is None or not index.num_terms:
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
    cache: dict[Any, Any] | None = None,
    terms: CandidateTerms | None = None,
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

    ``cache``: a dict kept with the memories (a bank's union snapshot's): the end-to-end
    layout of the latest set of memories asked is kept there (one slot, so a bank asked by
    ever-changing batches holds one layout, not one per batch) and reused while the same
    indexes are asked (checked by identity): a warm batch of the same agents does not
    concatenate it again. ``terms``: :func:`candidate_query_terms` of these arguments, when
    the caller keeps it (then nothing is looked up again).
    """
    if terms is None:
        terms = candidate_query_terms(indices, owners, queries, width, device=device, cache=cache)
    if terms is None:
        return torch.zeros(len(queries), int(width), dtype=torch.float64, device=device)
    return terms.bm25(width)


@dataclass(frozen=True)
class CandidateTerms:
    """B queries' terms over the end-to-end layout of their memories' text indexes
    (:func:`candidate_query_terms`): ``query_terms`` sparse COO (B, T), 1 per distinct known
    term of each query's strings (rows in order, each row's columns sorted); the layout's
    ``term_major`` (T, N) weights, ``term_start`` (T + 1,), each query's ``first_note`` (B,);
    ``term_base``: each memory's first term row; ``indices``: the memories' indexes;
    ``extras``: a dict kept with the layout (its cached term masks)."""

    query_terms: Tensor
    term_major: Tensor
    first_note: Tensor
    term_start: Tensor
    term_base: dict[int, int]
    indices: Mapping[int, TextIndex | None] | Sequence[TextIndex | None]
    extras: dict[Any, Any]

    def bm25(self, width: int) -> Tensor:
        """(B, width) float64: each query's BM25 against its own memory's notes
        (:func:`~soulmem_torch.functional.fusion.bm25_candidate_scores`)."""
        return bm25_candidate_scores(
            self.query_terms, self.term_major, self.first_note, width, term_start=self.term_start
        )

    def hits(self, width: int) -> Tensor:
        """(B, width) bool: which of its own memory's notes hold a term of each query
        (:func:`~soulmem_torch.functional.fusion.candidate_term_hits`)."""
        return candidate_term_hits(
            self.query_terms, self.term_major, self.first_note, width, term_start=self.term_start
        )

    def rows(self, rows: Tensor) -> CandidateTerms:
        """The same for the queries ``rows`` (1-D int64, ascending, distinct) only."""
        qb, qt = self.query_terms.indices()
        at = torch.full((int(self.query_terms.shape[0]),), -1, dtype=torch.int64,
                        device=qb.device)  # fmt: skip
        at[rows] = torch.arange(int(rows.shape[0]), device=qb.device)
        keep = at[qb] >= 0
        return self._with(at[qb[keep]], qt[keep], int(rows.shape[0]), self.first_note[rows])

    def without(self, words: frozenset[str]) -> CandidateTerms:
        """The same with the terms ``words`` left out of every query (the mask of each set of
        words made once per layout, kept in ``extras``)."""
        drop = self.extras.get(words)
        if drop is None:
            t = int(self.term_major.shape[0])
            cols = [
                base + c
                for p, base in self.term_base.items()
                for c in self.indices[p].term_columns(words)  # type: ignore[union-attr]
            ]
            drop = torch.zeros(t, dtype=torch.bool, device=self.term_major.device)
            drop[torch.tensor(cols, dtype=torch.int64, device=drop.device)] = True
            self.extras[words] = drop
        qb, qt = self.query_terms.indices()
        keep = ~drop[qt]
        return self._with(qb[keep], qt[keep], int(self.query_terms.shape[0]), self.first_note)

    def _with(self, qb: Tensor, qt: Tensor, b: int, first_note: Tensor) -> CandidateTerms:
        query_terms = torch.sparse_coo_tensor(
            torch.stack([qb, qt]),
            torch.ones(int(qb.shape[0]), dtype=torch.float64, device=qb.device),
            (b, int(self.query_terms.shape[1])),
            is_coalesced=True,  # a subset of coalesced entries, in order
            check_invariants=False,
        )
        return dataclasses.replace(self, query_terms=query_terms, first_note=first_note)


def candidate_query_terms(
    indices: Mapping[int, TextIndex | None] | Sequence[TextIndex | None],
    owners: Sequence[int],
    queries: Sequence[Any],
    width: int,
    *,
    device: torch.device,
    cache: dict[Any, Any] | None = None,
) -> CandidateTerms | None:
    """The queries' text-channel terms (every known term of each query's strings, looked up
    in its own memory's vocabulary: the only per-query Python of the channel, once per
    (memory, distinct strings)) over their memories' end-to-end layout, kept in ``cache``'s
    one slot (see :func:`candidate_text_scores`); ``None`` when no memory asked has an
    index."""
    b = len(queries)
    if len(owners) != b:
        raise ValidationError(f"owners: expected {b} entries (one per query), found {len(owners)}")
    used = sorted(set(owners))
    picked = tuple(indices[p] if p >= 0 else None for p in used)
    key = (tuple(used), str(device))
    kept = None if cache is None else cache.get("candidate_text_layout")
    if kept is not None and kept[0] == key and all(x is y for x, y in zip(kept[1], picked)):
        term_base, note_base, term_major, terms, term_start, extras = kept[2:]
    else:
        term_base, note_base, term_major, terms = _text_layout(used, indices, device)
        term_start = None if term_major is None else bm25_term_starts(term_major)
        extras = {}
        if cache is not None:  # one slot: the latest set of memories asked
            cache["candidate_text_layout"] = (
                key, picked, term_base, note_base, term_major, terms, term_start, extras,
            )  # fmt: skip
    if term_major is None:
        return None
    lookup = extras.get(_TERM_LOOKUP)
    if lookup is None:
        lookup = extras[_TERM_LOOKUP] = _term_lookup(used, indices, term_base)
    if lookup:
        row, col, first = _looked_up(lookup, owners, queries, note_base)
    else:
        row, col, first = _columns_per_memory(indices, owners, queries, term_base, note_base)
    query_terms = torch.sparse_coo_tensor(
        torch.from_numpy(np.stack([row, col])),
        torch.ones(int(row.size), dtype=torch.float64),
        (b, terms),
        is_coalesced=True,  # rows in order, each row's terms sorted and distinct
        check_invariants=False,
    ).to(device)
    first_note = torch.tensor(first, dtype=torch.int64, device=device)
    return CandidateTerms(
        query_terms, term_major, first_note, term_start, term_base, indices, extras
    )


_TERM_LOOKUP = ("term lookup",)  # (the key in a layout's extras: its masks are frozensets)


def _term_lookup(
    used: Sequence[int],
    indices: Mapping[int, TextIndex | None] | Sequence[TextIndex | None],
    term_base: dict[int, int],
) -> tuple[Any, dict[int, int], np.ndarray, np.ndarray] | tuple[()]:
    """Every term column of a layout by ``(memory, term id)``: ``(numbering, rank of each
    memory, sorted keys rank · 2^32 + term id, the layout column of each)`` — one
    ``searchsorted`` then finds every query's columns in its own memory. ``()`` when an index
    holds no term ids or two hold ids of different numberings (looked up memory by memory)."""
    numbering = None
    rank: dict[int, int] = {}
    keys, cols = [], []
    for p in used:
        index = indices[p] if p >= 0 else None
        if p not in term_base or index is None:
            continue
        terms = index._terms  # (the columns' term ids, read in place)
        if terms is None or (numbering is not None and index._numbering is not numbering):
            return ()
        numbering = index._numbering
        r = rank[p] = len(rank)
        keys.append(terms.astype(np.int64) + (r << 32))
        cols.append(np.arange(term_base[p], term_base[p] + len(terms), dtype=np.int64))
    if numbering is None:
        return ()
    key = np.concatenate(keys)
    order = np.argsort(key, kind="stable")
    return numbering, rank, key[order], np.concatenate(cols)[order]


def _looked_up(
    lookup: tuple[Any, dict[int, int], np.ndarray, np.ndarray],
    owners: Sequence[int],
    queries: Sequence[Any],
    note_base: dict[int, int],
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """``(row, column, first note of each query)``: the known terms of each query's strings
    in its own memory, by one ``searchsorted`` over :func:`_term_lookup`'s keys (rows in
    order, each row's columns sorted and distinct). The per-query Python left is reading a
    query's strings into term ids, once per distinct strings."""
    numbering, rank, keys, columns = lookup
    ids_of: dict[tuple[str, ...], list[int]] = {}
    per_query: list[list[int]] = []
    ranks: list[int] = []
    first: list[int] = []
    for q, p in zip(queries, owners):
        r = rank.get(p)
        if r is None:
            per_query.append([])
            ranks.append(0)
            first.append(0)
            continue
        strings = tuple(dict.fromkeys(query_strings(q)))
        ids = ids_of.get(strings)
        if ids is None:
            ids = ids_of[strings] = list(numbering.known(t for s in strings for t in _terms(s)))
        per_query.append(ids)
        ranks.append(r)
        first.append(note_base[p])
    count = np.fromiter(map(len, per_query), np.int64, len(per_query))
    row = np.repeat(np.arange(len(per_query), dtype=np.int64), count)
    if not len(row) or not len(keys):
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, first
    tid = np.fromiter(itertools.chain.from_iterable(per_query), np.int64, len(row))
    want = tid + (np.asarray(ranks, dtype=np.int64)[row] << 32)
    at = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
    hit = keys[at] == want
    row, col = row[hit], columns[at[hit]]
    order = np.lexsort((col, row))  # (a query's terms are distinct: so are its columns)
    return row[order], col[order], first


def _columns_per_memory(
    indices: Mapping[int, TextIndex | None] | Sequence[TextIndex | None],
    owners: Sequence[int],
    queries: Sequence[Any],
    term_base: dict[int, int],
    note_base: dict[int, int],
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """What :func:`_looked_up` gives, each query looked up in its memory's own index
    (:meth:`TextIndex.term_ids`): for a layout :func:`_term_lookup` cannot key."""
    b = len(queries)
    counts = [0] * b
    cols: list[int] = []
    first = [0] * b
    # a query's columns once per (memory, distinct strings): a question's concept and
    # episode queries hold the same text
    known: dict[Any, list[int]] = {}
    for j, (q, p) in enumerate(zip(queries, owners)):
        base = term_base.get(p)
        if base is None:
            continue
        first[j] = note_base[p]
        strings = tuple(dict.fromkeys(query_strings(q)))
        seen = known.get((p, strings))
        if seen is None:
            seen = known[(p, strings)] = sorted(indices[p].term_ids(strings))  # type: ignore[union-attr]
        counts[j] = len(seen)
        cols.extend(seen)
    # each query's columns offset by its memory's first term row, in one numpy pass
    count = np.asarray(counts, dtype=np.int64)
    base_of = np.asarray([term_base.get(p, 0) for p in owners], dtype=np.int64)
    col = np.asarray(cols, dtype=np.int64) + np.repeat(base_of, count)
    row = np.repeat(np.arange(b, dtype=np.int64), count)
    return row, col, first


def _text_layout(
    used: Sequence[int],
    indices: Mapping[int, TextIndex | None] | Sequence[TextIndex | None],
    device: torch.device,
) -> tuple[dict[int, int], dict[int, int], Tensor | None, int]:
    """The term-major weights of the memories ``used`` laid end to end:
    ``(term offset per memory, note offset per memory, (terms, notes) sparse COO or None when
    no memory has an index, number of terms)``."""
    term_base: dict[int, int] = {}
    note_base: dict[int, int] = {}
    parts_t, parts_n, parts_w = [], [], []
    terms = notes = 0
    for p in used:
        index = indices[p] if p >= 0 else None
        if index is None or not index.num_terms:
            continue
        t_of, n_of = index.term_major.indices()
        term_base[p], note_base[p] = terms, notes
        parts_t.append(t_of.to(device) + terms)
        parts_n.append(n_of.to(device) + notes)
        parts_w.append(index.term_major.values().to(device))
        terms += index.num_terms
        notes += int(index.weights.shape[0])
    if not parts_t:
        return term_base, note_base, None, 0
    term_major = torch.sparse_coo_tensor(
        torch.stack([torch.cat(parts_t), torch.cat(parts_n)]),
        torch.cat(parts_w),
        (terms, notes),
        is_coalesced=True,  # each memory's rows are coalesced, and the memories follow in order
        check_invariants=False,
    )
    return term_base, note_base, term_major, terms
