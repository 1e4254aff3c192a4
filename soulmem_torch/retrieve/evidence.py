"""Leaving out results that matched nothing the query said (``ask(..., only_matching=True)``).

Every channel of the default pipeline scores notes a query never mentioned: the offline
``HashingEmbedder`` gives any two non-empty texts a cosine of at least 0.3, the seeds channel
always takes the best structured match however poor, and PPR spreads from those seeds. So
``ask("a rainy afternoon")`` on a memory without rain still returns notes. This filter keeps a
result only when it has **evidence**:

* the note **matches** the query: it shares a text term with it (the text channel's terms —
  words, and CJK character bigrams — over every string of the note's content, as
  :func:`~soulmem_torch.retrieve.text.note_strings` reads it), function words
  (:data:`STOP_TERMS`: "a", "the", "who", "我的", …) left aside; or
* the note is **linked** (either way, one hop) to a note of the memory that matches — the
  association a matching memory brings to mind (``sem_grandma`` for "who taught me the cake?").

A question no note matches gets no memories and no actions. Scores of the kept results are
unchanged (rank-fusion scores, see README "What a score means"); the filter only removes rows.
It is a Python pass over each query's few results (≤ ``merge_top_k`` memories and the actions),
never over the memory's notes; the note terms are cached per cluster version.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from soulmem_torch.retrieve.text import CandidateTerms

from soulmem_torch.functional.fusion import reach_one_hop
from soulmem_torch.retrieve.text import note_strings, query_strings, text_terms

__all__ = ["STOP_TERMS", "candidate_evidence", "keep_matching", "query_terms"]

#: Terms that say nothing about content, so are no evidence: English function words and common
#: Chinese function characters and bigrams (the text channel still scores them, weighted by
#: BM25's IDF).
STOP_TERMS = frozenset(
    """
    a an the and or but if of to in on at by for with from into onto about as than then so
    is am are was were be been being do does did doing have has had having will would shall
    should can could may might must not no nor
    i me my mine myself we us our ours you your yours he him his she her hers it its they them
    their theirs this that these those there here what which who whom whose when where why how
    all any some each every more most other such only own same too very just also again ever
    up down out off over under once s t don didn isn wasn
    的 了 是 在 我 你 他 她 它 们 吗 呢 吧 啊 和 与 及 或 也 都 就 还 又 这 那 哪 谁 什 么
    我的 你的 他的 她的 是我 我是 你是 他是 她是 我们 你们 他们 她们 谁是 是谁 什么 这个 那个
    一个 有没 没有 的是 了吗 是不 不是 吗？ 怎么 为什 为何 哪里 哪儿 时候
    """.split()
)


def query_terms(query: Any) -> frozenset[str]:
    """The text terms of a free-text question or a structured query's strings."""
    return frozenset(t for s in query_strings(query) for t in text_terms(s)) - STOP_TERMS


def _note_terms(cluster: Any, note_id: Any, cache: Any) -> Collection[str]:
    terms = cache.get(note_id)
    if terms is None:
        entry = cluster.get(note_id)
        terms = (
            frozenset()
            if entry is None
            else frozenset(t for s in note_strings(entry.note) for t in text_terms(s))
        )
        cache[note_id] = terms
    return terms


class _IndexTerms:
    """Each note's terms read off the text index of a snapshot (the text channel's: the same
    terms, already counted), made on first use per note — only the notes a filter checks and
    their neighbours, not every note of the memory — and kept (a ``dict``'s ``get``)."""

    __slots__ = ("_built", "_cols", "_graph", "_index", "_starts", "_words")

    def __init__(self, graph: Any, index: Any) -> None:
        import torch

        rows, cols = index.weights.indices()
        counts = torch.bincount(rows, minlength=int(graph.num_nodes))
        starts = torch.zeros(int(graph.num_nodes) + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=starts[1:])
        self._graph, self._starts, self._cols = graph, starts, cols
        self._words: list[str] | None = None  # column order: terms numbered as first met
        self._built: dict[Any, Collection[str]] = {}
        self._index = index

    def get(self, note_id: Any) -> Collection[str] | None:
        terms = self._built.get(note_id)
        if terms is None:
            row = self._graph.index_of.get(note_id)
            if row is None:
                return None
            if self._words is None:
                self._words = self._index.term_names()
            lo, hi = int(self._starts[row]), int(self._starts[row + 1])
            # a tuple (its terms are distinct): a quarter of a frozenset's memory, and only
            # ever iterated (into a note's reach set)
            terms = tuple(map(self._words.__getitem__, self._cols[lo:hi].tolist()))
            self._built[note_id] = terms
        return terms

    def __setitem__(self, note_id: Any, terms: Collection[str]) -> None:
        self._built[note_id] = terms


