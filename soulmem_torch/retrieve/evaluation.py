"""Retrieval suites of the original's evaluation tool (docs/spec.md §9) and how to run them.

A suite (``question.json``) holds test cases, each with prioritized sub-queries, the expected
ranking per sub-query (``ranking`` + optional ``bonus_ranking``) and the expected combined
ranking. Every sub-query of every case runs through the default pipeline **in one batch**;
sub-query results are merged per case by Σ priority × score, sorted and cut to ``max_results``.
Per-sub-query metrics use ``ranking``; combined metrics use must + bonus concatenated; a case
passes when a must id is within the largest k of the combined list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from soulmem_torch.errors import ValidationError
from soulmem_torch.model import MemoryId
from soulmem_torch.model.describe import describe_validation_error
from soulmem_torch.model.query import MemoryRetrieveQuery
from soulmem_torch.retrieve.config import DefaultPipelineConfig, SimilarityConfig
from soulmem_torch.retrieve.metrics import RankingMetrics, ranking_metrics
from soulmem_torch.retrieve.pipeline import RetrDefaultPipeline
from soulmem_torch.retrieve.priority import merge_weighted_sum

__all__ = [
    "CaseReport",
    "RetrievalSuite",
    "SuiteReport",
    "load_suite",
    "run_suite",
]

if TYPE_CHECKING:
    from soulmem_torch.retrieve._types import MemorySource

_CONFIG = ConfigDict(extra="ignore")


class SubQuery(BaseModel):
    model_config = _CONFIG
    priority: int = Field(ge=0)
    tag: list[str] = Field(default_factory=list)
    variant: Any

    def query(self) -> MemoryRetrieveQuery:
        return MemoryRetrieveQuery.model_validate({"tag": self.tag, "variant": self.variant})


class ExpectedPerQuery(BaseModel):
    model_config = _CONFIG
    q: int = Field(ge=0)
    ranking: list[str] = Field(default_factory=list)
    bonus_ranking: list[str] = Field(default_factory=list)


class TestCase(BaseModel):
    model_config = _CONFIG
    __test__ = False  # not a pytest class
    name: str
    description: str | None = None
    sub_queries: list[SubQuery]
    expected_per_query: list[ExpectedPerQuery] = Field(default_factory=list)
    expected_combined_ranking: list[str] = Field(default_factory=list)
    bonus_combined_ranking: list[str] = Field(default_factory=list)
    expected_actions: list[str] = Field(default_factory=list)


class SuiteConfig(BaseModel):
    model_config = _CONFIG
    similarity_threshold: float = 0.35
    max_results: int = Field(default=10, ge=1)
    test_k_values: list[int] = Field(default_factory=lambda: [1, 3, 5])


class RetrievalSuite(BaseModel):
    """A ``question.json`` suite."""

    model_config = _CONFIG
    name: str
    description: str = ""
    graph_path: str | None = None
    config: SuiteConfig = Field(default_factory=SuiteConfig)
    test_cases: list[TestCase]


def load_suite(path: str | Path) -> RetrievalSuite:
    """Reads a suite file; errors name the case and field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        suite = RetrievalSuite.model_validate(data)
        for case in suite.test_cases:
            for i, sq in enumerate(case.sub_queries):
                try:
                    sq.query()
                except pydantic.ValidationError as exc:
                    raise ValidationError(
                        f"{path}: case {case.name!r} sub_queries[{i}]: "
                        f"{describe_validation_error(exc)}"
                    ) from None
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{path}: not valid JSON: {exc}") from None
    except pydantic.ValidationError as exc:
        raise ValidationError(f"{path}: {describe_validation_error(exc)}") from None
    return suite


@dataclass
class CaseReport:
    """Results and metrics of one case (ids are readable ids where known)."""

    name: str
    passed: bool
    combined: list[tuple[str, float]]
    combined_metrics: RankingMetrics
    per_query: list[tuple[list[tuple[str, float]], RankingMetrics | None]]
    actions: list[list[tuple[str, float]]]
    action_hit: bool | None


@dataclass
class SuiteReport:
    """Everything measured on a suite; :meth:`summary` averages the metrics."""

    name: str
    k_values: tuple[int, ...]
    cases: list[CaseReport] = field(default_factory=list)

    @property
    def pass_rate(self) -> float:
        return sum(c.passed for c in self.cases) / len(self.cases) if self.cases else 0.0

    def summary(self) -> dict[str, float]:
        """Mean metrics: per sub-query (``q_*``), combined (``c_*``), pass rate, action hit rate."""
        out: dict[str, float] = {}
        per_q = [m for c in self.cases for _, m in c.per_query if m is not None]
        for prefix, metrics in (("q", per_q), ("c", [c.combined_metrics for c in self.cases])):
            if not metrics:
                continue
            out[f"{prefix}_mrr"] = sum(m.mrr for m in metrics) / len(metrics)
            out[f"{prefix}_hit"] = sum(m.hit for m in metrics) / len(metrics)
            for k in self.k_values:
                for name in ("recall", "precision", "ndcg"):
                    vals = [_at(getattr(m, name), k) for m in metrics]
                    out[f"{prefix}_{name}@{k}"] = sum(vals) / len(vals)
        out["pass_rate"] = self.pass_rate
        hits = [c.action_hit for c in self.cases if c.action_hit is not None]
        if hits:
            out["action_hit"] = sum(hits) / len(hits)
        return out


