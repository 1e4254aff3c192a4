"""``soulmem eval --ablation``: one table, a row per configuration (in-process)."""

from __future__ import annotations

import json

import pytest

from soulmem_torch.cli import main
from soulmem_torch.data import sample_queries_path


def test_eval_ablation_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(sample_queries_path()), "--ablation", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    labels = [row["configuration"] for row in out["rows"]]
    assert labels[0].startswith("original pipeline") and labels[4].startswith("default")
    assert len(labels) == 9 and sum("without" in label for label in labels) == 4
    by = {row["configuration"]: row["summary"] for row in out["rows"]}
    default = by["default: seeds + text + graph + graph_undirected"]
    assert default["c_recall@5"] > by["original pipeline (.original())"]["c_recall@5"]
    assert default["pass_rate"] == 1.0


def test_eval_ablation_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(sample_queries_path()), "--ablation", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "configuration" in out and "sq MRR" in out and "cb R@5" in out
    assert "default without graph" in out
