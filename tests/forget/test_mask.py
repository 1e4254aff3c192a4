"""mask_text (SPEC §8): jieba tokens, masked count, seed recipe, platform-independent shuffle."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soulmem_torch.errors import ValidationError
from soulmem_torch.forget import (
    MASK_WORD,
    MaskResult,
    SplitMix64,
    jieba_tokenizer,
    mask_text,
    resolve_tokenizer,
    text_seed,
)
from soulmem_torch.forget.mask import choose_masked_indices, mask_count

REPO = Path(__file__).resolve().parents[2]

ZH = "鲁迅原名周树人浙江绍兴人"
EN = "On a quiet night, I spent hours polishing the silver cutlery of the Scarlet Devil Mansion."
MIXED = "那天深夜我在红魔馆的大厅擦洗 silver cutlery，Patchouli 小姐突然要我泡一壶 Darjeeling tea。"
TEXTS = [ZH, EN, MIXED, "今天下午我和张三在北京王府井的星巴克讨论了项目进展", "a", "  ", "x\ny"]
DEGREES = [0.0, 0.03, 0.05, 0.1, 0.15, 0.159_103_572_368_621_83, 0.33, 0.5, 0.77, 0.999, 1.0]

# Pinned outputs: a change here means masks differ from earlier releases (or another platform).
GOLDEN = [
    (ZH, 0.5, " [masked] 原名 [masked] 浙江 [masked] ", 3, 5, 15826124580174467608),
    (
        EN,
        0.3,
        " [masked]  a quiet night,  [masked]  [masked] spent hours [masked]  [masked]  the  [masked]  "
        "[masked] cutlery  [masked]  the Scarlet Devil [masked] Mansion [masked] ",
        10,
        33,
        14661776253668234552,
    ),
    (
        MIXED,
        0.2,
        "那天深夜我在红魔馆的大厅擦洗 silver cutlery [masked]  [masked]  [masked]  [masked] 突然要我泡一壶 "
        "Darjeeling [masked] tea。",
        5,
        27,
        4321991323760658722,
    ),
]


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def expected_count(md: float, total: int) -> int:
    if total == 0 or md <= 0:
        return 0
    return min(math.floor(f32(f32(md) * total) + 0.5), total)


def check_result(text: str, md: float, result: MaskResult) -> None:
    tokens = jieba_tokenizer()(text)
    assert "".join(tokens) == text
    assert result.total_count == len(tokens)
    assert result.masked_count == expected_count(md, len(tokens))
    assert len(result.masked_indices) == result.masked_count
    assert len(set(result.masked_indices)) == result.masked_count
    rebuilt = [MASK_WORD if i in result.masked_indices else tok for i, tok in enumerate(tokens)]
    assert result.masked_text == "".join(rebuilt)
    assert result.missing_degree == md


@pytest.mark.parametrize("md", DEGREES)
@pytest.mark.parametrize("text", [ZH, EN, MIXED], ids=["zh", "en", "mixed"])
def test_masks_round_md_times_tokens(text: str, md: float) -> None:
    check_result(text, md, mask_text(text, md))


def test_tokens_are_jieba_accurate_mode_with_whitespace_and_punctuation() -> None:
    assert jieba_tokenizer()(ZH) == ["鲁迅", "原名", "周树人", "浙江", "绍兴人"]
    tokens = jieba_tokenizer()("Hello, world!")
    assert tokens == ["Hello", ",", " ", "world", "!"]


@pytest.mark.parametrize("md", [0.0, 0.5, 1.0])
def test_empty_text(md: float) -> None:
    assert mask_text("", md) == MaskResult("", 0, 0, md)


@pytest.mark.parametrize("md", [0.0, -0.5, -1e-9])
def test_degree_zero_or_below_changes_nothing(md: float) -> None:
    result = mask_text(ZH, md)
    assert result.masked_text == ZH
    assert (result.masked_count, result.total_count) == (0, 5)


@pytest.mark.parametrize("text", [ZH, EN, MIXED])
def test_degree_one_masks_every_token(text: str) -> None:
    result = mask_text(text, 1.0)
    assert result.masked_count == result.total_count
    assert result.masked_text == MASK_WORD * result.total_count


def test_small_degree_that_rounds_to_zero_changes_nothing() -> None:
    result = mask_text(ZH, 0.09)  # 0.45 tokens
    assert (result.masked_text, result.masked_count, result.total_count) == (ZH, 0, 5)


def test_degree_above_one_is_capped() -> None:
    assert mask_text(ZH, 3.0).masked_count == 5


def test_round_half_away_from_zero() -> None:
    # Python's round() would give 0 for 0.5 and 2 for 2.5.
    assert mask_count(0.25, 2) == 1
    assert mask_count(0.25, 10) == 3
    assert mask_count(0.15, 10) == 2  # 0.15f32 · 10 = 1.5000000596…
    assert mask_text("a b", 0.25, tokenizer=str.split).masked_count == 1


@pytest.mark.parametrize(("text", "md", "masked", "count", "total", "seed"), GOLDEN)
def test_golden_outputs(
    text: str, md: float, masked: str, count: int, total: int, seed: int
) -> None:
    assert text_seed(text, md) == seed
    result = mask_text(text, md)
    assert (result.masked_text, result.masked_count, result.total_count) == (masked, count, total)


def test_seed_recipe() -> None:
    md = 0.25
    bits = struct.unpack("<I", struct.pack("<f", md))[0]
    h = 0
    for b in b"ab":
        h = (h * 31 + b) % 2**64
    assert text_seed("ab", md) == h ^ ((bits * 114514) % 2**64)
    assert text_seed("", 0.0) == 0
    long_text = "长" * 200  # the hash wraps at 2**64
    assert 0 <= text_seed(long_text, 0.5) < 2**64


def test_splitmix64_reference_vector() -> None:
    # Vigna's splitmix64.c, seed 1234567.
    rng = SplitMix64(1234567)
    assert [rng.next_u64() for _ in range(5)] == [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]


def test_bounded_draw_and_shuffle() -> None:
    rng = SplitMix64(7)
    assert all(rng.below(1) == 0 for _ in range(10))
    assert {rng.below(3) for _ in range(200)} == {0, 1, 2}
    with pytest.raises(ValidationError, match="bound"):
        rng.below(0)
    chosen = choose_masked_indices(10, 10, 42)
    assert sorted(chosen) == list(range(10))
    assert choose_masked_indices(10, 4, 42) == chosen[:4]  # a prefix of the full shuffle


def test_deterministic_within_a_process() -> None:
    import jieba

    other = jieba.Tokenizer()
    for text in TEXTS:
        for md in DEGREES:
            first = mask_text(text, md)
            assert mask_text(text, md) == first
            assert mask_text(text, md, tokenizer=other) == first


@settings(max_examples=100, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from("abc 你好世界，。!\n"), max_size=40),
    md=st.floats(min_value=0, max_value=1),
)
def test_properties(text: str, md: float) -> None:
    check_result(text, md, mask_text(text, md))


_PROBE = """
import json, sys
from soulmem_torch.forget import mask_text
texts = json.loads(sys.argv[1]); degrees = json.loads(sys.argv[2])
out = [[mask_text(t, d).masked_text for d in degrees] for t in texts]
print(json.dumps([out, "jieba" in sys.modules], ensure_ascii=False))
"""


def run_probes(*hash_seeds: str) -> list[list]:
    """Runs the probe once per hash seed, in parallel child processes."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PROBE, json.dumps(TEXTS), json.dumps(DEGREES)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=REPO,
        )
        for seed in hash_seeds
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_deterministic_across_processes_with_different_hash_seeds() -> None:
    (first, jieba_loaded), (second, _) = run_probes("1", "2024")
    assert jieba_loaded
    assert first == second
    assert first == [[mask_text(t, d).masked_text for d in DEGREES] for t in TEXTS]