def _at(values: dict[int, float], k: int) -> float:
    """The value at k, or at the largest clipped k below it (k was clipped to |R|)."""
    if k in values:
        return values[k]
    smaller = [kk for kk in values if kk <= k]
    return values[max(smaller)] if smaller else 0.0


def run_suite(
    suite: RetrievalSuite,
    working_memory: MemorySource,
    readable_ids: dict[MemoryId, str],
    *,
    embedder: Any,
    pipeline: DefaultPipelineConfig | None = None,
    device: Any = None,
) -> SuiteReport:
    """Runs every sub-query of every case through the default pipeline in one batch.

    The suite's ``config`` governs the pipeline's similarity stage, as in the original's tool:
    ``similarity_threshold`` is the floor of the structured scores (the structured channel and
    the seeds), ``max_results`` the most seeds per sub-query and the length of each case's
    combined list. The per-sub-query list the metrics read is the pipeline's memory list
    (``merge_top_k`` long). ``pipeline`` supplies everything else (default:
    ``DefaultPipelineConfig()``; ``DefaultPipelineConfig.original()`` reproduces the original).
    """
    cfg = suite.config
    base = pipeline or DefaultPipelineConfig()
    config = base.model_copy(
        update={
            "similarity": SimilarityConfig(
                similarity_threshold=cfg.similarity_threshold, max_results=cfg.max_results
            )
        }
    )
    requests = []
    owners: list[tuple[int, int]] = []
    for ci, case in enumerate(suite.test_cases):
        for qi, sq in enumerate(case.sub_queries):
            requests.append(
                config.into_request(
                    working_memory, sq.query(), sq.priority, embedder=embedder, device=device
                )
            )
            owners.append((ci, qi))
    results = RetrDefaultPipeline().retrieve_batch(requests)

    def name(mid: MemoryId) -> str:
        return readable_ids.get(mid, str(mid))

    by_case: dict[int, list[Any]] = {}
    for (ci, _), res in zip(owners, results):
        by_case.setdefault(ci, []).append(res)
    k_values = tuple(cfg.test_k_values)
    max_k = max(k_values)
    report = SuiteReport(suite.name, k_values)
    for ci, case in enumerate(suite.test_cases):
        res = by_case.get(ci, [])
        expected = {e.q: e for e in case.expected_per_query}
        per_query = []
        for qi, r in enumerate(res):
            ranked = [(name(i), s) for i, s in r.association]
            exp = expected.get(qi)
            metrics = (
                ranking_metrics([i for i, _ in ranked], exp.ranking, k_values) if exp else None
            )
            per_query.append((ranked, metrics))
        combined_ids = merge_weighted_sum(
            [r.association for r in res], [r.priority for r in res], top_k=cfg.max_results
        )
        combined = [(name(i), s) for i, s in combined_ids]
        gold = case.expected_combined_ranking + case.bonus_combined_ranking
        combined_metrics = ranking_metrics([i for i, _ in combined], gold, k_values)
        top = {i for i, _ in combined[:max_k]}
        passed = any(m in top for m in case.expected_combined_ranking)
        actions = [[(name(i), s) for i, s in r.action] for r in res]
        action_hit = None
        if case.expected_actions:
            found = {i for acts in actions for i, _ in acts}
            action_hit = any(a in found for a in case.expected_actions)
        report.cases.append(
            CaseReport(
                case.name, passed, combined, combined_metrics, per_query, actions, action_hit
            )
        )
    return report


def format_report(report: SuiteReport, *, per_case: bool = False) -> str:
    """A plain-text metric table (and optionally one line per case)."""
    s = report.summary()
    lines = [f"suite: {report.name}  cases: {len(report.cases)}  pass rate: {s['pass_rate']:.3f}"]
    header = ["", "MRR", "Hit"] + [f"{m}@{k}" for k in report.k_values for m in ("R", "P", "nDCG")]
    rows = []
    for prefix, label in (("q", "per sub-query"), ("c", "combined")):
        if f"{prefix}_mrr" not in s:
            continue
        row = [label, f"{s[f'{prefix}_mrr']:.3f}", f"{s[f'{prefix}_hit']:.3f}"]
        for k in report.k_values:
            for m in ("recall", "precision", "ndcg"):
                row.append(f"{s[f'{prefix}_{m}@{k}']:.3f}")
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    if "action_hit" in s:
        lines.append(f"action hit rate: {s['action_hit']:.3f}")
    if per_case:
        for c in report.cases:
            mark = "PASS" if c.passed else "FAIL"
            top = ", ".join(i for i, _ in c.combined[:5])
            lines.append(f"  [{mark}] {c.name}: {top}")
    return "\n".join(lines)


