"""String channel (SPEC §4): rapidfuzz against the pure-Python reference of the SPEC
definition, the original's own string-distance test values, and the batched (B, N) channel
against a per-note scalar reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from soulmem_torch.embedding import build_identifier_index, string_scores
from soulmem_torch.functional.similarity import BlendWeights, f32
from soulmem_torch.functional.string_sim import (
    jaro_similarity,
    jaro_winkler_similarity,
    normalized_levenshtein_similarity,
    string_distance_matrix,
    string_distance_score,
    string_distance_score_reference,
)
from soulmem_torch.model import (
    AbstractSituation,
    ConceptType,
    Environment,
    Event,
    Location,
    MemoryNote,
    Participant,
    SemMemory,
)
from soulmem_torch.model.query import MemoryRetrieveQuery
from tests.embedding.helpers import random_note, random_query
from tests.functional.test_similarity import _Ref

ALPHABETS = ["ab", "abcd", "酒馆小图书张三丰", "酒馆", "aé酒😀", "abcdefghij"]


def _strings(alphabet: str, max_size: int) -> st.SearchStrategy[str]:
    return st.text(alphabet=alphabet, max_size=max_size)


@settings(max_examples=400, deadline=None)
@given(data=st.data(), alphabet=st.sampled_from(ALPHABETS))
def test_rapidfuzz_agrees_with_reference(data: st.DataObject, alphabet: str) -> None:
    from rapidfuzz.distance import JaroWinkler, Levenshtein

    a = data.draw(_strings(alphabet, 12))
    b = data.draw(_strings(alphabet, 12))
    assert JaroWinkler.similarity(a, b) == jaro_winkler_similarity(a, b)
    assert Levenshtein.normalized_similarity(a, b) == pytest.approx(
        normalized_levenshtein_similarity(a, b), abs=1e-15
    )
    assert string_distance_score(a, b) == string_distance_score_reference(a, b)


def test_rapidfuzz_agrees_on_long_strings() -> None:
    from rapidfuzz.distance import JaroWinkler

    rng = np.random.default_rng(0)
    for alphabet in ALPHABETS:
        for _ in range(60):
            a = "".join(rng.choice(list(alphabet), int(rng.integers(0, 150))))
            b = "".join(rng.choice(list(alphabet), int(rng.integers(0, 150))))
            assert JaroWinkler.similarity(a, b) == pytest.approx(
                jaro_winkler_similarity(a, b), abs=1e-12
            )
            assert string_distance_score(a, b) == string_distance_score_reference(a, b)


def test_definition_details() -> None:
    # window 0 for max length <= 3: a prefix insertion finds no match at all
    assert jaro_similarity("酒馆", "小酒馆") == 0.0
    assert jaro_winkler_similarity("酒馆", "小酒馆") == 0.0
    # ... the Levenshtein side rescues it: 1 − 1/3
    assert string_distance_score_reference("酒馆", "小酒馆") == pytest.approx(2 / 3)
    # suffix insertion: jaro (2/2 + 2/3 + 1)/3, winkler bonus 0.1·2·(1 − jaro)
    j = (1 + 2 / 3 + 1) / 3
    assert jaro_winkler_similarity("图书", "图书馆") == pytest.approx(j + 0.2 * (1 - j))
    # bonus only when jaro > 0.7; prefix capped at 4
    assert jaro_winkler_similarity("abcdefgh", "abcdefgx") == pytest.approx(
        jaro_similarity("abcdefgh", "abcdefgx")
        + 0.4 * (1 - jaro_similarity("abcdefgh", "abcdefgx"))
    )
    low = jaro_similarity("ab", "ax")
    assert low <= 0.7 and jaro_winkler_similarity("ab", "ax") == low
    # transpositions
    assert jaro_similarity("martha", "marhta") == pytest.approx((1 + 1 + 5 / 6) / 3)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [("", "", 1.0), ("", "酒馆", 0.0), ("酒馆", "", 0.0), ("战斗", "战斗", 1.0), ("战斗", "冲突", 0.0),
     ("Rust", "铁锈", 0.0), ("Rust", "Rust", 1.0)],
)  # fmt: skip
def test_original_exact_values(a: str, b: str, expected: float) -> None:
    assert string_distance_score(a, b) == expected
    assert string_distance_score_reference(a, b) == expected


def test_original_ranges() -> None:
    assert 0.5 < string_distance_score("酒馆", "小酒馆") < 1.0
    assert string_distance_score("图书", "图书馆") > 0.8
    for a, b in [("小酒馆", "酒馆"), ("张三丰", "张三"), ("战斗", "战斗")]:
        combined = string_distance_score(a, b)
        assert combined >= f32(jaro_winkler_similarity(a, b))
        assert combined >= f32(normalized_levenshtein_similarity(a, b))


def test_matrix_matches_scalar() -> None:
    qs = ["酒馆", "", "图书", "Rust编程", "😀x"]
    cs = ["小酒馆", "", "图书馆", "Rust", "x😀", "张三"]
    m = string_distance_matrix(qs, cs)
    assert m.shape == (5, 6) and m.dtype == np.float32
    want = np.array([[string_distance_score_reference(a, b) for b in cs] for a in qs], np.float32)
    np.testing.assert_array_equal(m, want)
    assert string_distance_matrix([], cs).shape == (0, 6)


# -------------------------------------------------------------------------------------------
# the (B, N) channel
# -------------------------------------------------------------------------------------------
def _sem(content: str, aliases: list[str]) -> MemoryNote:
    return MemoryNote.build(
        SemMemory(content=content, aliases=aliases, concept_type=ConceptType.ENTITY, description="")
    )


def _abs(leaf: object) -> MemoryNote:
    return MemoryNote.build(AbstractSituation(leaf))


def test_original_channel_cases(device: torch.device) -> None:
    event_note = _abs(Event(action="跑步", action_intensity=0.5, initiator="张三", target="操场"))
    notes = [
        _sem("战斗", []),
        _sem("冲突", []),
        _sem("Rust编程语言", ["Rust"]),
        _abs(Location(name="酒馆", coordinates="")),
        _abs(Participant(name="张三", role="学生")),
        _abs(Environment(atmosphere="安静", tone="温暖")),
        event_note,
    ]
    sem = MemoryRetrieveQuery.semantic
    sit = MemoryRetrieveQuery.situation
    queries = [
        sem([{"concept_identifier": "战斗"}]),
        sem([{"concept_identifier": "Rust"}]),
        sem([{"description": "关于战争的描述"}]),
        sem([{"concept_identifier": "无关概念"}, {"concept_identifier": "战斗"}]),
        sit([{"narrative": "战斗场景"}]),
        sit([{"location": [{"name": "小酒馆"}]}]),
        sit([{"participants": [{"name": "张三"}]}]),
        sit([{"environment": {"atmosphere": "安静"}}]),
        sit([{"event": [{"action": "跑步"}]}]),
        sit([{"event": [{"action": "跑步", "initiator": "张三"}]}]),
        sit([{"event": [{"action": "无关", "initiator": "张三丰", "target": "操场"}]}]),
        sit([{"event": [{"action": "跑", "target": "操"}]}]),
    ]
    s = string_scores(queries, notes, device=device).cpu()
    assert s.shape == (12, 7) and s.device.type == "cpu"
    sds = string_distance_score
    assert s[0, 0] == 1.0 and s[0, 1] == 0.0
    assert s[1, 2] == 1.0  # alias hit
    assert (s[2] == 0).all()  # no concept identifier
    assert s[3, 0] == 1.0  # max over units
    assert (s[4] == 0).all()  # Semantic notes never match a Situation query
    assert s[5, 3] == pytest.approx(2 / 3) and s[5, 3] > 0.5
    assert s[6, 4] == 1.0 and s[7, 5] == 1.0 and s[8, 6] == 1.0
    assert s[9, 6] >= 1.0 - 1e-6
    w = BlendWeights()

    def mul(x: float, y: float) -> float:  # float32 product
        return f32(f32(x) * f32(y))

    both = f32(
        f32(
            mul(w.sit_event_initiator, sds("张三丰", "张三"))
            + mul(w.sit_event_target, sds("操场", "操场"))
        )
        + mul(w.sit_event_action, sds("无关", "跑步"))
    )
    assert s[10, 6].item() == both
    a = f32(w.sit_event_target_only_action)
    only_t = f32(mul(f32(1.0 - a), sds("操", "操场")) + mul(a, sds("跑", "跑步")))
    assert s[11, 6].item() == only_t
    # custom weights reach the channel
    action_only = BlendWeights(sit_event_initiator=0.0, sit_event_target=0.0, sit_event_action=1.0)
    s2 = string_scores(queries[10:11], notes, weights=action_only)
    assert s2[0, 6].item() == sds("无关", "跑步")


@pytest.mark.parametrize("seed", [0, 1])
def test_channel_matches_scalar_reference(seed: int, device: torch.device) -> None:
    rng = np.random.default_rng(seed)
    notes = [random_note(rng) for _ in range(50)]
    queries = [random_query(rng) for _ in range(30)]
    index = build_identifier_index(notes)
    got = string_scores(queries, index, device=device)
    want = np.array([[_Ref.string(n, q) for n in notes] for q in queries])
    np.testing.assert_allclose(got.cpu().numpy(), want, atol=1e-6, rtol=0)
    assert (got >= 0).all() and (got <= 1 + 1e-6).all()


def test_channel_empty_inputs() -> None:
    notes = [_sem("", []), _abs(Event(action="", action_intensity=0.0, initiator="", target=""))]
    queries = [
        MemoryRetrieveQuery.semantic([{"concept_identifier": ""}]),
        MemoryRetrieveQuery.semantic([]),
        MemoryRetrieveQuery.situation([{"event": [{"action": ""}]}]),
    ]
    s = string_scores(queries, notes)
    assert torch.isfinite(s).all()
    assert s.tolist() == [[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]]
    assert string_scores([], notes).shape == (0, 2)
    assert string_scores(queries, []).shape == (3, 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_segments_equal_one_index_at_a_time(seed: int, device: torch.device) -> None:
    """``string_scores_segments``: each query against its own index, all in one pass, equals
    ``string_scores`` per index bit for bit (owners repeat, an index may be empty, owner -1
    gives a zero row); wider than an index, the extra columns are zeros."""
    from soulmem_torch.embedding.identifiers import string_scores_segments
    from soulmem_torch.functional.string_sim import IdentifierColumns

    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(0, 25)) for _ in range(5)] + [0]
    indexes = [build_identifier_index([random_note(rng) for _ in range(n)]) for n in sizes]
    queries = [random_query(rng) for _ in range(40)]
    owners = [int(rng.integers(-1, len(sizes))) for _ in queries]
    m = max(sizes) + 3
    columns = [IdentifierColumns.of(ix) for ix in indexes]
    columns[2] = None  # an agent without an index
    got = string_scores_segments(queries, columns, owners, m, device=device)
    assert got.shape == (40, m) and got.device.type == device.type
    for b, (q, o) in enumerate(zip(queries, owners)):
        want = torch.zeros(m)
        if o >= 0 and columns[o] is not None:
            want[: sizes[o]] = string_scores([q], indexes[o])[0]
        assert torch.equal(got[b].cpu(), want), (b, o)
    assert string_scores_segments([], columns, [], m).shape == (0, m)
    # the joined indexes kept in a cache (one slot) give the same bits, and are rebuilt for
    # other indexes
    cache: dict = {}
    for _ in range(2):
        kept = string_scores_segments(queries, columns, owners, m, device=device, cache=cache)
        assert torch.equal(kept, got)
    layout = cache["string_columns_layout"]
    fewer = [*columns[:-1], IdentifierColumns.of(indexes[0])]
    again = string_scores_segments(queries, fewer, owners, m, device=device, cache=cache)
    assert cache["string_columns_layout"] is not layout
    assert torch.equal(again, string_scores_segments(queries, fewer, owners, m, device=device))


def test_segments_refuse_notes_past_the_width() -> None:
    from soulmem_torch.embedding.identifiers import string_scores_segments
    from soulmem_torch.errors import ValidationError
    from soulmem_torch.functional.string_sim import IdentifierColumns

    notes = [_sem("tea", []), _sem("coffee", [])]
    columns = [IdentifierColumns.of(build_identifier_index(notes))]
    query = MemoryRetrieveQuery.semantic([{"concept_identifier": "tea"}])
    want = string_scores([query], notes)
    assert torch.equal(string_scores_segments([query], columns, [0], 2), want)
    with pytest.raises(ValidationError, match="num_notes"):
        string_scores_segments([query], columns, [0], 1)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_strings("aé酒馆😀的我\ud800", 60), min_size=1, max_size=8),
    st.lists(_strings("aé酒馆😀的我b", 12), min_size=1, max_size=12),
    st.data(),
)
def test_pair_scores_skip_only_pairs_that_cannot_win(
    queries: list[str], choices: list[str], data: st.DataObject
) -> None:
    """The pairwise scores (pairs that share no character skipped, Levenshtein only where it
    can beat Jaro-Winkler) are the bits of scoring every pair with both, a lone surrogate (no
    character bound) included."""
    from soulmem_torch.functional.string_sim import _empties, _objects, _pair_sds

    n = data.draw(st.integers(0, 40))
    ai = np.array(data.draw(st.lists(st.integers(0, len(queries) - 1), min_size=n, max_size=n)))
    bi = np.array(data.draw(st.lists(st.integers(0, len(choices) - 1), min_size=n, max_size=n)))
    ai, bi = ai.astype(np.int64), bi.astype(np.int64)
    want = string_distance_matrix(queries, choices)[ai, bi]
    a, b = _objects(queries), _objects(choices)
    got = _pair_sds(a, b, _empties(queries), _empties(choices), ai, bi)
    assert got.dtype == np.float32 and got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    aligned = _pair_sds(a[ai], b[bi], _empties(queries)[ai], _empties(choices)[bi])
    assert aligned.view(np.uint32).tolist() == want.view(np.uint32).tolist()
