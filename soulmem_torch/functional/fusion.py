"""Rank fusion of retrieval channels, relative seed selection and BM25 text scores (pure torch).

The default pipeline (``DefaultPipelineConfig(fusion="rank")``) ranks a memory's notes for a
query by channels, each a score row per query (the default: the four below):

* **seeds** — the structured score of docs/spec.md §4, of the query's seeds only (:func:`relative_seeds`:
  the notes within a ratio of the best structured match); the structured channel votes for what
  the query asked for, not for the near misses of the same kind;
* **text** — BM25 over the whole note's text (every kind; :func:`bm25_note_weights` +
  :func:`bm25_scores`);
* **graph** — Personalized PageRank from the seeds (or, :func:`ppr_start`, from every note the
  first stage or the text channel scored) along the links as the original follows them
  (source → target);
* **graph_undirected** — the same PageRank with every link walkable both ways
  (:func:`undirected_edges`): notes that link *to* a seed count too.

(``similarity`` — every structured score, not only the seeds' — is a channel as well: the
"similarity only" row of an ablation, or the first fused default.) The pipeline fuses them by
reciprocal rank (:func:`reciprocal_rank`, :func:`rank_fusion`): a note's score
is ``Σ_c 1 / (k + rank_c)`` over the channels that scored it. Ranks are scale-free, so channels
with unlike score scales (cosines, BM25 sums, PPR mass) mix without fitted weights; a channel
that has nothing to say about a note (score 0) gives it nothing, as in the usual reciprocal-rank
fusion (``unscored="tie"`` instead ranks all such notes as one tie at the block's mean rank).

Interface (every function follows its inputs' device; nothing here loops over queries or notes):

==============================  ===============================================================
argument                        meaning
==============================  ===============================================================
``scores``                      (B, N) float. One row per query, one column per note.
``mask``                        (B, N) bool or None. Which columns are real notes of the row's
                                memory (False: padding, e.g. another agent's notes in a padded
                                per-agent candidate row); masked entries score 0 and never count.
``tf``                          sparse COO (N, V). Term counts of each note.
``segment``                     (N,) int64 or None. Which memory each note belongs to, for a
                                disjoint union of memories: BM25's document frequencies and
                                average length are computed per segment, so each memory scores
                                exactly as on its own.
==============================  ===============================================================

Statistics are per memory: IDF and the average note length come from one memory's notes (or
from one segment of a disjoint union), never from a global corpus.
"""

from __future__ import annotations

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.topk import SORT_MAX_ROW, _first_k, stable_topk

__all__ = [
    "family_weights",
    "score_dispersion",
    "BM25_B",
    "BM25_K1",
    "bm25_candidate_scores",
    "candidate_term_hits",
    "bm25_term_starts",
    "bm25_note_weights",
    "bm25_scores",
    "bm25_term_major",
    "mix_row_pairs",
    "ppr_start",
    "reach_one_hop",
    "rank_fusion",
    "reciprocal_rank",
    "relative_seeds",
    "undirected_edges",
]

BM25_K1 = 1.2
"""BM25 term-frequency saturation (the usual Robertson / Lucene default)."""
BM25_B = 0.75
"""BM25 length normalization (the usual Robertson / Lucene default)."""