def _load_suite_memory(
    path: str | Path, *, embedder: Any, graph_path: str | Path | None
) -> tuple[RetrievalSuite, Any, dict[MemoryId, str], Any]:
    """(suite, working memory, readable ids, embedder) of a suite file and its graph."""
    from soulmem_torch.embedding import HashingEmbedder, embed_notes
    from soulmem_torch.model.soul_tune import load_soul_tune_graph
    from soulmem_torch.runtime import WorkingMemory

    path = Path(path)
    suite = load_suite(path)
    gp = Path(graph_path) if graph_path is not None else None
    if gp is None:
        if not suite.graph_path:
            raise ValidationError(f"{path}: the suite names no graph_path; pass graph_path")
        gp = path.parent / suite.graph_path
    graph = load_soul_tune_graph(gp)
    embedder = embedder if embedder is not None else HashingEmbedder()
    embeddings = embed_notes(graph.notes, embedder)
    wm = WorkingMemory()
    wm.add_nodes(graph.notes, embeddings)
    return suite, wm, graph.readable_ids, embedder


def evaluate_suite_file(
    path: str | Path,
    *,
    embedder: Any = None,
    graph_path: str | Path | None = None,
    pipeline: DefaultPipelineConfig | None = None,
    device: Any = None,
) -> SuiteReport:
    """Loads a suite and its graph (``graph_path`` relative to the suite), embeds, runs."""
    suite, wm, readable, embedder = _load_suite_memory(
        path, embedder=embedder, graph_path=graph_path
    )
    return run_suite(suite, wm, readable, embedder=embedder, pipeline=pipeline, device=device)


def ablation_configs(
    base: DefaultPipelineConfig | None = None,
) -> list[tuple[str, DefaultPipelineConfig]]:
    """The rows of an ablation: the original pipeline, similarity only, the original merge of
    similarity and association, the first rank-fused default (similarity + text + graph), the
    rank-fused default and the default without each of its channels.

    ``base`` (default: ``DefaultPipelineConfig()``) supplies everything but the fusion; its
    ``channels`` are the default row's.
    """
    base = base or DefaultPipelineConfig()
    rank = base.model_copy(update={"fusion": "rank"})
    channels = tuple(rank.channels)
    rows: list[tuple[str, DefaultPipelineConfig]] = [
        ("original pipeline (.original())", DefaultPipelineConfig.original()),
        ("similarity only", rank.model_copy(update={"channels": ("similarity",)})),
        ("+ association, original merge", base.model_copy(update={"fusion": "max"})),
        (
            "rank fusion: similarity + text + graph",
            rank.model_copy(update={"channels": ("similarity", "text", "graph")}),
        ),
        (f"default: {' + '.join(channels)}", rank),
    ]
    if len(channels) > 1:
        for channel in channels:
            kept = tuple(c for c in channels if c != channel)
            rows.append(
                (f"  default without {channel}", rank.model_copy(update={"channels": kept}))
            )
    return rows


def run_ablation(
    path: str | Path,
    *,
    embedder: Any = None,
    graph_path: str | Path | None = None,
    base: DefaultPipelineConfig | None = None,
    device: Any = None,
) -> list[tuple[str, SuiteReport]]:
    """Runs a suite once per :func:`ablation_configs` row (the memory is embedded once)."""
    suite, wm, readable, embedder = _load_suite_memory(
        path, embedder=embedder, graph_path=graph_path
    )
    return [
        (label, run_suite(suite, wm, readable, embedder=embedder, pipeline=cfg, device=device))
        for label, cfg in ablation_configs(base)
    ]


def format_ablation(rows: list[tuple[str, SuiteReport]]) -> str:
    """One table: a row per configuration with the headline metrics (sq = per sub-query, cb =
    combined, as :func:`format_report` prints them)."""
    if not rows:
        return ""
    k_max = max(rows[0][1].k_values)
    header = [
        "configuration", "sq MRR", "sq Hit", "cb MRR", f"cb R@{k_max}",
        f"cb nDCG@{k_max}", "pass", "action",
    ]  # fmt: skip
    keys = ("q_mrr", "q_hit", "c_mrr", f"c_recall@{k_max}", f"c_ndcg@{k_max}", "pass_rate")
    table = [header]
    for label, report in rows:
        s = report.summary()
        table.append(
            [
                label,
                *(f"{s[key]:.3f}" if key in s else "-" for key in (*keys, "action_hit")),
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = [f"suite: {rows[0][1].name}  cases: {len(rows[0][1].cases)}"]
    for r in table:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


__all__ += [
    "ablation_configs",
    "evaluate_suite_file",
    "format_ablation",
    "format_report",
    "run_ablation",
]
