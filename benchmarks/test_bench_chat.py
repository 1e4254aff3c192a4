"""LongMemEval-S dev half through one bank, side by side with a tokenized ``rank_bm25``.

Run: ``pytest benchmarks/test_bench_chat.py --benchmark-enable --benchmark-only -s`` (needs
``../shared/longmemeval/longmemeval_s_dev.json`` or ``$SOULMEM_SHARED``; ``rank_bm25`` from the
``peers`` extra for the baseline).

Reported, 1 torch thread, in one run:

* ``soulmem``: read the file, build the notes (session level), embed them (the offline
  ``HashingEmbedder``), build every index and answer all 250 questions in one ``bank.ask``
  (cold); then the same ``bank.ask`` again (warm). The library's modules (PyG among them) are
  imported before the clock starts, as the baseline's are (``import_s``, reported apart);
* ``bm25``: read the file, tokenize (lowercased words, the text channel's stopwords out,
  Snowball stems: the issue's "tokenized BM25"), index one ``BM25Okapi`` per haystack and score
  every question — pure Python, the benchmark's own kind of baseline;
* both rankings scored with the official metrics (``paper`` protocol, session level).

Each side's CPU time (``*_cpu_s``, ``time.process_time``) is reported beside its wall time: on a
shared box the CPU ratio is the steadier one.

``SOULMEM_BENCH_CHAT_TURN=1`` adds the turn level (every user turn a note): peak resident
memory of the whole run, sampled every 10 ms.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import pytest
import torch

from benchmarks import _harness

SHARED = Path(os.environ.get("SOULMEM_SHARED", Path(__file__).resolve().parents[2] / "shared"))
DEV = SHARED / "longmemeval" / "longmemeval_s_dev.json"

pytestmark = pytest.mark.skipif(not DEV.is_file(), reason=f"no LongMemEval dev half at {DEV}")


def _bm25_run() -> tuple[float, float, list[list[str]]]:
    """The tokenized BM25 baseline end to end: ``(seconds, CPU seconds, rankings)``."""
    import json

    from rank_bm25 import BM25Okapi

    from soulmem_torch.retrieve.text import STOPWORDS, _stemmer

    stem = _stemmer().stemWord
    words = re.compile(r"\w+")
    cache: dict[str, str] = {}

    def tok(text: str) -> list[str]:
        out = []
        for w in words.findall(text.lower()):
            if w in STOPWORDS:
                continue
            t = cache.get(w)
            if t is None:
                t = cache[w] = stem(w)
            out.append(t)
        return out

    t0, c0 = time.perf_counter(), time.process_time()
    with DEV.open("rb") as fh:
        data = json.load(fh)
    rankings = []
    for q in data:
        ids, docs = [], []
        for sid, turns in zip(q["haystack_session_ids"], q["haystack_sessions"]):
            user = [t["content"] for t in turns if t["role"] == "user"]
            if user:
                ids.append(sid)
                docs.append(tok(" ".join(user)))
        scores = BM25Okapi(docs).get_scores(tok(q["question"]))
        order = sorted(range(len(ids)), key=lambda i: -scores[i])
        rankings.append([ids[i] for i in order])
    return time.perf_counter() - t0, time.process_time() - c0, rankings


def _score(questions, rankings) -> dict[str, float]:
    from soulmem_torch.chat.metrics import longmemeval_corpus_ids, ndcg_any, recall_all, recall_any

    r5, n5, any5 = [], [], []
    for q, ranking in zip(questions, rankings):
        any5.append(recall_any(ranking, q.answer_session_ids, 5))
        if q.abstention:
            continue
        sids = [s.id for s in q.sessions]
        turns = [[(str(t.id), t.role, bool(t.has_answer)) for t in s.turns] for s in q.sessions]
        corpus, renamed = longmemeval_corpus_ids(sids, turns, level="session")
        gold = sorted({c for c in corpus if "answer" in c})
        ranked = [renamed.get(x, x) for x in ranking]
        r5.append(recall_all(ranked, gold, 5))
        n5.append(ndcg_any(ranked, gold, corpus, 5))
    return {
        "recall_all@5": sum(r5) / len(r5),
        "ndcg_any@5": sum(n5) / len(n5),
        "all_recall_any@5": sum(any5) / len(any5),
    }


class _PeakRSS:
    """Peak resident set size of this process, sampled every 10 ms (Linux /proc)."""

    def __enter__(self) -> _PeakRSS:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.is_set():
            with open("/proc/self/statm") as fh:
                self.peak = max(self.peak, int(fh.read().split()[1]) * page)
            time.sleep(0.01)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _import_library() -> float:
    """Imports what a run uses (the bank, the snapshots and with them PyG, the embedders, the
    pipeline): seconds, ~0 when already imported."""
    import importlib

    t0 = time.perf_counter()
    for name in ("bank", "chat.evaluate", "embedding", "graph", "retrieve"):
        importlib.import_module(f"soulmem_torch.{name}")
    return time.perf_counter() - t0


def _soulmem_run(level: str):
    from soulmem_torch.chat import read_longmemeval
    from soulmem_torch.chat.evaluate import HaystackBank

    t0, c0 = time.perf_counter(), time.process_time()
    questions = read_longmemeval(DEV)
    read_s = time.perf_counter() - t0
    hb = HaystackBank.build([q.sessions for q in questions], level=level, roles=("user",))
    args = (
        list(range(len(questions))),
        [q.question for q in questions],
        [q.question_date for q in questions],
    )
    rankings = hb.rank(*args)
    total, total_cpu = time.perf_counter() - t0, time.process_time() - c0
    cold_ask = hb.timings["ask_s"]
    t1 = time.perf_counter()
    hb.rank(*args)
    warm = time.perf_counter() - t1
    return (
        questions,
        rankings,
        {
            "read_s": read_s,
            "notes_s": hb.timings["notes_s"],
            "embed_s": hb.timings["embed_s"],
            "ask_cold_s": cold_ask,
            "ask_warm_s": warm,
            "total_s": total,
            "total_cpu_s": total_cpu,
        },
    )


def test_longmemeval_session_level_vs_bm25(benchmark) -> None:
    pytest.importorskip("rank_bm25", reason="the baseline needs rank_bm25 (the peers extra)")
    torch.set_num_threads(1)
    import_s = _import_library()
    bm25_s, bm25_cpu_s, bm25_rankings = _bm25_run()
    with _PeakRSS() as rss:
        questions, rankings, timings = benchmark.pedantic(
            lambda: _soulmem_run("session"), rounds=1, iterations=1
        )
    ours = _score(questions, rankings)
    theirs = _score(questions, bm25_rankings)
    _harness.record(
        {
            "group": "longmemeval-dev-session",
            "bm25_s": round(bm25_s, 2),
            "bm25_cpu_s": round(bm25_cpu_s, 2),
            "import_s": round(import_s, 2),
            **{k: round(v, 2) for k, v in timings.items()},
            "ratio_total_vs_bm25": round(timings["total_s"] / bm25_s, 2),
            "ratio_cpu_vs_bm25": round(timings["total_cpu_s"] / bm25_cpu_s, 2),
            "peak_rss_mb": round(rss.peak / 2**20),
            **{f"soulmem_{k}": round(v, 3) for k, v in ours.items()},
            **{f"bm25_{k}": round(v, 3) for k, v in theirs.items()},
        }
    )


@pytest.mark.skipif(
    os.environ.get("SOULMEM_BENCH_CHAT_TURN") != "1", reason="set SOULMEM_BENCH_CHAT_TURN=1"
)
def test_longmemeval_turn_level_memory(benchmark) -> None:
    torch.set_num_threads(1)
    import_s = _import_library()
    with _PeakRSS() as rss:
        _, _, timings = benchmark.pedantic(lambda: _soulmem_run("turn"), rounds=1, iterations=1)
    _harness.record(
        {
            "group": "longmemeval-dev-turn",
            "import_s": round(import_s, 2),
            **{k: round(v, 2) for k, v in timings.items()},
            "peak_rss_mb": round(rss.peak / 2**20),
        }
    )
