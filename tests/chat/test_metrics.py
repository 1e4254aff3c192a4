"""The official LongMemEval / LoCoMo metrics on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from soulmem_torch.chat.metrics import (
    dcg,
    locomo_recall,
    longmemeval_corpus_ids,
    ndcg_any,
    recall_all,
    recall_any,
    turns_to_sessions,
)


def test_recall() -> None:
    ranking = ["a", "b", "c", "d"]
    assert recall_any(ranking, ["c", "x"], 3) == 1.0
    assert recall_any(ranking, ["c", "x"], 2) == 0.0
    assert recall_all(ranking, ["a", "c"], 3) == 1.0
    assert recall_all(ranking, ["a", "d"], 3) == 0.0
    # empty gold: all([]) is true, any([]) false (the official code)
    assert recall_all(ranking, [], 1) == 1.0
    assert recall_any(ranking, [], 1) == 0.0


def test_dcg_ranks_one_and_two_undiscounted() -> None:
    assert dcg([1, 1, 1], 3) == pytest.approx(1 + 1 + 1 / math.log2(3))
    assert dcg([0, 1], 2) == 1.0
    assert dcg([], 5) == 0.0
    assert dcg([1, 0, 0, 1], 3) == 1.0  # cut at k


def test_ndcg_hand_computed() -> None:
    corpus = ["a", "b", "c", "d", "e"]
    # gold {b, d}; ranking d, a, b: DCG = 1 + 0 + 1/log2(3); IDCG(3) = 1 + 1
    got = ndcg_any(["d", "a", "b"], ["b", "d"], corpus, 3)
    assert got == pytest.approx((1 + 1 / math.log2(3)) / 2)
    assert ndcg_any(["a"], [], corpus, 3) == 0.0  # IDCG 0
    assert ndcg_any(["b", "d"], ["b", "d"], corpus, 10) == 1.0


def test_turns_to_sessions_keeps_first_position() -> None:
    assert turns_to_sessions(["s2_3", "s1_1", "s2_1", "answer_x_2"]) == ["s2", "s1", "answer_x"]


def test_corpus_renaming() -> None:
    sids = ["answer_a", "answer_b", "plain"]
    turns = [
        [("answer_a_1", "user", False), ("answer_a_2", "assistant", True)],  # evidence only
        [("answer_b_1", "user", True), ("answer_b_2", "user", False)],  # said by the assistant
        [("plain_1", "user", False), ("plain_2", "assistant", False)],
    ]
    corpus, renamed = longmemeval_corpus_ids(sids, turns, level="session")
    assert corpus == ["noans_a", "answer_b", "plain"]
    assert renamed["answer_a"] == "noans_a"
    corpus, renamed = longmemeval_corpus_ids(sids, turns, level="turn")
    assert corpus == ["noans_a_1", "answer_b_1", "noans_b_2", "plain_1"]
    # with the assistant's turns in the corpus, answer_a's evidence turn is gold
    corpus, _ = longmemeval_corpus_ids(sids, turns, level="turn", roles=("user", "assistant"))
    assert "answer_a_2" in corpus and "noans_a_1" in corpus


def test_locomo_recall() -> None:
    assert locomo_recall(["D1:1", "D2:3"], ["D2:3", "D9:9"], 2) == 0.5
    assert locomo_recall(["D1:1"], [], 5) == 1.0  # no evidence scores 1
    assert locomo_recall(["D1:1"], ["D1:1", "D1:1"], 1) == 1.0  # repeated ids once
