from __future__ import annotations

from datetime import datetime, timezone

import pytest

from soulmem_torch import MemoryBank, SoulMem
from soulmem_torch.chat import ChatSession, ChatTurn, chat_source, sessions_to_notes
from soulmem_torch.errors import NotFoundError, ValidationError

DAY = datetime(2024, 5, 1, 9, 30, tzinfo=timezone.utc)


def _chat() -> list[ChatSession]:
    return [
        ChatSession(
            "s1",
            DAY,
            (
                ChatTurn("Ann", "user", "I adopted a grey cat named Miso"),
                ChatTurn("Bot", "assistant", "Congratulations on the adoption"),
                ChatTurn("Ann", "user", "She sleeps on the piano"),
            ),
        ),
        ChatSession("s2", None, (ChatTurn("Ann", "user", "Pasta with mushrooms tonight"),)),
    ]


def test_turn_level_mapping() -> None:
    made = sessions_to_notes(_chat())
    kinds = [n.kind for n in made.notes]
    # 4 turns, 2 episodes, 2 speakers
    assert kinds.count("SpecificSituation") == 4
    assert kinds.count("AbstractSituation") == 2
    assert kinds.count("Semantic") == 2
    assert [made.source[i] for i in made.corpus] == ["s1_1", "s1_2", "s1_3", "s2_1"]
    turn = made.notes[0]
    assert turn.mem_type.narrative == "I adopted a grey cat named Miso"
    assert turn.mem_type.time_span == DAY
    assert turn.mem_type.context.participants[0].name == "Ann"
    assert chat_source(turn) == ("s1", "s1_1")
    verbs = sorted(
        getattr(link.link_type, "verb", type(link.link_type).__name__) for link in turn.mem_links
    )
    assert verbs == ["SpecificToAbstract", "said by", "then"]
    episode = next(n for n in made.notes if n.kind == "AbstractSituation")
    assert len(episode.mem_links) == 3 and chat_source(episode) == ("s1", None)
    # a session without a time: its notes are dated at the epoch (undated)
    assert made.notes[3].mem_type.time_span.year == 1970


def test_session_level_and_roles() -> None:
    made = sessions_to_notes(_chat(), level="session", roles=["user"])
    assert len(made.notes) == 2 and not any(n.mem_links for n in made.notes)
    assert made.notes[0].mem_type.narrative == (
        "I adopted a grey cat named Miso She sleeps on the piano"
    )
    assert [made.source[i] for i in made.corpus] == ["s1", "s2"]
    turn_only = sessions_to_notes(_chat(), roles=["assistant"], speakers=False, episodes=False)
    assert [n.mem_type.narrative for n in turn_only.notes] == ["Congratulations on the adoption"]


def test_mapping_errors() -> None:
    with pytest.raises(ValidationError, match="level"):
        sessions_to_notes(_chat(), level="word")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"sessions\[0\]: expected a ChatSession"):
        sessions_to_notes(["hello"])  # type: ignore[list-item]


def test_soulmem_add_sessions_maps_back_after_save(tmp_path) -> None:
    mem = SoulMem()
    assert mem.add_sessions(_chat()) == 8
    (r,) = mem.ask("where does the cat sleep? piano")
    sources = [mem.chat_source(i) for i, _ in r.association]
    assert ("s1", "s1_3") in sources[:3]
    mem.save(tmp_path / "store")
    again = SoulMem.load(tmp_path / "store")
    (r2,) = again.ask("where does the cat sleep? piano")
    assert [again.chat_source(i) for i, _ in r2.association] == sources
    with pytest.raises(NotFoundError):
        mem.chat_source(next(iter(made.corpus)) if (made := sessions_to_notes(_chat())) else None)


def test_bank_add_sessions_creates_then_extends() -> None:
    bank = MemoryBank()
    assert bank.add_sessions("ann", _chat()[:1]) == 6  # 3 turns, 1 episode, 2 speakers
    assert bank.add_sessions("ann", _chat()[1:]) == 2  # 1 turn, 1 episode; "Ann" known
    (r,) = bank.ask(["ann"], ["mushrooms pasta"])
    mem = bank.agent("ann")
    assert mem.chat_source(r.association[0][0]) == ("s2", "s2_1")
