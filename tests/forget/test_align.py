"""align_sem_fields (SPEC §8): prompt, parsing, alias cap, failures leave the note unchanged."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from soulmem_torch.errors import LLMError
from soulmem_torch.forget import (
    ALIGN_SYSTEM_PROMPT,
    AlignReply,
    FakeLLM,
    align_sem_fields,
    build_align_prompt,
    parse_align_response,
)
from soulmem_torch.model import ConceptType
from tests.forget._notes import T0, hours, make_proc, make_sem

CONTENT = "Rust是一门注重内存安全和零成本抽象的系统级编程语言"


class Answer:
    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, system: str, user: str) -> Any:
        self.calls.append((system, user))
        if isinstance(self.reply, BaseException):
            raise self.reply
        return self.reply


def rust_note() -> Any:
    return make_sem(CONTENT, T0, aliases=["Rust语言", "Rust-lang"], description="系统级编程语言")


def fields(note: Any) -> tuple:
    s = note.mem_type
    return (list(s.aliases), s.description, s.concept_type)


# ---- parsing --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            "Aliases: Rust语言, Rust-lang\nDescription: 系统级编程语言\nConceptType: Entity",
            AlignReply(["Rust语言", "Rust-lang"], "系统级编程语言", ConceptType.ENTITY),
        ),
        (
            '  Aliases:  "a" ,  b ,, \r\n Description: d \r\nConceptType: abstract idea',
            AlignReply(["a", "b"], "d", ConceptType.ABSTRACT),
        ),
        ("Description: only this", AlignReply(None, "only this", None)),
        ("Aliases: none\nDescription: None\nConceptType: ???", AlignReply([], None, None)),
        ("Aliases:\nDescription:\nConceptType:", AlignReply([], None, None)),
        ("Sure! Here you go: the aliases are fine.", AlignReply()),
        ("", AlignReply()),
        ("aliases: lower-case key\nDESCRIPTION: ignored", AlignReply()),
        ("ConceptType: Entity|Abstract", AlignReply(None, None, ConceptType.ENTITY)),
        ("Aliases: a\nAliases: b, c", AlignReply(["b", "c"], None, None)),
        ("Aliases: 'x', “y”", AlignReply(["x", "y"], None, None)),
    ],
    ids=[
        "well-formed",
        "spaces-quotes-crlf",
        "partial",
        "none",
        "empty-values",
        "garbage",
        "empty",
        "case-sensitive-keys",
        "entity-first",
        "last-wins",
        "other-quotes",
    ],
)
def test_parse(reply: str, expected: AlignReply) -> None:
    assert parse_align_response(reply) == expected


def test_parse_non_string() -> None:
    assert parse_align_response(None) == AlignReply()  # type: ignore[arg-type]


def test_prompt_layout() -> None:
    system, user = build_align_prompt("c", ["a", "b"], "d", ConceptType.ABSTRACT)
    assert system == ALIGN_SYSTEM_PROMPT
    assert (
        user
        == 'Content: c\nCurrent aliases: ["a", "b"]\nCurrent description: d\nCurrent concept type: Abstract'
    )
    assert build_align_prompt("c", [], "d", "Entity", "custom")[0] == "custom"
    for line in ("Aliases:", "Description:", "ConceptType: Entity|Abstract"):
        assert line in ALIGN_SYSTEM_PROMPT


# ---- applying -------------------------------------------------------------------------------
def test_well_formed_reply_replaces_fields() -> None:
    note = rust_note()
    llm = Answer("Aliases: Rust\nDescription: 编程语言\nConceptType: Abstract")
    result = asyncio.run(align_sem_fields(note, llm, now=T0 + hours(1)))
    assert fields(note) == (["Rust"], "编程语言", ConceptType.ABSTRACT)
    assert result.changed and not result.alias_growth_blocked
    assert result.aliases_before == ["Rust语言", "Rust-lang"]
    assert llm.calls == [
        build_align_prompt(CONTENT, ["Rust语言", "Rust-lang"], "系统级编程语言", "Entity")
    ]


def test_alias_list_may_not_grow_below_the_cap() -> None:
    note = rust_note()
    llm = Answer("Aliases: a, b, c\nDescription: new")
    result = asyncio.run(align_sem_fields(note, llm, now=T0 + hours(31)))  # md ≈ 0.59
    assert result.missing_degree < 0.6
    assert result.alias_growth_blocked
    assert fields(note) == (["Rust语言", "Rust-lang"], "new", ConceptType.ENTITY)


def test_alias_list_may_grow_from_the_cap() -> None:
    note = rust_note()
    result = asyncio.run(align_sem_fields(note, Answer("Aliases: a, b, c"), now=T0 + hours(32)))
    assert result.missing_degree >= 0.6
    assert fields(note)[0] == ["a", "b", "c"]


@pytest.mark.parametrize(("md", "grows"), [(0.5999, False), (0.6, True), (0.9, True)])
def test_cap_threshold_with_given_degree(md: float, grows: bool) -> None:
    note = rust_note()
    asyncio.run(align_sem_fields(note, Answer("Aliases: a, b, c"), missing_degree=md))
    assert (len(note.mem_type.aliases) == 3) is grows


def test_none_aliases_keep_the_old_ones() -> None:
    note = rust_note()
    asyncio.run(
        align_sem_fields(note, Answer("Aliases: none\nDescription: none"), missing_degree=0.9)
    )
    assert fields(note) == (["Rust语言", "Rust-lang"], "系统级编程语言", ConceptType.ENTITY)


@pytest.mark.parametrize("reply", ["I cannot help with that.", "   ", "Aliases", "{'json': true}"])
def test_garbage_changes_nothing(reply: str) -> None:
    note = rust_note()
    result = asyncio.run(align_sem_fields(note, Answer(reply), missing_degree=0.9))
    assert not result.changed
    assert fields(note) == (["Rust语言", "Rust-lang"], "系统级编程语言", ConceptType.ENTITY)


@pytest.mark.parametrize(
    ("reply", "kwargs", "match"),
    [
        (RuntimeError("down"), {}, "RuntimeError: down"),
        (None, {}, "expected a str reply, found NoneType"),
        ("hang", {"timeout": 0.02}, "timeout"),
    ],
)
def test_llm_failure_raises_and_leaves_the_note(reply: Any, kwargs: dict, match: str) -> None:
    note = rust_note()
    llm: Any = Answer(reply)
    if reply == "hang":

        async def llm(system: str, user: str) -> str:
            await asyncio.sleep(30)
            return "Aliases: x"

    with pytest.raises(LLMError, match=match):
        asyncio.run(align_sem_fields(note, llm, missing_degree=0.9, **kwargs))
    assert fields(note) == (["Rust语言", "Rust-lang"], "系统级编程语言", ConceptType.ENTITY)


def test_non_semantic_note_is_left_alone() -> None:
    llm = Answer("Aliases: x")
    assert asyncio.run(align_sem_fields(make_proc(), llm)) is None
    assert llm.calls == []


def test_fake_llm_keeps_consistent_fields() -> None:
    note = rust_note()
    result = asyncio.run(align_sem_fields(note, FakeLLM(), missing_degree=0.9))
    assert not result.changed
    no_alias = make_sem("x", T0, aliases=[], description="d", concept_type=ConceptType.ABSTRACT)
    assert not asyncio.run(align_sem_fields(no_alias, FakeLLM(), missing_degree=0.9)).changed
