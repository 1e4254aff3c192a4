"""Retrieval metrics of the conversational benchmarks, as their official code computes them.

LongMemEval (``src/retrieval/eval_utils.py`` and ``run_retrieval.py`` of its repository):
``recall_any@k`` (some gold id in the top k), ``recall_all@k`` (every gold id in the top k; 1
when there is no gold id), ``ndcg_any@k`` (binary relevance, DCG = rel₁ + Σ_{r≥2} rel_r /
log2(r), IDCG over the min(k, |gold|) ideal ones, 0 when IDCG is 0). Gold ids are the corpus ids
that contain ``"answer"`` after the renaming of :func:`longmemeval_corpus_ids`. A turn ranking is
scored at session level by :func:`turns_to_sessions`.

LoCoMo: the fraction of a question's evidence ids in the top k (1 when it has none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "dcg",
    "locomo_recall",
    "longmemeval_corpus_ids",
    "ndcg_any",
    "recall_all",
    "recall_any",
    "turns_to_sessions",
]


def recall_any(ranking: Sequence[str], gold: Sequence[str], k: int) -> float:
    """1.0 when some gold id is among the first ``k`` of ``ranking`` (0.0 for no gold)."""
    top = set(ranking[:k])
    return float(any(g in top for g in gold))


def recall_all(ranking: Sequence[str], gold: Sequence[str], k: int) -> float:
    """1.0 when every gold id is among the first ``k`` (1.0 for no gold, as ``all([])``)."""
    top = set(ranking[:k])
    return float(all(g in top for g in gold))


def dcg(relevances: Sequence[float], k: int) -> float:
    """rel₁ + Σ_{r=2..k} rel_r / log2(r) (the official ``dcg``: ranks 1 and 2 undiscounted)."""
    rel = list(relevances)[:k]
    if not rel:
        return 0.0
    return float(rel[0]) + sum(float(r) / math.log2(i) for i, r in enumerate(rel[1:], start=2))


def ndcg_any(ranking: Sequence[str], gold: Sequence[str], corpus: Sequence[str], k: int) -> float:
    """The official ``ndcg``: DCG of the ranking's binary relevances over the DCG of the corpus
    relevances sorted (every corpus entry that is gold counts, repeated ids included)."""
    wanted = set(gold)
    ideal = sorted((1 if c in wanted else 0 for c in corpus), reverse=True)
    best = dcg(ideal, k)
    if best == 0:
        return 0.0
    return dcg([1 if r in wanted else 0 for r in ranking[:k]], k) / best


def turns_to_sessions(ranking: Sequence[str]) -> list[str]:
    """A turn ranking as a session ranking: each turn id without its last ``_n``, each session
    at its first position."""
    out: list[str] = []
    seen: set[str] = set()
    for t in ranking:
        s = t.rsplit("_", 1)[0] if "_" in t else t
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def longmemeval_corpus_ids(
    session_ids: Sequence[str],
    sessions: Sequence[Sequence[tuple[str, str, bool]]],
    *,
    level: str,
    roles: Sequence[str] = ("user",),
) -> tuple[list[str], dict[str, str]]:
    """The official corpus ids of one haystack, renamed as ``run_retrieval.py`` does, and the
    map from each source id (session id, or turn id ``f"{session}_{i+1}"``) to its renamed id.

    ``sessions[j]`` holds ``(turn id, role, has_answer)`` of session ``j``'s turns. An answer
    session (id containing ``"answer"``) none of whose user turns has ``has_answer`` becomes
    ``noans…`` (session level); at turn level each user turn of an answer session without
    ``has_answer`` does.
    """
    keep = frozenset(roles)
    corpus: list[str] = []
    renamed: dict[str, str] = {}
    for sid, turns in zip(session_ids, sessions):
        kept = [t for t in turns if t[1] in keep]
        if level == "session":
            if not kept:
                continue
            new = sid
            if "answer" in sid and not any(has for _, role, has in turns if role == "user"):
                new = sid.replace("answer", "noans")
            corpus.append(new)
            renamed.setdefault(sid, new)
        else:
            for tid, _, has in kept:
                new = tid
                if "answer" in sid and not has:
                    new = tid.replace("answer", "noans")
                corpus.append(new)
                renamed.setdefault(tid, new)
    return corpus, renamed


def locomo_recall(ranking: Sequence[str], evidence: Sequence[str], k: int) -> float:
    """The fraction of the evidence ids among the first ``k`` (1.0 without evidence)."""
    wanted = list(dict.fromkeys(evidence))
    if not wanted:
        return 1.0
    top = set(ranking[:k])
    return sum(1 for e in wanted if e in top) / len(wanted)