def test_jieba_is_imported_lazily() -> None:
    code = "import sys, soulmem_torch.forget; print('jieba' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=True,
    )
    assert proc.stdout.strip() == "False"


def test_tokenizer_is_injectable_and_reused() -> None:
    calls: list[str] = []

    def spaces(text: str) -> list[str]:
        calls.append(text)
        return text.split(" ")

    result = mask_text("a b c d", 0.5, tokenizer=spaces)
    assert calls == ["a b c d"]
    assert result.total_count == 4 and result.masked_count == 2
    assert jieba_tokenizer() is jieba_tokenizer()
    assert resolve_tokenizer(None) is jieba_tokenizer()
    assert resolve_tokenizer(spaces) is spaces


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"missing_degree": float("nan")},
            "missing_degree: expected a finite float32 number, found nan",
        ),
        ({"missing_degree": float("inf")}, "missing_degree"),
        ({"missing_degree": 1e300}, "missing_degree"),
        ({"missing_degree": "0.5"}, "missing_degree: expected a finite number, found str"),
        ({"text": None}, "text: expected str, found NoneType"),
        ({"tokenizer": 42}, "tokenizer: expected None, a jieba.Tokenizer or a callable"),
    ],
)
def test_validation(kwargs: dict, match: str) -> None:
    args = {"text": ZH, "missing_degree": 0.5, **kwargs}
    with pytest.raises(ValidationError, match=match):
        mask_text(**args)
