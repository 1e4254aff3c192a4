"""Forgetting benchmarks: decay as tensors, and forget_cluster with the offline FakeLLM.

Run: ``pytest benchmarks/test_bench_forget.py --benchmark-enable``. Data is built outside the
timed call; CUDA is synchronized inside it, after warm-up rounds.
"""

from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta, timezone

import pytest
import torch

from soulmem_torch.forget import FakeLLM, forget_cluster, jieba_tokenizer, missing_degree_batch
from soulmem_torch.forget.decay import NS_PER_HOUR, to_epoch_ns
from soulmem_torch.model import (
    ConceptType,
    Context,
    Environment,
    MemoryNote,
    SemMemory,
    SpecificSituation,
)

NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)
SENTENCES = [
    "今天下午我和张三在北京王府井的星巴克讨论了项目进展",
    "早上八点我在公园慢跑看到一只金毛犬在湖边嬉水",
    "On a quiet night, I spent hours polishing the silver cutlery of the mansion.",
    "那天深夜我在红魔馆的大厅擦洗 silver cutlery，Patchouli 小姐突然要我泡一壶 Darjeeling tea。",
    "鲁迅原名周树人浙江绍兴人",
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@pytest.fixture(params=[1, 0], ids=["1thread", "allthreads"])
def cpu_threads(request: pytest.FixtureRequest):
    """Intra-op CPU threads for the timed call: 1, or torch's default (0 here)."""
    before = torch.get_num_threads()
    if request.param:
        torch.set_num_threads(request.param)
    yield request.param or before
    torch.set_num_threads(before)


@pytest.mark.benchmark(group="forget-decay")
@pytest.mark.parametrize("num_notes", [10_000, 1_000_000])
def test_bench_missing_degree_batch(
    benchmark, num_notes: int, bench_device: torch.device, cpu_threads: int
) -> None:
    device = bench_device  # benchmarks/conftest.py: cpu, and cuda when present
    gen = torch.Generator().manual_seed(0)
    now_ns = to_epoch_ns(NOW)
    ages = torch.randint(0, 24 * 3650, (num_notes,), generator=gen) * NS_PER_HOUR
    create = (now_ns - ages - torch.randint(0, NS_PER_HOUR, (num_notes,), generator=gen)).to(device)
    counts = torch.randint(0, 200, (num_notes,), generator=gen).to(device)

    def run() -> torch.Tensor:
        out = missing_degree_batch(create, counts, now=now_ns)
        _sync(device)
        return out

    out = benchmark.pedantic(run, rounds=10, iterations=1, warmup_rounds=2)
    assert out.shape == (num_notes,)
    benchmark.extra_info["notes_per_s"] = num_notes / benchmark.stats.stats.mean
    benchmark.extra_info["cpu_threads"] = cpu_threads


def _notes(num_notes: int) -> list[MemoryNote]:
    """A realistic mix: a third fresh (NoAction), a third masked only, a third revised."""
    rng = random.Random(0)
    ages = [0, 3, 4, 48, 240, 2000]  # hours: md 0, .08, .11, .75, .999, 1.0
    notes = []
    for i in range(num_notes):
        created = NOW - timedelta(hours=ages[i % len(ages)])
        text = rng.choice(SENTENCES) + f" {i}"
        if i % 2:
            env = Context.new(environment=Environment(atmosphere="日常", tone="平静"))
            mem_type = SpecificSituation(narrative=text, time_span=created, context=env)
        else:
            mem_type = SemMemory(
                content=text, aliases=[], concept_type=ConceptType.ENTITY, description="d"
            )
        notes.append(MemoryNote.build(mem_type, create_time=created))
    return notes


@pytest.mark.benchmark(group="forget-cluster")
@pytest.mark.parametrize("concurrency", [16])
@pytest.mark.parametrize("num_notes", [10_000])
def test_bench_forget_cluster_fake_llm(benchmark, num_notes: int, concurrency: int) -> None:
    template = _notes(num_notes)
    tokenizer = jieba_tokenizer()  # dictionary loaded outside the timed call

    def setup() -> tuple[tuple, dict]:
        return ([n.model_copy(deep=True) for n in template],), {}

    def run(notes: list[MemoryNote]):
        return asyncio.run(
            forget_cluster(
                notes,
                FakeLLM(),
                now=NOW,
                tokenizer=tokenizer,
                concurrency=concurrency,
                progress=False,
            )
        )

    report = benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
    assert report.total == num_notes and report.failures == []
    assert report.revised > 0 and report.mask_only > 0 and report.no_action > 0
    benchmark.extra_info["notes_per_s"] = num_notes / benchmark.stats.stats.mean
    benchmark.extra_info["counts"] = report.counts
