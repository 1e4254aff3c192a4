"""``soulmem eval --format longmemeval|locomo`` and ``soulmem import-chat``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from soulmem_torch.chat import read_locomo, read_longmemeval
from soulmem_torch.chat.evaluate import chat_ablation, evaluate_locomo, evaluate_longmemeval
from soulmem_torch.cli import main
from tests.chat._data import locomo_file, longmemeval_file

SHARED = Path(os.environ.get("SOULMEM_SHARED", Path(__file__).resolve().parents[3] / "shared"))
DEV = SHARED / "longmemeval" / "longmemeval_s_dev.json"


def test_longmemeval_tiny(tmp_path) -> None:
    qs = read_longmemeval(longmemeval_file(tmp_path / "lme.json"))
    report = evaluate_longmemeval(qs)
    assert report.counts == {"questions": 2, "paper": 1, "strict": 1}
    # the cat session is found first; the abstention question is left out of "paper"
    assert report.rankings[0][0] == "q1" and report.rankings[0][1][0] == "answer_cat"
    assert report.summary["paper/session/recall_all@1"] == 1.0
    assert report.summary["paper/session/ndcg_any@1"] == 1.0
    # rankings are the whole corpus when it is shorter than the depth
    assert sorted(report.rankings[1][1]) == ["s_lena", "s_pasta"]
    turns = evaluate_longmemeval(qs, level="turn")
    # the evidence turn (has_answer) is the gold; the user turn without it is noans
    ranking = turns.rankings[0][1]
    assert set(ranking) == {"answer_cat_1", "answer_cat_3", "s_pasta_1", "s_lena_1"}
    assert turns.summary["paper/turn/recall_all@1"] == float(ranking[0] == "answer_cat_3")
    assert turns.summary["paper/turn/recall_all@3"] == float("answer_cat_3" in ranking[:3])
    assert turns.summary["paper/session/recall_all@1"] == 1.0
    assert all(0.0 <= v <= 1.0 for v in turns.summary.values())


def test_locomo_tiny(tmp_path) -> None:
    samples = read_locomo(locomo_file(tmp_path / "locomo.json"))
    report = evaluate_locomo(samples)
    assert [qid for qid, _ in report.rankings] == ["conv-x:0", "conv-x:1", "conv-x:2"]
    ranking = report.rankings[0][1]
    assert sorted(ranking) == ["D1:1", "D1:2", "D1:3", "D2:1", "D2:2"]
    assert report.groups["category_1"]["turn/recall@3"] == float("D1:3" in ranking[:3])
    second = report.rankings[1][1]  # evidence D2:1 and D1:1: half or all of it
    assert report.groups["category_2"]["turn/recall@1"] == 0.5 * (second[0] in ("D2:1", "D1:1"))
    assert report.counts == {"questions": 3, "overall": 2}
    assert set(report.groups) == {"category_1", "category_2", "category_5", "overall"}
    assert report.groups["category_5"]["turn/recall@1"] == 1.0  # no evidence scores 1
    assert report.summary["session/recall@10"] == 1.0


def test_chat_ablation_rows(tmp_path) -> None:
    qs = read_longmemeval(longmemeval_file(tmp_path / "lme.json"))
    rows = chat_ablation(qs, format="longmemeval", level="session")
    labels = [label for label, _ in rows]
    assert labels[0].startswith("original pipeline") and any("default" in x for x in labels)
    assert all("paper/session/recall_all@5" in r.summary for _, r in rows)


def test_cli_eval_rankings_and_json(tmp_path, capsys) -> None:
    path = longmemeval_file(tmp_path / "lme.json")
    out = tmp_path / "rankings.jsonl"
    assert (
        main(["eval", "--format", "longmemeval", str(path), "--rankings", str(out), "--json"]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["counts"]["paper"] == 1 and "paper/session/ndcg_any@5" in data["summary"]
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["question_id"] for x in lines] == ["q1", "q2_abs"]
    assert lines[0]["ranking"][0] == "answer_cat"
    assert main(["eval", "--format", "locomo", str(locomo_file(tmp_path / "l.json"))]) == 0
    table = capsys.readouterr().out
    assert "turn/recall@5" in table and "category_5" in table


def test_cli_eval_errors(tmp_path, capsys) -> None:
    assert main(["eval", "--format", "longmemeval", str(tmp_path / "missing.json")]) == 1
    assert "no such file" in capsys.readouterr().err
    suite = tmp_path / "x.json"
    suite.write_text("[]")
    assert main(["eval", str(suite), "--rankings", str(tmp_path / "r.jsonl")]) == 1
    assert "--rankings and --level are for" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a list"}')
    assert main(["eval", "--format", "locomo", str(bad)]) == 1
    assert "expected a JSON list" in capsys.readouterr().err


def test_cli_import_chat(tmp_path, capsys) -> None:
    log = tmp_path / "chat.jsonl"
    log.write_text(
        json.dumps({"session": "a", "speaker": "Ann", "role": "user", "text": "my cat Miso",
                    "time": "2024-01-01T10:00:00Z"}) + "\n"
        + json.dumps({"session": "a", "speaker": "Bot", "role": "assistant", "text": "cute"})
        + "\n"
    )  # fmt: skip
    store = tmp_path / "store"
    assert main(["import-chat", str(log), str(store)]) == 0
    assert "1 sessions (2 turns)" in capsys.readouterr().out
    from soulmem_torch import SoulMem

    mem = SoulMem.load(store)
    (r,) = mem.ask("Miso")
    assert mem.chat_source(r.association[0][0]) == ("a", "a_1")
    assert main(["import-chat", str(tmp_path / "nope.jsonl"), str(store)]) == 1
    assert "no such file" in capsys.readouterr().err


@pytest.mark.skipif(not DEV.is_file(), reason=f"LongMemEval dev half not found at {DEV}")
def test_longmemeval_dev_file_first_questions() -> None:
    qs = read_longmemeval(DEV)
    assert len(qs) == 250 and sum(not q.abstention for q in qs) == 241  # the "paper" count
    report = evaluate_longmemeval(qs[:8])
    for qid, ranking in report.rankings:
        assert len(ranking) >= 40 and len(set(ranking)) == len(ranking), qid
    assert all(0.0 <= v <= 1.0 for v in report.summary.values())


def test_cli_import_chat_benchmark_formats(tmp_path, capsys) -> None:
    from soulmem_torch import SoulMem

    lme = longmemeval_file(tmp_path / "lme.json")
    store = tmp_path / "lme_store"
    assert main(["import-chat", str(lme), str(store), "--level", "session"]) == 0
    # three distinct sessions (s_lena and s_pasta are in both haystacks): imported once each
    assert "3 sessions" in capsys.readouterr().out
    assert len(SoulMem.load(store)) == 3
    loc = locomo_file(tmp_path / "locomo.json")
    store2 = tmp_path / "locomo_store"
    assert main(["import-chat", str(loc), str(store2), "--roles", "speaker_a"]) == 0
    mem = SoulMem.load(store2)
    sources = {mem.chat_source(e.note.id) for e in mem.cluster}
    assert ("conv-x:session_1", "D1:3") in sources and ("conv-x:session_2", "D2:2") in sources
    assert not any(t == "D1:2" for _, t in sources)  # Melanie's (speaker_b) turns left out