def _terms_of_index(cluster: Any) -> Any:
    """Every note's terms read off the text index of the cluster's current snapshot when one
    was built (:class:`_IndexTerms`), else an empty dict (:func:`_note_terms` then reads each
    note asked about)."""
    import torch

    graph = cluster.cached(("graph", torch.device("cpu")))
    index = None if graph is None else graph.cache.get("text_index")
    if index is None:
        return {}
    return _IndexTerms(graph, index)


def _reach_cache(cluster: Any) -> tuple[Any, dict[Any, frozenset[str]]]:
    """``(note terms, reach terms)`` of this cluster version (built empty, filled per note)."""
    return cluster.derived(("evidence_terms",), lambda: (_terms_of_index(cluster), {}))


def _reach_terms(cluster: Any, note_id: Any, caches: Any = None) -> frozenset[str]:
    """The terms of a note and of its neighbours (one hop, either way), cached per cluster
    version (``caches``: :func:`_reach_cache`'s pair, read once per filter call): after a
    note's first check, checking it is one set intersection."""
    own, reach = _reach_cache(cluster) if caches is None else caches
    terms = reach.get(note_id)
    if terms is None:
        neighbours = [lk.to for lk in cluster.out_links(note_id)]
        neighbours += [lk.from_ for lk in cluster.in_links(note_id)]
        terms = frozenset(_note_terms(cluster, note_id, own)).union(
            *(_note_terms(cluster, n, own) for n in neighbours)
        )
        reach[note_id] = terms
    return terms


def keep_matching(
    cluster: Any, terms: frozenset[str], *lists: Sequence[tuple[Any, float]]
) -> list[list[tuple[Any, float]]]:
    """Each scored list with the rows that have no evidence for ``terms`` left out."""
    if not terms:
        return [[] for _ in lists]
    isdisjoint = terms.isdisjoint
    caches = _reach_cache(cluster)  # one locked lookup per call, not one per row
    known = caches[1].get

    def reach(note_id: Any) -> frozenset[str]:
        found = known(note_id)
        return found if found is not None else _reach_terms(cluster, note_id, caches)

    return [[row for row in rows if not isdisjoint(reach(row[0]))] for rows in lists]


def filter_result(cluster: Any, question: Any, result: Any) -> Any:
    """A ``DefaultPipelineResult`` with its memories, actions and seeds filtered."""
    from dataclasses import replace

    association, action, seeds = keep_matching(
        cluster, query_terms(question), result.association, result.action, result.seeds
    )
    return replace(result, association=association, action=action, seeds=seeds)


def candidate_evidence(
    terms: CandidateTerms,
    width: int,
    *,
    edge_index: torch.Tensor,
    edge_start: torch.Tensor,
    edge_count: torch.Tensor,
    node_start: torch.Tensor,
) -> torch.Tensor:
    """:func:`keep_matching`'s rule on tensors, for every note of each query's own memory at
    once: (B, width) bool, ``True`` where the note has evidence for the query — it holds one
    of the query's terms other than :data:`STOP_TERMS` (:func:`query_terms`; a posting of the
    memory's text index, the terms :class:`_IndexTerms` reads) or is linked, either way, to
    a note that does.

    ``terms``: the queries' text-channel terms over their memories' text indexes
    (:func:`~soulmem_torch.retrieve.text.candidate_query_terms`); row ``b``'s links are
    ``edge_index[:, edge_start[b] : edge_start[b] + edge_count[b]]``, node ``node_start[b] +
    j`` its column ``j`` (:func:`~soulmem_torch.functional.fusion.reach_one_hop`). A query
    without evidence terms has no evidence anywhere (``keep_matching`` keeps nothing)."""
    hits = terms.without(STOP_TERMS).hits(width)
    return reach_one_hop(hits, edge_index, edge_start, edge_count, node_start)
