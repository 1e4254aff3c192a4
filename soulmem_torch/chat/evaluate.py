"""``soulmem eval --format longmemeval|locomo``: conversational benchmarks through one bank.

Every haystack (a LongMemEval question's sessions, a LoCoMo conversation) is one agent of one
:class:`~soulmem_torch.bank.MemoryBank`; all questions are answered by one ``bank.ask`` call
(each with its own date as the time of asking). Rankings hold the benchmark's own ids —
session ids at session level, turn ids at turn level (LongMemEval ``f"{session}_{i+1}"``, LoCoMo
dia_ids) — at least ``depth`` long (the retrieved list, then the rest of the corpus in its
order), so anyone can score them with the official code. Metrics: :mod:`.metrics`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from soulmem_torch._gcpause import gc_paused
from soulmem_torch.chat._types import ChatSession
from soulmem_torch.chat.mapping import sessions_to_notes
from soulmem_torch.chat.metrics import (
    locomo_recall,
    longmemeval_corpus_ids,
    ndcg_any,
    recall_all,
    recall_any,
    turns_to_sessions,
)
from soulmem_torch.chat.readers import LoCoMoSample, LongMemEvalQuestion, locomo_session_of
from soulmem_torch.errors import ValidationError

__all__ = [
    "ChatEvalReport",
    "HaystackBank",
    "chat_ablation",
    "evaluate_locomo",
    "evaluate_longmemeval",
]

K_VALUES = (1, 3, 5, 10)
Level = Literal["session", "turn"]


@dataclass
class ChatEvalReport:
    """Metrics (``summary``: name → value), per-question rankings (``rankings``: ``(question
    id, [ids, best first])``), question counts and timings of one benchmark run."""

    format: str
    level: str
    summary: dict[str, float]
    rankings: list[tuple[str, list[str]]]
    counts: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    groups: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class HaystackBank:
    """The haystacks of a benchmark as one bank: agent ``f"haystack-{i}"`` holds
    ``haystacks[i]``'s notes (``made[i]``: its :class:`~soulmem_torch.chat.ChatNotes`)."""

    bank: Any
    made: list[Any]
    timings: dict[str, float]

    @classmethod
    @gc_paused()  # every haystack's notes and plans: many small acyclic objects
    def build(
        cls,
        haystacks: Sequence[Sequence[ChatSession]],
        *,
        level: Level,
        roles: Sequence[str] | None,
        embedder: Any = None,
        device: Any = None,
    ) -> HaystackBank:
        from soulmem_torch.bank import MemoryBank

        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        made = [sessions_to_notes(h, level=level, roles=roles) for h in haystacks]
        timings["notes_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        bank = MemoryBank(embedder=embedder, device=device)
        # every haystack at once: a session shared by several is embedded and read once
        bank.add_agents((f"haystack-{j}", m.notes) for j, m in enumerate(made))
        timings["embed_s"] = time.perf_counter() - t0
        return cls(bank, made, timings)

    def rank(
        self,
        owners: Sequence[int],
        questions: Sequence[str],
        times: Sequence[datetime | None],
        *,
        config: Any = None,
        depth: int = 50,
    ) -> list[list[str]]:
        """The ranking (source ids, best first, ≥ ``depth`` long or the whole corpus) of
        each question against its haystack ``owners[q]``, all in one ``bank.ask``."""
        from soulmem_torch.retrieve import DefaultPipelineConfig

        if len(owners) != len(questions) or len(times) != len(questions):
            raise ValidationError(
                f"owners / times: expected {len(questions)} entries (one per question), found "
                f"{len(owners)} / {len(times)}"
            )
        config = DefaultPipelineConfig.for_questions() if config is None else config
        if config.merge_top_k < depth:
            config = config.model_copy(update={"merge_top_k": depth})
        t0 = time.perf_counter()
        results = self.bank.ask(
            [f"haystack-{o}" for o in owners],
            list(questions),
            config=config,
            now=list(times),
            record=False,  # an evaluation reads the memory, it does not use it
            only_matching=False,  # the whole fused ranking, as the benchmark scores it
        )
        self.timings["ask_s"] = time.perf_counter() - t0
        out = []
        for o, r in zip(owners, results):
            m = self.made[o]
            ranking: list[str] = []
            seen: set[str] = set()
            for note_id, _ in r.association:
                s = m.source.get(note_id)
                if s is not None and s not in seen:
                    seen.add(s)
                    ranking.append(s)
            for note_id in m.corpus:  # the rest of the corpus, in its order
                if len(ranking) >= depth:
                    break
                s = m.source[note_id]
                if s not in seen:
                    seen.add(s)
                    ranking.append(s)
            out.append(ranking)
        return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def evaluate_longmemeval(
    questions: Sequence[LongMemEvalQuestion],
    *,
    level: Level = "session",
    include_assistant: bool = False,
    config: Any = None,
    embedder: Any = None,
    device: Any = None,
    depth: int = 50,
    prepared: HaystackBank | None = None,
) -> ChatEvalReport:
    """LongMemEval's retrieval metrics (``paper``: the non-abstention questions; ``strict``:
    also without the questions whose gold is empty) at ``level`` and, for a turn ranking, at
    session level too; plus ``recall_any@k`` over all questions against
    ``answer_session_ids``."""
    roles = ("user", "assistant") if include_assistant else ("user",)
    hb = prepared or HaystackBank.build(
        [q.sessions for q in questions], level=level, roles=roles, embedder=embedder, device=device
    )
    rankings = hb.rank(
        list(range(len(questions))),
        [q.question for q in questions],
        [q.question_date for q in questions],
        config=config,
        depth=depth,
    )
    timings = dict(hb.timings)
    per: dict[str, list[tuple[float, bool]]] = {}

    def add(name: str, value: float, strict_ok: bool) -> None:
        per.setdefault(name, []).append((value, strict_ok))

    every: dict[str, list[float]] = {}
    levels = ["session"] if level == "session" else ["turn", "session"]
    for q, ranking in zip(questions, rankings):
        sids = [s.id for s in q.sessions]
        turns = [[(str(t.id), t.role, bool(t.has_answer)) for t in s.turns] for s in q.sessions]
        for k in K_VALUES:
            top = turns_to_sessions(ranking) if level == "turn" else ranking
            every.setdefault(f"all/recall_any@{k}", []).append(
                recall_any(top, q.answer_session_ids, k)
            )
        if q.abstention:
            continue
        for lv in levels:
            corpus, renamed = longmemeval_corpus_ids(sids, turns, level=lv, roles=roles)
            gold = sorted({c for c in corpus if "answer" in c})
            if lv == level:
                ranked = [renamed.get(x, x) for x in ranking]
            else:  # the turn ranking scored at session level
                ranked = [renamed.get(x, x) for x in turns_to_sessions(ranking)]
            for k in K_VALUES:
                add(f"{lv}/recall_any@{k}", recall_any(ranked, gold, k), bool(gold))
                add(f"{lv}/recall_all@{k}", recall_all(ranked, gold, k), bool(gold))
                add(f"{lv}/ndcg_any@{k}", ndcg_any(ranked, gold, corpus, k), bool(gold))
    summary: dict[str, float] = {}
    for name, values in per.items():
        summary[f"paper/{name}"] = _mean([v for v, _ in values])
        summary[f"strict/{name}"] = _mean([v for v, ok in values if ok])
    for name, values in every.items():
        summary[name] = _mean(values)
    n_paper = sum(not q.abstention for q in questions)
    first = next(iter(per.values()), [])
    return ChatEvalReport(
        "longmemeval",
        level,
        summary,
        [(q.question_id, r) for q, r in zip(questions, rankings)],
        counts={
            "questions": len(questions),
            "paper": n_paper,
            "strict": sum(ok for _, ok in first),
        },
        timings=timings,
    )


def evaluate_locomo(
    samples: Sequence[LoCoMoSample],
    *,
    level: Level = "turn",
    config: Any = None,
    embedder: Any = None,
    device: Any = None,
    depth: int = 50,
    prepared: HaystackBank | None = None,
) -> ChatEvalReport:
    """LoCoMo's retrieval metrics: the fraction of a question's evidence dia_ids in the top k
    (turn level) and of their sessions in the top-k sessions (questions without evidence score
    1), per category and over categories 1–4 (``overall``); every turn of both speakers is in
    the corpus."""
    qs = [(i, q) for i, s in enumerate(samples) for q in s.questions]
    hb = prepared or HaystackBank.build(
        [s.sessions for s in samples], level=level, roles=None, embedder=embedder, device=device
    )
    # a LoCoMo question is asked after its conversation: its time is the last session's
    last = [max((t.time for t in s.sessions if t.time is not None), default=None) for s in samples]
    rankings = hb.rank(
        [i for i, _ in qs], [q.question for _, q in qs], [last[i] for i, _ in qs],
        config=config, depth=depth,
    )  # fmt: skip
    timings = dict(hb.timings)
    groups: dict[str, dict[str, list[float]]] = {}
    for (_, q), ranking in zip(qs, rankings):
        sessions_ranked = (
            ranking if level == "session" else list(dict.fromkeys(_session(t) for t in ranking))
        )
        gold_sessions = list(dict.fromkeys(_session(e) for e in q.evidence))
        names = [f"category_{q.category}"] + (["overall"] if 1 <= q.category <= 4 else [])
        for name in names:
            g = groups.setdefault(name, {})
            for k in K_VALUES:
                if level == "turn":
                    g.setdefault(f"turn/recall@{k}", []).append(
                        locomo_recall(ranking, q.evidence, k)
                    )
                g.setdefault(f"session/recall@{k}", []).append(
                    locomo_recall(sessions_ranked, gold_sessions, k)
                )
            g.setdefault("count", []).append(1.0)
    out_groups = {
        name: {m: (sum(v) if m == "count" else _mean(v)) for m, v in g.items()}
        for name, g in sorted(groups.items())
    }
    overall = out_groups.get("overall", {})
    return ChatEvalReport(
        "locomo",
        level,
        {m: v for m, v in overall.items() if m != "count"},
        [(q.id, r) for (_, q), r in zip(qs, rankings)],
        counts={"questions": len(qs), "overall": int(overall.get("count", 0))},
        timings=timings,
        groups=out_groups,
    )


def _session(dia_or_session: str) -> str:
    if dia_or_session.startswith("session_"):
        return dia_or_session
    try:
        return locomo_session_of(dia_or_session)
    except ValidationError:
        return dia_or_session


def chat_ablation(
    data: Sequence[Any],
    *,
    format: str,
    level: Level,
    base: Any = None,
    include_assistant: bool = False,
    embedder: Any = None,
    device: Any = None,
    depth: int = 50,
) -> list[tuple[str, ChatEvalReport]]:
    """One report per configuration of ``retrieve.evaluation.ablation_configs(base)`` (``base``
    ``None``: ``DefaultPipelineConfig.for_questions()``, what ``ask`` uses), then the default with
    its seeds from the similarity alone, its graph channels from the seeds only, with dispersion weights, with equal votes for every
    channel, and the text channel alone;
    the haystacks are embedded once."""
    from soulmem_torch.retrieve.evaluation import ablation_configs

    if format == "longmemeval":
        roles: Sequence[str] | None = ("user", "assistant") if include_assistant else ("user",)
        haystacks = [q.sessions for q in data]
    else:
        roles, haystacks = None, [s.sessions for s in data]
    from soulmem_torch.retrieve import DefaultPipelineConfig

    hb = HaystackBank.build(haystacks, level=level, roles=roles, embedder=embedder, device=device)
    base = DefaultPipelineConfig.for_questions() if base is None else base
    configs = ablation_configs(base)
    configs += [
        ("  default, seeds from the similarity", base.model_copy(update={"seed_source": "similarity"})),
        ("  default, the graph from the seeds", base.model_copy(update={"personalization": "seeds"})),
        ("  default, dispersion weights", base.model_copy(update={"channel_weights": "dispersion"})),
        ("  default, equal votes", base.model_copy(update={"channel_weights": "equal"})),
        ("text channel alone (BM25)", base.model_copy(update={"channels": ("text",)})),
    ]  # fmt: skip
    rows = []
    for label, cfg in configs:
        if format == "longmemeval":
            report = evaluate_longmemeval(
                data, level=level, include_assistant=include_assistant, config=cfg,
                depth=depth, prepared=hb,
            )  # fmt: skip
        else:
            report = evaluate_locomo(data, level=level, config=cfg, depth=depth, prepared=hb)
        rows.append((label, report))
    return rows
