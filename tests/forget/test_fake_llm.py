"""FakeLLM: deterministic, fills every mask, answers alignment prompts, never reaches a network."""

from __future__ import annotations

import asyncio
import time

import pytest

from soulmem_torch.forget import (
    FakeLLM,
    build_align_prompt,
    build_reconstruct_prompt,
    mask_text,
    parse_align_response,
)
from soulmem_torch.model import ConceptType

TEXTS = [
    "鲁迅原名周树人浙江绍兴人",
    "On a quiet night, I spent hours polishing the silver cutlery.",
    "那天深夜我在红魔馆的大厅擦洗 silver cutlery，Patchouli 小姐突然要我泡一壶茶。",
]


@pytest.mark.parametrize("md", [0.2, 0.5, 1.0])
@pytest.mark.parametrize("text", TEXTS)
def test_fills_every_mask_deterministically(text: str, md: float) -> None:
    masked = mask_text(text, md).masked_text
    system, user = build_reconstruct_prompt(masked)
    first = asyncio.run(FakeLLM()(system, user))
    assert first == FakeLLM().respond(system, user)
    assert "[masked]" not in first
    assert first.strip() == first and first


def test_language_of_the_filler() -> None:
    llm = FakeLLM(zh_words=["某"], en_words=["thing"])
    assert llm.fill_masks("鲁迅 [masked] 周树人") == "鲁迅某周树人"
    assert llm.fill_masks("Hello  [masked] ") == "Hello thing"
    assert llm.fill_masks("a [masked]  [masked] b") == "a thing thing b"
    assert llm.fill_masks("Hi, [masked] !") == "Hi, thing!"


def test_alignment_answer_keeps_the_fields() -> None:
    _, user = build_align_prompt("c", ["a", "b"], "desc", ConceptType.ABSTRACT)
    reply = FakeLLM().respond("", user)
    assert parse_align_response(reply).aliases == ["a", "b"]
    assert parse_align_response(reply).description == "desc"
    assert parse_align_response(reply).concept_type is ConceptType.ABSTRACT
    _, user = build_align_prompt("c", [], "", ConceptType.ENTITY)
    assert parse_align_response(FakeLLM().respond("", user)).aliases == []


def test_summary_fallback_counts_and_delay() -> None:
    llm = FakeLLM(delay=0.02, max_summary_chars=8)
    start = time.perf_counter()
    reply = asyncio.run(llm("summarize", "[user]: hello\n[assistant]: world"))
    assert time.perf_counter() - start >= 0.02
    assert reply == "lo world"
    assert llm.calls == 1
    assert FakeLLM().respond("", "") == "(nothing to summarize)"
    with pytest.raises(ValueError, match="non-empty"):
        FakeLLM(zh_words=[])
