"""``soulmem demo``: the bundled sample memory end to end."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from soulmem_torch.cli._args import _non_negative_float, _positive_int, common_parent, device_parent
from soulmem_torch.cli._errors import EXIT_OK
from soulmem_torch.cli._forgetting import (
    _days_after,
    _emit_forget_table,
    _forget_rows,
    _newest_create_time,
)
from soulmem_torch.cli._memory import (
    _kind,
    _label,
    _print_window,
    _resolve_device,
    _scored_rows,
    _short_id,
)
from soulmem_torch.cli._output import _clip, _emit, _quiet_libraries, _show_progress, _table

_DEMO_CONVERSATION: tuple[tuple[str, str], ...] = (
    ("user", "早上好！今天店里忙吗？"),
    ("assistant", "Morning! The oat-milk delivery is late again, so it's a little hectic."),
    ("user", "Remind me what Grandma said about making 桂花糕?"),
    ("assistant", "外婆说：糖少放一点，心多放一点。"),
    ("user", "下午我还要去鸟类实验室，帮我记一下要带野外记录本。"),
    ("assistant", "Noted: bring the field notebook to the bird lab this afternoon."),
)


_KIND_PLURAL = {
    "concept": "concepts",
    "episode": "episodes",
    "abstract": "abstract situations",
    "action": "actions",
}


def cmd_demo(args: argparse.Namespace) -> int:
    """The bundled sample memory end to end: load, embed, talk, ask, forget."""
    t_start = time.perf_counter()
    _quiet_libraries(args)
    device = _resolve_device(args.device)

    from soulmem_torch.api import SoulMem
    from soulmem_torch.data import load_sample_queries, sample_memory_path
    from soulmem_torch.forget import FakeLLM
    from soulmem_torch.model.query import MemoryRetrieveQuery
    from soulmem_torch.retrieve import mix_by_priority
    from soulmem_torch.runtime import make_information

    rule = "-" * 78
    # 1. long-term memory: the sample graph, embedded offline ------------------------------
    t0 = time.perf_counter()
    mem = SoulMem.from_graph_file(
        sample_memory_path(), device=device, window_capacity=args.window, llm=FakeLLM()
    )
    kinds: dict[str, int] = {}
    for entry in mem.cluster:
        k = _kind(entry.note)
        kinds[k] = kinds.get(k, 0) + 1
    n_links = sum(len(e.note.mem_links) for e in mem.cluster)
    _emit("SoulMem demo — the sample memory of 林小满 (Xiaoman Lin), owner of 云朵咖啡馆")
    _emit("=" * 78)
    _emit(
        f"memory:  {len(mem)} notes ("
        + ", ".join(f"{v} {_KIND_PLURAL.get(k, k)}" for k, v in kinds.items())
        + f"), {n_links} links"
    )
    _emit(
        f"         embedded offline by {type(mem.embedder).__name__}"
        f"(dim={getattr(mem.embedder, 'dim', '?')}) in {time.perf_counter() - t0:.2f} s; "
        f"retrieval on {device or 'cpu'}"
    )

    # 2. short-term memory: a few chat messages through a small window --------------------
    async def talk() -> int:
        updates = 0
        for role, text in _DEMO_CONVERSATION:
            result = await mem.working_memory.push(make_information(text, role))
            updates += bool(result.summary_updated)
        return updates

    updates = asyncio.run(talk())
    _emit(
        f"chat:    {len(_DEMO_CONVERSATION)} messages pushed into a window of {args.window}; "
        "evicted ones are summarized"
    )
    _emit(
        f"         by the built-in FakeLLM ({updates} summary update{'' if updates == 1 else 's'})"
    )

    # 3. retrieval: every sub-query of the sample suite in ONE batch -----------------------
    suite = load_sample_queries()
    cases = suite["test_cases"]
    queries, priorities, owners = [], [], []
    for ci, case in enumerate(cases):
        for sq in case["sub_queries"]:
            queries.append(
                MemoryRetrieveQuery.model_validate({"tag": sq["tag"], "variant": sq["variant"]})
            )
            priorities.append(int(sq["priority"]))
            owners.append(ci)
    t0 = time.perf_counter()
    results = mem.query(queries, priorities=priorities)
    elapsed = time.perf_counter() - t0
    _emit()
    _emit(f"RETRIEVAL — the {len(queries)} structured queries of sample_queries.json")
    _emit(f"({len(cases)} cases), answered in one batch by the default pipeline in {elapsed:.2f} s")
    _emit(rule)
    hits = 0
    retrieved: list[Any] = []
    for ci, case in enumerate(cases):
        mine = [r for r, o in zip(results, owners) if o == ci]
        memory = mix_by_priority(
            [r.association for r in mine], [r.priority for r in mine], top_k=10
        )
        actions = mix_by_priority([r.action for r in mine], [r.priority for r in mine])
        retrieved.extend(mid for mid, _ in memory[: args.top])
        names = [_short_id(mem, mid) for mid, _ in memory]
        expected = case.get("expected_combined_ranking", [])
        rank = next((i for i, n in enumerate(names, 1) if n in expected), None)
        hits += rank is not None and rank <= 5
        found = f"{names[rank - 1]} at rank {rank}" if rank else "expected memory not in top 10"
        n_sub = f" · {len(mine)} sub-queries" if len(mine) > 1 else ""
        _emit(f"[{ci + 1:2d}/{len(cases)}] {case['name']}{n_sub} — expected {found}")
        _emit(f"        {_clip(case.get('description', ''), 70)}")
        _emit(
            _table(
                ["#", "memory", "kind", "score", "label"],
                _scored_rows(mem, memory[: args.top], 40),
                right=(0, 3),
                indent="        ",
            )
        )
        for mid, score in actions[:2]:
            entry = mem.cluster.get(mid)
            label = _label(entry.note, 44) if entry is not None else ""
            _emit(f"        → action {_short_id(mem, mid)} ({score:.2f}): {label}")
    _emit(f"{hits}/{len(cases)} cases have an expected memory in their top 5")
    _emit()
    _emit("SHORT-TERM MEMORY — what every pipeline result also carries")
    _emit(rule)
    _print_window(results[0], indent="")

    # 4. forgetting ---------------------------------------------------------------------------
    mem.working_memory.record_retrieval(retrieved, touch_notes=True)
    notes = [e.note for e in mem.cluster]
    now = _days_after(_newest_create_time(notes), args.days)
    _emit()
    _emit(f"FORGETTING — {args.days:g} simulated day(s) after the notes were written ({now})")
    _emit("notes recalled above decay more slowly (md = missing degree); the FakeLLM fills")
    _emit("masked words with placeholders, where a real LLM would reconstruct them")
    _emit(rule)
    report = asyncio.run(mem.forget(now=now, llm=FakeLLM(), progress=_show_progress(args)))
    _emit(report.summary())
    episodes_first = {"episode": 0, "concept": 1}
    rows, n_changed = _forget_rows(
        mem,
        report,
        limit=args.show,
        width=26,
        order=lambda note: episodes_first.get(_kind(note), 2),
    )
    _emit_forget_table(report, rows, n_changed)
    _emit()
    _emit(f"demo finished in {time.perf_counter() - t_start:.1f} s")
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Registers ``soulmem demo``."""
    common = common_parent()
    device = device_parent()
    p = sub.add_parser(
        "demo",
        parents=[common, device],
        help="run the bundled sample memory end to end (what `make demo` runs)",
        description="Loads the bundled sample memory (77 notes), embeds it with the offline "
        "hashing embedder, pushes a short chat into the working memory (FakeLLM summaries), "
        "answers every query of sample_queries.json in one batch, then ages the memory by "
        "--days simulated days and shows what forgetting masked and reconstructed.",
    )
    p.add_argument(
        "--days",
        type=_non_negative_float,
        default=1.0,
        help="simulated days after the notes' creation (default 1; 3 forgets most words)",
    )
    p.add_argument(
        "--top",
        type=_positive_int,
        metavar="N",
        default=3,
        help="memories shown per case (default 3)",
    )
    p.add_argument(
        "--window",
        type=_positive_int,
        metavar="N",
        default=4,
        help="short-term window capacity (default 4, so messages get evicted)",
    )
    p.add_argument(
        "--show",
        type=_positive_int,
        metavar="N",
        default=12,
        help="changed notes shown after forgetting (default 12)",
    )
    p.set_defaults(func=cmd_demo)