def _mask_of(scores: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return torch.ones_like(scores, dtype=torch.bool)
    if mask.shape != scores.shape:
        raise ValidationError(
            f"mask: expected shape {tuple(scores.shape)}, found {tuple(mask.shape)}"
        )
    return mask.to(torch.bool)


def reciprocal_rank(
    scores: Tensor, *, k: float, mask: Tensor | None = None, unscored: str = "zero"
) -> Tensor:
    """``1 / (k + rank)`` per entry of each row; rank 1 = the row's highest positive score.

    Positive scores are ranked in descending order (equal scores: lower column first — the
    order every list of this library keeps). Entries ``<= 0`` or non-finite carry no evidence:
    with ``unscored="zero"`` (default, the usual reciprocal-rank fusion) they give 0; with
    ``"tie"`` they form one tie block ranked after the positives, each at the block's mean rank
    ``n_pos + (n_rest + 1) / 2`` (fractional ranking). Masked entries give 0 and are not counted.

    Args:
        scores: shape (B, N), float.
        k: > 0. Rank smoothing: larger k flattens the differences between ranks.
        mask: shape (B, N) bool or None (all real).
        unscored: ``"zero"`` or ``"tie"``, what an entry without evidence gets.

    Returns:
        (B, N) float64 in ``[0, 1 / (k + 1)]``.
    """
    if not k > 0:
        raise ValidationError(f"k: expected a number > 0, found {k!r}")
    if unscored not in ("zero", "tie"):
        raise ValidationError(f"unscored: expected 'zero' or 'tie', found {unscored!r}")
    real = _mask_of(scores, mask)
    s = scores.to(torch.float64)
    positive = real & (s > 0) & (s < float("inf"))  # finite and > 0 (NaN compares False)
    rr = _positive_reciprocal_ranks(s, positive, k)
    if unscored == "zero":
        return rr
    n_pos = positive.sum(dim=1, keepdim=True).to(torch.float64)
    n_rest = real.sum(dim=1, keepdim=True).to(torch.float64) - n_pos
    rest = 1.0 / (k + n_pos + (n_rest + 1.0) / 2.0)
    return torch.where(positive, rr, torch.where(real, rest, 0.0))


def _first_sorted(key: Tensor, k: int) -> Tensor:
    """Column indices of the first ``k`` entries of each row's stable descending sort of
    ``key`` (no NaN; ``-inf`` = not selectable, order among them unspecified), in that order:
    on the CPU for rows up to ``SORT_MAX_ROW`` long ``topk._first_k`` (a top-k with an
    exactness check, or one sort), else :func:`~soulmem_torch.functional.topk.stable_topk`."""
    if (
        key.device.type == "cpu"
        and key.shape[1] <= SORT_MAX_ROW
        and key.dtype in (torch.float32, torch.float64)
    ):
        return _first_k(key, k)
    return stable_topk(key, k)[1]


def _positive_reciprocal_ranks(s: Tensor, positive: Tensor, k: float) -> Tensor:
    """(B, N) float64: ``1 / (k + rank)`` at each positive entry, its 1-based rank among its
    row's positive entries (descending; equal scores: lower column first); 0 elsewhere."""
    b, n = s.shape
    out = torch.zeros(b, n, dtype=torch.float64, device=s.device)
    if n == 0 or b == 0:
        return out
    most = int(positive.sum(dim=1).max())
    if most == 0:
        return out
    key = torch.where(positive, s, float("-inf"))
    order = _first_sorted(key, most)
    ranks = torch.arange(1, most + 1, device=s.device).to(torch.float64)
    out.scatter_(1, order, (1.0 / (k + ranks)).expand(b, most))
    return out.mul_(positive)  # rows with fewer positives: their tail of ``order`` → 0


def rank_fusion(
    channels: list[Tensor] | tuple[Tensor, ...],
    *,
    k: float,
    mask: Tensor | None = None,
    unscored: str = "zero",
    weights: list[Tensor | None] | tuple[Tensor | None, ...] | None = None,
) -> Tensor:
    """Reciprocal-rank fusion: ``Σ_c w_c · reciprocal_rank(channels[c])``, shape (B, N) float64.

    Args:
        channels: each (B, N) float, the same shape. An empty sequence is an error.
        k: > 0. See :func:`reciprocal_rank`.
        mask: (B, N) bool or None.
        unscored: ``"zero"`` (default) or ``"tie"``. See :func:`reciprocal_rank`.
        weights: one (B,) float64 row weight per channel (``None``: 1), or ``None`` (all 1).
    """
    if not channels:
        raise ValidationError("channels: expected at least one (B, N) score tensor, found none")
    shape = channels[0].shape
    for i, c in enumerate(channels):
        if c.dim() != 2 or c.shape != shape:
            raise ValidationError(
                f"channels[{i}]: expected shape {tuple(shape)} (2-D), found {tuple(c.shape)}"
            )
    if weights is not None and len(weights) != len(channels):
        raise ValidationError(
            f"weights: expected {len(channels)} (one per channel), found {len(weights)}"
        )
    if not k > 0:
        raise ValidationError(f"k: expected a number > 0, found {k!r}")
    stacked = None
    if unscored == "zero" and len(channels) > 1 and shape[0] and shape[1]:
        # every channel's ranks in one pass: the rows of all channels stacked (each row is
        # ranked on its own, so the same ranks as one channel at a time)
        real = _mask_of(channels[0], mask)
        s = torch.stack([c.to(torch.float64) for c in channels])  # (C, B, N)
        positive = real & (s > 0) & (s < float("inf"))
        stacked = _positive_reciprocal_ranks(
            s.view(-1, shape[1]), positive.view(-1, shape[1]), k
        ).view(s.shape)
    total = None
    for i, c in enumerate(channels):
        rr = (
            reciprocal_rank(c, k=k, mask=mask, unscored=unscored) if stacked is None else stacked[i]
        )
        w = None if weights is None else weights[i]
        if w is not None:
            if w.shape != (shape[0],):
                raise ValidationError(
                    f"weights[{i}]: expected shape ({shape[0]},), found {tuple(w.shape)}"
                )
            rr = rr * w.to(torch.float64).unsqueeze(1)
        total = rr if total is None else total + rr
    return total


def score_dispersion(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """How much each row's best score stands out: ``(max − mean) / max`` over the row's
    (masked) entries, in [0, 1]; 0 for a row whose max is not positive. Shape (B,) float64.

    A channel whose scores are flat (every note about as good as the best) says little about
    which note is meant; one whose best stands far above the rest says much. Scale-free, so
    cosines and BM25 sums compare (docs/spec.md §7, DECISION "channel weights").

    Args:
        scores: (B, N) float; non-finite entries count as 0.
        mask: (B, N) bool or None (every entry).
    """
    real = _mask_of(scores, mask)
    x = torch.where(real & torch.isfinite(scores), scores.to(torch.float64), 0.0)
    if x.shape[1] == 0:
        return torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    best = x.max(dim=1).values
    mean = x.sum(dim=1) / real.sum(dim=1).clamp(min=1)
    return torch.where(best > 0, (best - mean) / torch.where(best > 0, best, 1.0), 0.0)


def family_weights(dispersions: list[Tensor]) -> list[Tensor]:
    """Each family's dispersion over the largest of the row: the most decided family weighs 1
    (a row where every family is flat: 1 for all). (B,) float64 each."""
    top = torch.stack(dispersions).max(dim=0).values
    flat = top <= 0
    return [torch.where(flat, 1.0, d / torch.where(flat, 1.0, top)) for d in dispersions]


def relative_seeds(
    scores: Tensor,
    *,
    ratio: float,
    max_seeds: int,
    threshold: float = 0.0,
    mask: Tensor | None = None,
) -> Tensor:
    """Seeds of each row: scores ``>= ratio · row max``, ``>= threshold`` and ``> 0``, at most
    ``max_seeds`` of them (the highest; equal scores: lower column first).

    A relative cut is scale-free: a query whose best match stands out gets one seed and leaves
    room for association; a query with several equally good matches seeds them all.

    Args:
        scores: shape (B, N), float.
        ratio: in [0, 1]. 1 keeps only the best (and its exact ties).
        max_seeds: >= 1.
        threshold: absolute floor (the similarity config's ``similarity_threshold``).
        mask: (B, N) bool or None.

    Returns:
        (B, N) bool.
    """
    if not 0.0 <= ratio <= 1.0:
        raise ValidationError(f"ratio: expected a number in [0, 1], found {ratio!r}")
    if max_seeds < 1:
        raise ValidationError(f"max_seeds: expected an integer >= 1, found {max_seeds!r}")
    real = _mask_of(scores, mask)
    ok = real & torch.isfinite(scores) & (scores > 0) & (scores >= threshold)
    key = torch.where(ok, scores, torch.full_like(scores, float("-inf")))
    if scores.shape[1] == 0:
        return ok
    best = key.max(dim=1, keepdim=True).values
    ok = ok & (key >= best * ratio)
    m = min(int(max_seeds), scores.shape[1])
    if m < scores.shape[1] and int(ok.sum(dim=1).max()) > m:  # else every candidate fits
        order = _first_sorted(key, m)
        top = torch.zeros_like(ok)
        top.scatter_(1, order, True)
        ok = ok & top
    return ok


def ppr_start(
    mode: str,
    seeds: Tensor,
    seed_weights: Tensor,
    first_stage: Tensor,
    text: Tensor | None = None,
    *,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """What the graph channels' PPR starts from, ``(weights (B, N) float64, keys (B, N) bool)``
    (the pipeline's ``personalization``, docs/spec.md §7 DECISION "what the graph starts from").

    * ``"seeds"``: ``(seed_weights, seeds)`` unchanged — the relative cut.
    * ``"first_stage"``: every note with a positive, finite first-stage score, by that score.
    * ``"text"``: every note with a positive text score, by that score; a row without one (no
      text evidence, or ``text`` ``None``: no texts) falls back to its first stage.

    Args:
        mode: one of the three above.
        seeds: (B, N) bool, the seeds. seed_weights: (B, N) float, their personalization.
        first_stage: (B, N) float, what picked the seeds (0 where it scored nothing).
        text: (B, N) float or None, the text channel.
        mask: (B, N) bool or None: real entries.
    """
    if mode == "seeds":
        return seed_weights.to(torch.float64), seeds
    if mode not in ("first_stage", "text"):
        raise ValidationError(f"mode: expected 'seeds', 'first_stage' or 'text', found {mode!r}")
    real = _mask_of(first_stage, mask)
    src = first_stage.to(torch.float64)
    if mode == "text" and text is not None:
        t = text.to(torch.float64)
        has = (real & torch.isfinite(t) & (t > 0)).any(dim=1, keepdim=True)
        src = torch.where(has, t, src)
    keys = real & torch.isfinite(src) & (src > 0)
    return torch.where(keys, src, 0.0), keys


def bm25_note_weights(
    tf: Tensor,
    *,
    segment: Tensor | None = None,
    k1: float = BM25_K1,
    b: float = BM25_B,
) -> Tensor:
    """BM25 weight of every (note, term) of a term-count matrix, per memory.

    ``w(d, t) = idf(t) · tf (k1 + 1) / (tf + k1 (1 − b + b · |d| / avgdl))`` with
    ``idf(t) = ln(1 + (n − df + 0.5) / (df + 0.5))`` (always positive), ``n`` the number of notes,
    ``df`` the notes containing t and ``avgdl`` the mean note length — all counted within the
    note's own segment.

    Args:
        tf: sparse COO (N, V), term counts >= 0.
        segment: (N,) int64 segment id of each note, or None (one memory).
        k1: >= 0. b: in [0, 1].

    Returns:
        Sparse COO (N, V) float64, coalesced.
    """
    if not tf.is_sparse or tf.dim() != 2:
        raise ValidationError(f"tf: expected a 2-D sparse COO tensor, found layout {tf.layout}")
    tf = tf.coalesce()
    n, v = tf.shape
    rows, cols = tf.indices()
    vals = tf.values().to(torch.float64)
    device = vals.device
    seg = (
        torch.zeros(n, dtype=torch.int64, device=device)
        if segment is None
        else segment.to(device=device, dtype=torch.int64)
    )
    if seg.shape != (n,):
        raise ValidationError(f"segment: expected shape ({n},), found {tuple(seg.shape)}")
    if n and int(seg.min()) < 0:
        raise ValidationError(f"segment: expected ids >= 0, found {int(seg.min())}")
    if vals.numel() and not bool(torch.isfinite(vals).all() and (vals >= 0).all()):
        raise ValidationError("tf: expected finite term counts >= 0, found a negative or NaN one")
    num_seg = int(seg.max()) + 1 if n else 0
    notes_per_seg = torch.zeros(num_seg, dtype=torch.float64, device=device)
    notes_per_seg.index_add_(0, seg, torch.ones(n, dtype=torch.float64, device=device))
    length = torch.zeros(n, dtype=torch.float64, device=device).index_add_(0, rows, vals)
    seg_len = torch.zeros(num_seg, dtype=torch.float64, device=device).index_add_(0, seg, length)
    avgdl = seg_len / notes_per_seg.clamp(min=1.0)
    # document frequency of each (segment, term): entries are unique per (note, term)
    entry_seg = seg[rows]
    df_entry = _document_frequency(entry_seg, cols, v)
    # one value per entry (millions in a bank's union): each step in place on a fresh gather,
    # the operations and their order those of the formula (so the same bits)
    idf = notes_per_seg[entry_seg].sub_(df_entry).add_(0.5)  # n - df + 0.5
    idf.div_(df_entry.add_(0.5)).log1p_()
    avg = avgdl[entry_seg]
    live = avg > 0
    norm = length[rows].div_(avg.masked_fill_(~live, 1.0)).masked_fill_(~live, 1.0)  # |d| / avgdl
    # w = idf · tf (k1 + 1) / (tf + k1 (1 − b + b · norm))
    w = idf.mul_(vals).mul_(k1 + 1.0).div_(norm.mul_(b).add_(1.0 - b).mul_(k1).add_(vals))
    # tf's (coalesced) indices: the weights are coalesced as they stand
    return torch.sparse_coo_tensor(
        tf.indices(), w, (n, v), is_coalesced=True, check_invariants=False
    )


def _document_frequency(entry_seg: Tensor, cols: Tensor, v: int) -> Tensor:
    """The number of entries of each entry's (segment, column), float64 (exact counts). When
    every column's entries lie in one segment (a block-diagonal matrix of many memories: each
    memory its own columns), one count per column; else one ``unique`` of the keys."""
    device = entry_seg.device
    if not cols.numel():
        return torch.zeros(0, dtype=torch.float64, device=device)
    owner = torch.full((v,), -1, dtype=torch.int64, device=device)
    owner[cols] = entry_seg  # (any one entry's segment per column: checked next)
    if bool((owner[cols] == entry_seg).all()):
        return torch.bincount(cols, minlength=v).to(torch.float64)[cols]
    uniq, inverse = torch.unique(entry_seg * v + cols, return_inverse=True)
    df = torch.zeros(uniq.shape[0], dtype=torch.float64, device=device)
    df.index_add_(0, inverse, torch.ones(cols.shape[0], dtype=torch.float64, device=device))
    return df[inverse]


def bm25_term_major(note_weights: Tensor) -> Tensor:
    """``note_weights`` (N, V) transposed to a coalesced (V, N) COO tensor (term-major), the
    layout :func:`bm25_scores` reads; compute it once per index and pass it as ``term_major``."""
    return note_weights.t().coalesce()


def bm25_scores(
    query_terms: Tensor, note_weights: Tensor, *, term_major: Tensor | None = None
) -> Tensor:
    """BM25 score of every (query, note): ``Σ_t q(t) · w(note, t)``, shape (B, N) float64.

    Only the postings of the query's own terms are read: each query term's column of
    ``note_weights`` is gathered and summed into its row (one ``index_put_`` for the batch), so
    the cost is the number of (query term, note) matches, on any device.

    Args:
        query_terms: (B, V) float, sparse COO or dense: 1 for each distinct query term (or
            counts).
        note_weights: sparse COO (N, V) from :func:`bm25_note_weights`.
        term_major: :func:`bm25_term_major` of ``note_weights`` (computed here when None).
    """
    if query_terms.dim() != 2 or query_terms.shape[1] != note_weights.shape[1]:
        raise ValidationError(
            f"query_terms: expected shape (B, {note_weights.shape[1]}), "
            f"found {tuple(query_terms.shape)}"
        )
    b, (n, v) = query_terms.shape[0], note_weights.shape
    device = note_weights.device
    out = torch.zeros(b, n, dtype=torch.float64, device=device)
    if n == 0 or b == 0 or v == 0:
        return out
    tm = bm25_term_major(note_weights) if term_major is None else term_major
    posting = _postings(query_terms, tm)
    if posting is not None:
        # one 1-D index_add_ in posting order (each query's terms in term order): the same sums
        # in the same order whatever the batch, so a query scores the same bits alone or in a
        # batch (equal BM25 scores stay exactly equal: their tie order is then the notes' order)
        row, note, value = posting
        out.view(-1).index_add_(0, row * n + note, value)
    return out


def bm25_candidate_scores(
    query_terms: Tensor,
    term_major: Tensor,
    first_note: Tensor,
    width: int,
    *,
    term_start: Tensor | None = None,
) -> Tensor:
    """BM25 of B queries each against its own memory of a disjoint union: (B, width) float64,
    column ``j`` of row ``b`` the score of note ``first_note[b] + j``.

    The union's term rows are per memory (a term of two memories is two rows), so a query's
    terms — rows of its own memory — reach only its memory's postings; the sums run in the
    order :func:`bm25_scores` runs them, so each row has the same bits as that memory scored
    on its own.

    Args:
        query_terms: (B, V) sparse COO or dense, over the union's term rows.
        term_major: coalesced sparse COO (V, N) of the union's BM25 weights (term-major).
        first_note: (B,) int64, the union index of each query's memory's first note.
        width: >= the largest memory's note count.
        term_start: (V + 1,) int64, where each term row's postings start in ``term_major``
            (:func:`bm25_term_starts`), when the caller keeps it with ``term_major``;
            ``None``: counted here.

    Raises:
        ValidationError: bad shapes, or a query term whose postings fall outside its row's
            ``[first_note, first_note + width)``.
    """
    posting = _candidate_postings(query_terms, term_major, first_note, width, term_start)
    out = torch.zeros(
        int(query_terms.shape[0]), int(width), dtype=torch.float64, device=term_major.device
    )
    if posting is not None:
        row, local, value = posting
        out.view(-1).index_add_(0, row * width + local, value)  # (see bm25_scores)
    return out


def _candidate_postings(
    query_terms: Tensor,
    term_major: Tensor,
    first_note: Tensor,
    width: int,
    term_start: Tensor | None,
    *,
    weighted: bool = True,
) -> tuple[Tensor, Tensor, Tensor | None] | None:
    """The arguments of :func:`bm25_candidate_scores` / :func:`candidate_term_hits` checked,
    and every posting of the queries' terms as ``(query, column in the query's own rows,
    q(t) · w(note, t) or None when not ``weighted``)`` (:func:`_postings`); None when none."""
    b = int(query_terms.shape[0])
    if query_terms.dim() != 2 or query_terms.shape[1] != term_major.shape[0]:
        raise ValidationError(
            f"query_terms: expected shape (B, {term_major.shape[0]}), "
            f"found {tuple(query_terms.shape)}"
        )
    if first_note.shape != (b,):
        raise ValidationError(f"first_note: expected shape ({b},), found {tuple(first_note.shape)}")
    if b == 0 or width == 0 or term_major.shape[0] == 0:
        return None
    posting = _postings(query_terms, term_major, term_start, weighted=weighted)
    if posting is None:
        return None
    row, note, value = posting
    local = note - first_note.to(term_major.device)[row]
    if bool(((local < 0) | (local >= width)).any()):
        raise ValidationError(
            "query_terms: a query's term reaches notes outside its memory's rows "
            f"[first_note, first_note + {width})"
        )
    return row, local, value


def bm25_term_starts(term_major: Tensor) -> Tensor:
    """(V + 1,) int64: where each term row's postings start in a coalesced term-major COO
    (V, N), and the end (its CSR row pointer)."""
    v = int(term_major.shape[0])
    count = torch.bincount(term_major.indices()[0], minlength=v)
    out = torch.zeros(v + 1, dtype=torch.int64, device=term_major.device)
    torch.cumsum(count, 0, out=out[1:])
    return out


def _postings(
    query_terms: Tensor,
    term_major: Tensor,
    term_start: Tensor | None = None,
    *,
    weighted: bool = True,
) -> tuple[Tensor, Tensor, Tensor | None] | None:
    """Every (query, note, ``q(t) · w(note, t)``) posting of the queries' terms, queries in
    order, each query's terms in term order, each term's notes in order (the product ``None``
    when not ``weighted``); None when none."""
    device = term_major.device
    q = query_terms.to(device)
    q = q.coalesce() if q.is_sparse else q.to_sparse()
    qb, qt = q.indices()
    crow = bm25_term_starts(term_major) if term_start is None else term_start
    first_of = crow[qt]
    pos, run = _ranges(first_of, crow[qt + 1] - first_of)
    if pos.numel() == 0:
        return None
    note = term_major.indices()[1][pos]
    if not weighted:
        return qb[run], note, None
    qv = q.values().to(torch.float64)
    w = term_major.values().to(torch.float64)
    return qb[run], note, qv[run] * w[pos]


def undirected_edges(edge_index: Tensor, edge_weight: Tensor) -> tuple[Tensor, Tensor]:
    """Every edge and its reverse with the same weight: ``(2, 2E)`` and ``(2E,)``.

    Building a transition operator from the result
    (:func:`~soulmem_torch.functional.transition.build_transition`) gives the walk that follows
    links either way: each note's neighbours are its targets and its sources, weighted as the
    links are. An edge and its own reverse become parallel edges (summed); a self loop counts
    twice. On a disjoint union of graphs the result is the union of each graph's.

    Args:
        edge_index: shape (2, E), integer.
        edge_weight: shape (E,), float.
    """
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValidationError(f"edge_index: expected shape (2, E), found {tuple(edge_index.shape)}")
    if edge_weight.shape != (edge_index.shape[1],):
        raise ValidationError(
            f"edge_weight: expected shape ({edge_index.shape[1]},), "
            f"found {tuple(edge_weight.shape)}"
        )
    return (
        torch.cat([edge_index, edge_index.flip(0)], dim=1),
        torch.cat([edge_weight, edge_weight]),
    )


def mix_row_pairs(
    values: Tensor, index: Tensor, valid: Tensor, *, top_k: int | None = None
) -> tuple[Tensor, Tensor, Tensor] | None:
    """The question mix (``retrieve.questions.question_results``) of one kind of list on the
    tensors of a stable top-k:
    rows ``2i`` and ``2i + 1`` (question ``i``'s concept and episode queries, the same
    candidates) → one row of ``2k`` entries, best first.

    An entry of the second row whose candidate the first row also lists is merged into the
    first's (its score when strictly greater, as ``mix_by_priority`` keeps the first-seen
    score on ties); the entries are then ordered by score descending, ties in first-seen
    order (the first row's entries, then the second's), the invalid ones last; ``top_k`` cuts
    to the first ``top_k``. The same lists, bit for bit, as
    :func:`~soulmem_torch.retrieve.priority.mix_by_priority_batch` of the two lists.

    Args:
        values: (2Q, k) float scores (compared and returned as float64).
        index: (2Q, k) int64 candidate columns.
        valid: (2Q, k) bool, which entries are real.
        top_k: >= 0, or None (every entry).

    Returns:
        ``(values (Q, K) float64, index (Q, K), valid (Q, K))`` with ``K = min(2k, top_k)``,
        or ``None`` when a valid score is NaN (its order is Python's: the caller mixes the
        lists).
    """
    rows, k = int(values.shape[0]), int(values.shape[1])
    if rows % 2:
        raise ValidationError(
            f"values: expected a (concept, episode) pair of rows per question, found {rows} rows"
        )
    q = rows // 2
    v = values.to(torch.float64).reshape(q, 2 * k)
    ix = index.reshape(q, 2 * k)
    ok = valid.reshape(q, 2 * k)
    if bool(torch.isnan(v).logical_and_(ok).any()):
        return None
    if k == 0:  # no entries (no candidates)
        return v, ix, ok
    a_v, b_v = v[:, :k], v[:, k:]
    a_ok, b_ok = ok[:, :k], ok[:, k:]
    # (q, k_b, k_a): entry t of the second list names the candidate of entry s of the first
    same = (ix[:, k:].unsqueeze(2) == ix[:, :k].unsqueeze(1)) & b_ok.unsqueeze(2)
    same &= a_ok.unsqueeze(1)
    neg_inf = torch.tensor(float("-inf"), dtype=torch.float64, device=v.device)
    other = torch.where(same, b_v.unsqueeze(2), neg_inf).amax(dim=1)  # (q, k_a)
    merged = torch.cat([torch.where(other > a_v, other, a_v), b_v], dim=1)
    keep = torch.cat([a_ok, b_ok & ~same.any(dim=2)], dim=1)
    key = torch.where(keep, merged, neg_inf)
    order = torch.sort(key, dim=1, descending=True, stable=True).indices
    # the kept entries first (a kept -inf ties with the dropped ones): a stable partition
    kept = keep.gather(1, order)
    order = order.gather(1, torch.sort((~kept).to(torch.uint8), dim=1, stable=True).indices)
    if top_k is not None:
        order = order[:, : max(0, int(top_k))]
    return merged.gather(1, order), ix.gather(1, order), keep.gather(1, order)


def _ranges(start: Tensor, count: Tensor) -> tuple[Tensor, Tensor]:
    """``cat([arange(s, s + n) for s, n in zip(start, count)])`` and each entry's run number,
    without a Python loop (one ``repeat_interleave`` each)."""
    total = int(count.sum()) if count.numel() else 0
    run = torch.repeat_interleave(torch.arange(int(count.shape[0]), device=count.device), count,
                                  output_size=total)  # fmt: skip
    shift = start - (torch.cumsum(count, 0) - count)
    return torch.arange(total, device=count.device) + shift[run], run


def candidate_term_hits(
    query_terms: Tensor,
    term_major: Tensor,
    first_note: Tensor,
    width: int,
    *,
    term_start: Tensor | None = None,
) -> Tensor:
    """Which notes hold a term of each query, each query against its own memory of a disjoint
    union (as :func:`bm25_candidate_scores` lays them out): (B, width) bool, column ``j`` of
    row ``b`` note ``first_note[b] + j``; ``True`` where the note has a posting (a stored
    entry of ``term_major``, whatever its weight) of one of the query's terms.

    Args:
        query_terms: (B, V) sparse COO over the union's term rows (its values unread).
        term_major: coalesced sparse COO (V, N) (term-major postings).
        first_note: (B,) int64.
        width: >= the largest memory's note count.
        term_start: (V + 1,) int64 (:func:`bm25_term_starts`), or ``None``: counted here.

    Raises:
        ValidationError: bad shapes, or a posting outside its row's ``[first_note,
            first_note + width)``.
    """
    posting = _candidate_postings(
        query_terms, term_major, first_note, width, term_start, weighted=False
    )
    out = torch.zeros(
        int(query_terms.shape[0]), int(width), dtype=torch.bool, device=term_major.device
    )
    if posting is not None:
        row, local, _ = posting
        out.view(-1)[row * int(width) + local] = True
    return out


def reach_one_hop(
    hits: Tensor,
    edge_index: Tensor,
    edge_start: Tensor,
    edge_count: Tensor,
    node_start: Tensor,
) -> Tensor:
    """``hits`` widened by one hop along the links, either way: (R, W) bool, entry ``(r, j)``
    ``True`` where ``hits[r, j]`` is, or where a link joins node ``j`` to a node ``hits[r]``
    marks (``j`` its source or its target).

    Row ``r``'s links are ``edge_index[:, edge_start[r] : edge_start[r] + edge_count[r]]``
    (global node numbers; node ``node_start[r] + j`` is column ``j``) — a block of a disjoint
    union, or one memory's every link.

    Args:
        hits: (R, W) bool.
        edge_index: (2, E) int64.
        edge_start / edge_count / node_start: (R,) int64.
    """
    r, w = int(hits.shape[0]), int(hits.shape[1])
    if r == 0 or w == 0:
        return hits.clone()
    pos, run = _ranges(edge_start, edge_count)
    out = hits.clone()
    if pos.numel() == 0:
        return out
    base = run * w - node_start.index_select(0, run)
    src = edge_index[0].index_select(0, pos) + base  # flat (row, column) of each end
    dst = edge_index[1].index_select(0, pos) + base
    flat, seen = out.view(-1), hits.reshape(-1)
    flat[src[seen[dst]]] = True
    flat[dst[seen[src]]] = True
    return out
