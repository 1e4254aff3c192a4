"""Fused similarity (SPEC §4): numpy cosine references, every structured rule on hand-made
vectors (the original's own test values), and the batched kernel against a slow per-note scalar
transcription of SPEC §4 on random notes and queries."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from soulmem_torch.embedding import (
    FIELD_INDEX,
    FIELD_NAMES,
    QUERY_FIELD_INDEX,
    QUERY_FIELD_NAMES,
    QUERY_SEMANTIC,
    QUERY_SITUATION,
    chunk_text,
    embed_notes,
    embed_queries,
    stack_field_embeddings,
    string_scores,
)
from soulmem_torch.errors import ValidationError
from soulmem_torch.functional import similarity as fsim
from soulmem_torch.functional.codes import (
    NODE_ABSTRACT,
    NODE_PROCEDURE,
    NODE_SEMANTIC,
    NODE_SPECIFIC,
)
from soulmem_torch.functional.similarity import (
    BlendWeights,
    cosine_scores,
    embedding_scores,
    fuse_string_scores,
    fused_similarity,
    topk,
)
from soulmem_torch.functional.string_sim import string_distance_score_reference
from soulmem_torch.model import (
    AbstractSituation,
    Environment,
    Event,
    Location,
    Participant,
    SemMemory,
)
from soulmem_torch.model.query import SemanticQuery
from tests.embedding.helpers import FakeEmbedder, random_note, random_query

NODE_CODE = {
    "Semantic": NODE_SEMANTIC,
    "SpecificSituation": NODE_SPECIFIC,
    "AbstractSituation": NODE_ABSTRACT,
    "Procedure": NODE_PROCEDURE,
}


# -------------------------------------------------------------------------------------------
# plain cosine, top-k
# -------------------------------------------------------------------------------------------
def _np_cos(a: np.ndarray, b: np.ndarray) -> float:
    if not a.any() or not b.any():
        return 0.0
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_cosine_scores_matches_numpy(device: torch.device) -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((5, 7)).astype(np.float32)
    x = rng.standard_normal((9, 7)).astype(np.float32)
    q[1] = 0.0
    x[3] = 0.0
    got = cosine_scores(torch.tensor(q, device=device), torch.tensor(x, device=device))
    assert got.dtype == torch.float32 and got.device.type == device.type
    want = np.array([[_np_cos(a, b) for b in x.astype(np.float64)] for a in q.astype(np.float64)])
    np.testing.assert_allclose(got.cpu().numpy(), want, atol=1e-6)
    assert (got[1] == 0).all() and (got[:, 3] == 0).all()
    one = cosine_scores(torch.tensor(q[0], device=device), torch.tensor(x, device=device))
    assert one.shape == (9,)


def test_cosine_scores_shape_mismatch() -> None:
    with pytest.raises(ValidationError, match="width"):
        cosine_scores(torch.ones(2, 3), torch.ones(4, 5))
    with pytest.raises(ValidationError, match="shapes"):
        cosine_scores(torch.ones(2, 3, 1), torch.ones(4, 3))


def test_topk_is_stable_and_puts_nan_last(device: torch.device) -> None:
    s = torch.tensor([[0.5, 0.9, 0.5, float("nan"), 0.9, 0.1]], device=device)
    values, idx = topk(s, 4)
    assert idx.tolist() == [[1, 4, 0, 2]]
    assert values[0].tolist() == pytest.approx([0.9, 0.9, 0.5, 0.5])
    _, idx = topk(s, 10)
    assert idx[0, -1].item() == 3
    with pytest.raises(ValidationError):
        topk(s, -1)


def test_blend_weights_defaults_and_bounds() -> None:
    w = BlendWeights()
    assert (w.tag, w.variant, w.string_blend_alpha) == (0.3, 0.7, 0.6)
    assert (w.sit_event_initiator, w.sit_event_target, w.sit_event_action) == (0.3, 0.3, 0.4)
    assert w.sit_event_initiator_only_action == 0.6 and w.situation_units == "mean"
    with pytest.raises(ValueError):
        BlendWeights(tag=1.5)
    with pytest.raises(ValueError):
        BlendWeights(unknown=1.0)  # type: ignore[call-arg]


# -------------------------------------------------------------------------------------------
# hand-made vectors: the original's unit() / at(c) tests
# -------------------------------------------------------------------------------------------
def unit() -> list[float]:
    return [1.0, 0.0]


def at(c: float) -> list[float]:
    """A unit vector whose cosine with ``unit()`` is ``c``."""
    return [c, math.sqrt(1.0 - c * c)]


def _kernel_inputs(
    notes: list[tuple[int, dict[str, list[float]], list[float]]],
    queries: list[tuple[int, list[dict[str, list[float]]], list[float]]],
    device: torch.device,
) -> tuple[torch.Tensor, ...]:
    """Kernel tensors from ``(node_type, {field: vec}, tag)`` notes and
    ``(kind, [{query field: vec}], tag)`` queries (D = 2)."""
    d = 2
    n, f = len(notes), len(FIELD_NAMES)
    field_emb = torch.zeros(n, f, d)
    field_mask = torch.zeros(n, f, dtype=torch.bool)
    tag_emb = torch.zeros(n, d)
    node_type = torch.zeros(n, dtype=torch.long)
    for i, (code, fields, tag) in enumerate(notes):
        node_type[i] = code
        tag_emb[i] = torch.tensor(tag)
        for name, vec in fields.items():
            field_emb[i, FIELD_INDEX[name]] = torch.tensor(vec)
            field_mask[i, FIELD_INDEX[name]] = True
    b, u, q = len(queries), max(1, *(len(units) for _, units, _ in queries)), len(QUERY_FIELD_NAMES)
    qf = torch.zeros(b, u, q, d)
    qm = torch.zeros(b, u, q, dtype=torch.bool)
    um = torch.zeros(b, u, dtype=torch.bool)
    qtag = torch.zeros(b, d)
    kind = torch.zeros(b, dtype=torch.long)
    for j, (k, units, tag) in enumerate(queries):
        kind[j] = k
        qtag[j] = torch.tensor(tag)
        for v, fields in enumerate(units):
            um[j, v] = True
            for name, vec in fields.items():
                qf[j, v, QUERY_FIELD_INDEX[name]] = torch.tensor(vec)
                qm[j, v, QUERY_FIELD_INDEX[name]] = True
    tensors = (qtag, kind, qf, qm, um, tag_emb, torch.ones(n, dtype=torch.bool), field_emb,
               field_mask, node_type)  # fmt: skip
    return tuple(t.to(device) for t in tensors)


def _score(note, units, device, *, kind=QUERY_SITUATION, weights=None, note_tag=None, q_tag=None):
    code, fields = note
    args = _kernel_inputs(
        [(code, fields, note_tag or [0.0, 0.0])], [(kind, units, q_tag or [0.0, 0.0])], device
    )
    return embedding_scores(*args, weights=weights)[0, 0].item()


LOC = {"location_name": unit(), "location_coordinates": unit(), "fused_self": unit()}
PART = {"participant_name": unit(), "participant_role": unit(), "participant_fused": unit(),
        "fused_self": unit()}  # fmt: skip
ENV = {"environment_atmosphere": unit(), "environment_tone": unit(), "fused_self": unit()}
EVENT = {"event_action": unit(), "event_initiator": unit(), "event_target": unit(),
         "fused_self": unit()}  # fmt: skip


@pytest.mark.parametrize(
    ("leaf", "unit_fields", "expected"),
    [
        (LOC, {"location_name": at(0.5), "location_coordinates": at(0.8)}, 0.62),
        (LOC, {"location_name": at(0.5)}, 0.5),
        (PART, {"participant_name": at(0.5), "participant_role": at(0.8)}, 0.62),
        (PART, {"participant_name": at(0.5)}, 0.5),
        (PART, {"participant_role": at(0.8)}, 0.8),
        (ENV, {"environment_atmosphere": at(0.5), "environment_tone": at(0.8)}, 0.65),
        (ENV, {"environment_tone": at(0.8)}, 0.8),
        (
            EVENT,
            {"event_action": at(0.9), "event_initiator": at(0.5), "event_target": at(0.8)},
            0.75,
        ),
        (EVENT, {"event_action": at(0.9), "event_initiator": at(0.5)}, 0.74),
        (EVENT, {"event_action": at(0.9), "event_target": at(0.8)}, 0.86),
        (EVENT, {"event_action": at(0.9)}, 0.9),
        (LOC, {}, 0.0),  # no structured part, no narrative
        (LOC, {"participant_name": at(0.9)}, 0.0),  # another leaf kind
        (LOC, {"narrative": at(0.8), "location_name": at(0.5)}, 0.8),  # max of the two
        (EVENT, {"narrative": at(0.3), "event_action": at(0.9)}, 0.9),
        (LOC, {"location_name": at(-0.5)}, 0.0),  # floored at 0
    ],
)
def test_abstract_leaf_rules(leaf, unit_fields, expected, device: torch.device) -> None:
    got = _score((NODE_ABSTRACT, leaf), [unit_fields], device)
    assert got == pytest.approx(expected, abs=1e-6)


def test_weights_are_read_from_config(device: torch.device) -> None:
    q = {"location_name": at(0.5), "location_coordinates": at(0.8)}
    w = BlendWeights(sit_location_name=0.0, sit_location_coord=1.0)
    assert _score((NODE_ABSTRACT, LOC), [q], device, weights=w) == pytest.approx(0.8, abs=1e-6)
    w = BlendWeights(sit_event_target_only_action=1.0)
    q = {"event_action": at(0.9), "event_target": at(0.8)}
    assert _score((NODE_ABSTRACT, EVENT), [q], device, weights=w) == pytest.approx(0.9, abs=1e-6)
    w = BlendWeights(sem_concept=0.0, sem_description=1.0)
    sem = (NODE_SEMANTIC, {"content": unit(), "aliases": unit(), "description": unit()})
    q = {"concept": at(0.5), "description": at(0.8)}
    assert _score(sem, [q], device, kind=QUERY_SEMANTIC, weights=w) == pytest.approx(0.8, abs=1e-6)


def test_specific_situation_is_the_max_of_existing_scores(device: torch.device) -> None:
    spec = {"narrative": unit(), "environment_atmosphere": unit(), "environment_tone": unit()}
    assert _score((NODE_SPECIFIC, spec), [{"narrative": at(0.8)}], device) == pytest.approx(0.8)
    with_loc = {**spec, "location_name": unit(), "location_coordinates": unit()}
    q = {"narrative": at(0.8), "location_name": at(0.5)}
    assert _score((NODE_SPECIFIC, with_loc), [q], device) == pytest.approx(0.8, abs=1e-6)
    q = {"narrative": at(0.2), "location_name": at(0.9)}
    assert _score((NODE_SPECIFIC, with_loc), [q], device) == pytest.approx(0.9, abs=1e-6)
    # the note has no location: the query's location does not count
    assert _score((NODE_SPECIFIC, spec), [q], device) == pytest.approx(0.2, abs=1e-6)
    # environment counts whenever the query has one
    q = {"environment_atmosphere": at(0.7)}
    assert _score((NODE_SPECIFIC, spec), [q], device) == pytest.approx(0.7, abs=1e-6)
    # all negative -> 0
    q = {"narrative": at(-0.4)}
    assert _score((NODE_SPECIFIC, spec), [q], device) == 0.0


def test_semantic_rules(device: torch.device) -> None:
    sem = (NODE_SEMANTIC, {"content": unit(), "aliases": unit(), "description": unit()})
    kw = {"kind": QUERY_SEMANTIC}
    assert _score(
        sem, [{"concept": at(0.5), "description": at(0.8)}], device, **kw
    ) == pytest.approx(0.65)
    assert _score(sem, [{"concept": at(0.5)}], device, **kw) == pytest.approx(0.5)
    assert _score(sem, [{}], device, **kw) == 0.0
    alias_hit = (NODE_SEMANTIC, {"content": at(0.5), "aliases": unit(), "description": unit()})
    assert _score(alias_hit, [{"concept": unit()}], device, **kw) == pytest.approx(1.0)
    # mean over units; no units -> 0
    two = [{"concept": at(0.5)}, {"concept": at(0.9)}]
    assert _score(sem, two, device, **kw) == pytest.approx(0.7, abs=1e-6)
    assert _score(sem, [], device, **kw) == 0.0


def test_situation_units_sum_or_mean(device: torch.device) -> None:
    three = [{"location_name": unit()}] * 3
    assert _score((NODE_ABSTRACT, LOC), three, device) == pytest.approx(1.0)  # mean: the default
    total = BlendWeights(situation_units="sum")
    assert _score((NODE_ABSTRACT, LOC), three, device, weights=total) == pytest.approx(
        3.0, abs=1e-6
    )


def test_tag_blend_and_kind_mismatch(device: torch.device) -> None:
    sem_fields = {"content": [0.0, 0.0], "aliases": [0.0, 0.0], "description": unit()}
    q = [{"description": unit()}]
    kw = {"kind": QUERY_SEMANTIC}
    # query has no tag -> variant alone
    assert _score((NODE_SEMANTIC, sem_fields), q, device, note_tag=unit(), **kw) == pytest.approx(
        0.5
    )
    # both tags -> 0.3 cos + 0.7 variant
    got = _score((NODE_SEMANTIC, sem_fields), q, device, note_tag=unit(), q_tag=unit(), **kw)
    assert got == pytest.approx(0.65, abs=1e-6)
    # note has no tag -> variant alone
    assert _score((NODE_SEMANTIC, sem_fields), q, device, q_tag=unit(), **kw) == pytest.approx(0.5)
    # Procedure: variant 0, tag still blended (the original's test: 0.4·1 + 0.6·0 with 0.4/0.6)
    w = BlendWeights(tag=0.4, variant=0.6)
    got = _score((NODE_PROCEDURE, {}), [], device, note_tag=unit(), q_tag=unit(), weights=w, **kw)
    assert got == pytest.approx(0.4, abs=1e-6)
    # Situation query vs Semantic note: variant 0
    got = _score((NODE_SEMANTIC, sem_fields), [{"narrative": unit()}], device)
    assert got == 0.0


def test_fuse_string_scores(device: torch.device) -> None:
    emb = torch.tensor([[0.2, 0.9, 0.5, 0.3]], device=device)
    s = torch.tensor([[0.0, 0.5, 1.0, -1.0]], device=device)
    got = fuse_string_scores(emb, s, alpha=0.6)
    want = [0.2, 0.9, max(0.5, 0.6 * 0.5 + 0.4 * 1.0), 0.3]
    np.testing.assert_allclose(got.cpu().numpy()[0], want, atol=1e-6)
    assert torch.equal(fuse_string_scores(emb, s, alpha=1.0), torch.maximum(emb, emb))
    with pytest.raises(ValidationError, match="string_scores"):
        fuse_string_scores(emb, s[:, :2])


def test_all_zero_query_and_missing_embeddings(device: torch.device) -> None:
    args = list(
        _kernel_inputs(
            [(NODE_SEMANTIC, {"content": unit(), "aliases": unit(), "description": unit()}, unit()),
             (NODE_ABSTRACT, LOC, unit())],
            [(QUERY_SEMANTIC, [{"concept": [0.0, 0.0]}], [0.0, 0.0]),
             (QUERY_SITUATION, [{"location_name": [0.0, 0.0]}], [0.0, 0.0])],
            device,
        )
    )  # fmt: skip
    got = fused_similarity(*args, string_scores=torch.ones(2, 2, device=device))
    assert torch.isfinite(got).all()
    # all-zero query vectors: cos 0 everywhere, only the string channel remains (0.4·1)
    assert got.cpu().flatten().tolist() == pytest.approx([0.4] * 4, abs=1e-6)
    assert (embedding_scores(*args) == 0).all()
    # a note without an embedding scores 0, string channel included
    args[6] = torch.tensor([True, False], device=device)
    got = fused_similarity(*args, string_scores=torch.ones(2, 2, device=device))
    assert got[:, 1].abs().max().item() == 0.0


def test_shape_errors_name_the_argument() -> None:
    args = list(_kernel_inputs([(NODE_SEMANTIC, {}, unit())], [(QUERY_SEMANTIC, [{}], unit())],
                               torch.device("cpu")))  # fmt: skip
    bad = list(args)
    bad[5] = torch.zeros(1, 3)
    with pytest.raises(ValidationError, match="tag_emb"):
        embedding_scores(*bad)
    bad = list(args)
    bad[8] = bad[8].float()
    with pytest.raises(ValidationError, match="field_mask"):
        embedding_scores(*bad)
    bad = list(args)
    bad[2] = torch.zeros(1, 1, 3, 2)
    with pytest.raises(ValidationError, match="query_field"):
        embedding_scores(*bad)


# -------------------------------------------------------------------------------------------
# batched kernel vs a slow scalar transcription of SPEC §4
# -------------------------------------------------------------------------------------------
W = BlendWeights(situation_units="sum")  # the reference transcribes the older, summing rule


def _mean(vectors: list[np.ndarray]) -> np.ndarray:
    return np.mean(vectors, axis=0)


class _Ref:
    """Per-note, per-unit scalar reference of SPEC §3 (queries) and §4 (scores), float64."""

    def __init__(self, embedder: FakeEmbedder) -> None:
        self.e = embedder

    def v(self, text: str) -> np.ndarray:
        return self.e.query_vector(text).astype(np.float32).astype(np.float64)

    def chunked(self, text: str) -> np.ndarray:
        chunks = chunk_text(text)
        return _mean([self.v(c) for c in chunks]) if chunks else np.zeros(self.e.dim)

    def query(self, q):
        tag = _mean([self.v(t) for t in q.tag]) if q.tag else np.zeros(self.e.dim)
        units = []
        for u in q.units:
            if isinstance(q.variant, SemanticQuery):
                units.append({
                    "concept": None if u.concept_identifier is None else self.v(u.concept_identifier),
                    "desc": None if u.description is None else self.v(u.description),
                })  # fmt: skip
                continue
            d: dict[str, object] = {
                "narrative": None if u.narrative is None else self.chunked(u.narrative)
            }
            locs = u.location or []
            coords = [self.v(x.coordinates) for x in locs if x.coordinates is not None]
            d["location"] = (
                {"name": _mean([self.v(x.name) for x in locs]), "coord": _mean(coords) if coords else None}
                if locs else None
            )  # fmt: skip
            ps = u.participants or []
            names = [self.v(p.name) for p in ps if p.name is not None]
            roles = [self.v(p.role) for p in ps if p.role is not None]
            d["participants"] = (
                {"name": _mean(names) if names else None, "role": _mean(roles) if roles else None}
                if ps else None
            )  # fmt: skip
            env = u.environment
            d["environment"] = None if env is None else {
                "atm": None if env.atmosphere is None else self.v(env.atmosphere),
                "tone": None if env.tone is None else self.v(env.tone),
            }  # fmt: skip
            evs = u.event or []
            inits = [self.v(e.initiator) for e in evs if e.initiator is not None]
            targets = [self.v(e.target) for e in evs if e.target is not None]
            d["event"] = (
                {"action": _mean([self.v(e.action) for e in evs]),
                 "init": _mean(inits) if inits else None,
                 "target": _mean(targets) if targets else None}
                if evs else None
            )  # fmt: skip
            units.append(d)
        return tag, units

    # -- structured rules ------------------------------------------------------------------
    @staticmethod
    def location(f, q) -> float:
        name = _np_cos(q["name"], f["location_name"])
        if q["coord"] is None:
            return name
        return W.sit_location_name * name + W.sit_location_coord * _np_cos(
            q["coord"], f["location_coordinates"]
        )

    @staticmethod
    def participant(f, q) -> float:
        n = None if q["name"] is None else _np_cos(q["name"], f["participant_name"])
        r = None if q["role"] is None else _np_cos(q["role"], f["participant_role"])
        if n is not None and r is not None:
            return W.sit_participant_name * n + W.sit_participant_role * r
        return n if n is not None else (r if r is not None else 0.0)

    @staticmethod
    def environment(f, q) -> float:
        a = None if q["atm"] is None else _np_cos(q["atm"], f["environment_atmosphere"])
        t = None if q["tone"] is None else _np_cos(q["tone"], f["environment_tone"])
        if a is not None and t is not None:
            return W.sit_env_atmosphere * a + W.sit_env_tone * t
        return a if a is not None else (t if t is not None else 0.0)

    @staticmethod
    def event(f, q) -> float:
        a = _np_cos(q["action"], f["event_action"])
        i = None if q["init"] is None else _np_cos(q["init"], f["event_initiator"])
        t = None if q["target"] is None else _np_cos(q["target"], f["event_target"])
        if i is not None and t is not None:
            return W.sit_event_initiator * i + W.sit_event_target * t + W.sit_event_action * a
        if i is not None:
            return 0.4 * i + 0.6 * a
        if t is not None:
            return 0.4 * t + 0.6 * a
        return a

    def variant(self, note, f, query, units) -> float:
        kind = note.kind
        if isinstance(query.variant, SemanticQuery):
            if kind != "Semantic" or not units:
                return 0.0
            total = 0.0
            for u in units:
                concept = 0.0
                if u["concept"] is not None:
                    concept = max(
                        _np_cos(u["concept"], f["content"]), _np_cos(u["concept"], f["aliases"])
                    )
                if u["desc"] is not None:
                    total += W.sem_concept * concept + W.sem_description * _np_cos(
                        u["desc"], f["description"]
                    )
                else:
                    total += concept
            return total / len(units)
        if kind not in ("SpecificSituation", "AbstractSituation"):
            return 0.0
        total = 0.0
        for u in units:
            scores = [0.0]
            if kind == "SpecificSituation":
                mt = note.mem_type
                if u["narrative"] is not None:
                    scores.append(_np_cos(u["narrative"], f["narrative"]))
                if u["location"] is not None and mt.context.location is not None:
                    scores.append(self.location(f, u["location"]))
                if u["participants"] is not None and mt.context.participants:
                    scores.append(self.participant(f, u["participants"]))
                if u["environment"] is not None:
                    scores.append(self.environment(f, u["environment"]))
                if u["event"] is not None and mt.context.event:
                    scores.append(self.event(f, u["event"]))
            else:
                leaf = note.mem_type.leaf
                if isinstance(leaf, Location) and u["location"] is not None:
                    scores.append(self.location(f, u["location"]))
                elif isinstance(leaf, Participant) and u["participants"] is not None:
                    scores.append(self.participant(f, u["participants"]))
                elif isinstance(leaf, Environment) and u["environment"] is not None:
                    scores.append(self.environment(f, u["environment"]))
                elif isinstance(leaf, Event) and u["event"] is not None:
                    scores.append(self.event(f, u["event"]))
                if u["narrative"] is not None:
                    scores.append(_np_cos(u["narrative"], f["fused_self"]))
            total += max(scores)
        return total

    @staticmethod
    def string(note, query) -> float:
        sds = string_distance_score_reference
        mt = note.mem_type
        best = 0.0
        if isinstance(query.variant, SemanticQuery):
            if isinstance(mt, SemMemory):
                for u in query.units:
                    if u.concept_identifier is not None:
                        c = u.concept_identifier
                        best = max(best, sds(c, mt.content), *[sds(c, a) for a in mt.aliases])
            return best
        if not isinstance(mt, AbstractSituation):
            return best
        leaf = mt.leaf
        for u in query.units:
            if isinstance(leaf, Location):
                for loc in u.location or []:
                    best = max(best, sds(loc.name, leaf.name))
            elif isinstance(leaf, Participant):
                for p in u.participants or []:
                    if p.name is not None:
                        best = max(best, sds(p.name, leaf.name))
            elif isinstance(leaf, Environment):
                if u.environment is not None and u.environment.atmosphere is not None:
                    best = max(best, sds(u.environment.atmosphere, leaf.atmosphere))
            elif isinstance(leaf, Event):
                for e in u.event or []:
                    a = sds(e.action, leaf.action)
                    i = sds(e.initiator, leaf.initiator) if e.initiator is not None else 0.0
                    t = sds(e.target, leaf.target) if e.target is not None else 0.0
                    if e.initiator is not None and e.target is not None:
                        s = 0.3 * i + 0.3 * t + 0.4 * a
                    elif e.initiator is not None:
                        s = 0.4 * i + 0.6 * a
                    elif e.target is not None:
                        s = 0.4 * t + 0.6 * a
                    else:
                        s = a
                    best = max(best, s)
        return best

    def fused(self, note, emb, query) -> float:
        if emb is None:
            return 0.0
        f = {k: v.double().cpu().numpy() for k, v in emb.fields.items()}
        f.update({k: np.zeros(emb.dim) for k in FIELD_NAMES if k not in f})
        note_tag = emb.tag.double().cpu().numpy()
        q_tag, units = self.query(query)
        var = self.variant(note, f, query, units)
        score = var if not q_tag.any() or not note_tag.any() else (
            W.tag * _np_cos(q_tag, note_tag) + W.variant * var
        )  # fmt: skip
        s = self.string(note, query)
        return score if s <= 0 else max(score, 0.6 * score + 0.4 * s)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fused_matches_scalar_reference(seed: int, device: torch.device) -> None:
    rng = np.random.default_rng(seed)
    embedder = FakeEmbedder(dim=6, zero=("", "Rust"))
    notes = [random_note(rng) for _ in range(40)]
    queries = [random_query(rng) for _ in range(24)]
    embeddings = embed_notes(notes, embedder)
    embeddings[3] = None  # a note without an embedding
    tag, tag_mask, field_emb, field_mask = stack_field_embeddings(embeddings, embedder.dim)
    node_type = torch.tensor([NODE_CODE[n.kind] for n in notes])
    batch = embed_queries(queries, embedder, device=device)
    strings = string_scores(queries, notes, device=device)
    got = fused_similarity(
        batch.tag, batch.kind, batch.field, batch.field_mask, batch.unit_mask,
        tag.to(device), tag_mask.to(device), field_emb.to(device), field_mask.to(device),
        node_type.to(device), string_scores=strings, weights=W,
    )  # fmt: skip
    assert got.shape == (len(queries), len(notes)) and got.dtype == torch.float32
    ref = _Ref(embedder)
    want = np.array([[ref.fused(n, e, q) for n, e in zip(notes, embeddings)] for q in queries])
    np.testing.assert_allclose(got.cpu().numpy(), want, atol=1e-6, rtol=0)
    assert (got[:, 3] == 0).all()


def test_query_batch_score_uses_graph_attributes(device: torch.device) -> None:
    rng = np.random.default_rng(7)
    embedder = FakeEmbedder(dim=5)
    notes = [random_note(rng) for _ in range(12)]
    queries = [random_query(rng) for _ in range(4)]
    tag, tag_mask, field_emb, field_mask = stack_field_embeddings(embed_notes(notes, embedder))

    class Graph:  # the MemoryGraph attributes the kernel reads
        pass

    g = Graph()
    g.node_type = torch.tensor([NODE_CODE[n.kind] for n in notes], device=device)
    g.tag_emb, g.tag_mask, g.field_emb, g.field_mask = (
        t.to(device) for t in (tag, tag_mask, field_emb, field_mask)
    )
    batch = embed_queries(queries, embedder)
    got = batch.score(g)
    want = embedding_scores(
        batch.tag, batch.kind, batch.field, batch.field_mask, batch.unit_mask,
        tag, tag_mask, field_emb, field_mask, g.node_type.cpu(),
    )  # fmt: skip
    assert got.device.type == device.type
    torch.testing.assert_close(got.cpu(), want, atol=1e-6, rtol=0)
    g.tag_emb = g.field_emb = None  # nothing embedded -> all zeros
    assert (batch.score(g) == 0).all()


def test_values_behind_false_masks_are_ignored(device: torch.device) -> None:
    args = list(
        _kernel_inputs(
            [(NODE_ABSTRACT, LOC, unit()), (NODE_SEMANTIC, {"content": unit()}, unit())],
            [(QUERY_SITUATION, [{"location_name": at(0.5)}], unit()),
             (QUERY_SEMANTIC, [{"concept": at(0.5)}], unit())],
            device,
        )
    )  # fmt: skip
    clean = embedding_scores(*args)
    field_emb, qf = args[7].clone(), args[2].clone()
    field_emb[~args[8]] = float("nan")  # garbage where the note has no field
    qf[~args[3]] = float("nan")  # ... and where the query unit has none
    args[7], args[2] = field_emb, qf
    torch.testing.assert_close(embedding_scores(*args), clean)


@pytest.mark.parametrize("seed", [0, 1])
def test_compact_layout_scores_equal_the_dense_block_bit_for_bit(
    seed: int, device: torch.device
) -> None:
    """The compact note side (distinct rows, shared rows stored once) gives exactly the
    scores of the dense (N, F, D) block, for a batch and for each query alone; the graph's
    dense ``field_emb`` view is the dense block."""
    from soulmem_torch.embedding import stack_compact_field_embeddings
    from soulmem_torch.functional.similarity import (
        fused_similarity_compact,
        note_side_compact,
    )

    rng = np.random.default_rng(seed)
    embedder = FakeEmbedder(dim=8, zero=("",))
    notes = [random_note(rng) for _ in range(30)]
    queries = [random_query(rng) for _ in range(10)]
    embeddings = embed_notes(notes, embedder)
    embeddings[2] = None
    dense = [t.to(device) for t in stack_field_embeddings(embeddings, embedder.dim)]
    tag, tag_mask, rows, pos = stack_compact_field_embeddings(embeddings, embedder.dim)
    assert rows.shape[0] <= int(dense[3].sum())  # shared rows are stored once
    from soulmem_torch.embedding import compact_to_dense

    field_emb, field_mask = compact_to_dense(rows, pos)
    assert torch.equal(field_emb.to(device), dense[2]) and torch.equal(
        field_mask.to(device), dense[3]
    )
    node_type = torch.tensor([NODE_CODE[n.kind] for n in notes], device=device)
    notes_side = note_side_compact(tag, tag_mask, rows, pos, device=device)
    batch = embed_queries(queries, embedder, device=device)
    for sub in [list(range(len(queries)))] + [[i] for i in range(len(queries))]:
        q = batch.select(sub)
        want = fused_similarity(
            q.tag, q.kind, q.field, q.field_mask, q.unit_mask, *dense, node_type, weights=W
        )
        got = fused_similarity_compact(
            q.tag, q.kind, q.field, q.field_mask, q.unit_mask, notes_side, node_type, weights=W
        )
        assert torch.equal(got, want)


def test_compact_cosines_equal_the_dense_layouts_matmuls(device: torch.device) -> None:
    """Every (query field, note field) cosine the rules read, gathered from the compact rows,
    equals the matmul against the dense normalized block (the layout before) — to the last
    bits only: a small table is read by the union's per-pair kernel (``rows_matmul``), whose
    sums run in another order than a GEMM's (test_duplicate_notes.py pins that kernel)."""
    from soulmem_torch.embedding import FIELD_NAMES, QUERY_FIELD_NAMES
    from soulmem_torch.functional import similarity as fsim

    rng = np.random.default_rng(3)
    embedder = FakeEmbedder(dim=16)
    notes = [random_note(rng) for _ in range(25)]
    queries = [random_query(rng) for _ in range(6)]
    tag, tag_mask, field_emb, field_mask = (
        t.to(device) for t in stack_field_embeddings(embed_notes(notes, embedder), 16)
    )
    side = fsim.note_side(tag, tag_mask, field_emb, field_mask)
    dense = fsim.normalize_rows(field_emb).masked_fill_(~field_mask.unsqueeze(-1), 0.0)
    batch = embed_queries(queries, embedder, device=device)
    qm = batch.field_mask & batch.unit_mask.unsqueeze(-1)
    sel = torch.arange(0, 25, 2, device=device)
    for rows in (torch.arange(6, device=device), torch.tensor([4], device=device)):
        qs = fsim.QueryFields(batch.field, rows, qm[rows])
        cos = fsim._single_cos(qs, side, sel)
        for qi, q_name in enumerate(QUERY_FIELD_NAMES):
            for j, f_name in enumerate(FIELD_NAMES):
                q = qs.slice(qi)
                want = (
                    torch.zeros(len(rows), batch.num_units, len(sel), device=device)
                    if q is None
                    else torch.matmul(q, dense[sel][:, j].T)
                )
                torch.testing.assert_close(
                    cos(q_name, f_name), want, rtol=1e-6, atol=1e-6, msg=f"{q_name} {f_name}"
                )


def test_row_dots_takes_more_columns_than_the_table_has_rows(device) -> None:
    """Repeated columns (the zero row of absent fields) can outnumber the table's rows: read
    a slice of at most P at a time, the same per-pair values."""
    g = torch.Generator().manual_seed(5)
    table = torch.randn(7, 16, generator=g).to(device)
    a = torch.randn(3, 16, generator=g).to(device)
    cols = torch.randint(0, 7, (3, 40), generator=g).to(device)
    got = fsim.row_dots(a, table, cols)
    want = torch.stack([fsim.row_dots(a, table, cols[:, j : j + 1])[:, 0] for j in range(40)], 1)
    assert torch.equal(got, want)
    torch.testing.assert_close(got, (table[cols] * a.unsqueeze(1)).sum(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_dots_equals_gathered_rows(device, dtype) -> None:
    """``row_dots`` against the gather + ``bmm`` it replaces: repeated, unsorted columns (the
    zero row of absent fields), every width; empty shapes give empty results."""
    g = torch.Generator().manual_seed(3)
    table = torch.randn(50, 33, generator=g, dtype=dtype)
    table[0] = 0.0
    a = torch.randn(7, 33, generator=g, dtype=dtype)
    cols = torch.randint(0, 50, (7, 11), generator=g)
    cols[:, ::3] = 0
    cols[2] = cols[2].flip(0)
    want = torch.bmm(table[cols], a.unsqueeze(-1)).squeeze(-1)
    got = fsim.row_dots(a.to(device), table.to(device), cols.to(device))
    assert got.shape == (7, 11) and got.dtype == dtype and got.device.type == device.type
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(got.cpu(), want, atol=tol, rtol=0)
    assert bool((got.cpu()[cols == 0] == 0).all())  # the zero row
    assert fsim.row_dots(a[:0], table, cols[:0]).shape == (0, 11)
    assert fsim.row_dots(a, table, cols[:, :0]).shape == (7, 0)


@pytest.mark.parametrize("seed", range(6))
def test_a_sparse_table_is_normalized_bit_for_bit_as_its_dense_rows(seed):
    # the note side of a table held sparse: its cells divided by the dense rows' norms, the
    # cells that come out zero left out — exactly from_dense(normalize_rows(dense) * keep)
    from soulmem_torch.functional.sparse_rows import SparseRows

    g = torch.Generator().manual_seed(seed)
    p, d = 1100 + 300 * seed, 1024
    x = torch.randn(p, d, generator=g) * (torch.rand(p, d, generator=g) < 0.03)
    x[torch.rand(p, generator=g) < 0.1] = 0  # all-zero rows
    x[0, :4] = 1e-38  # cells that underflow once divided
    if seed % 2:
        x = x.double()
    keep = torch.rand(p, generator=g) < 0.8 if seed % 3 else None
    zero_row = seed % 2 == 0
    got = fsim._normalized_table(
        SparseRows.from_dense(x), torch.device("cpu"), zero_row=zero_row, keep=keep
    )
    ref = fsim.normalize_rows(x)
    if keep is not None:
        ref = ref * keep.unsqueeze(-1)
    ref = SparseRows.from_dense(ref)
    ref = ref.with_zero_row() if zero_row else ref
    assert isinstance(got, SparseRows)
    assert torch.equal(got.crow, ref.crow)
    assert got.col.dtype == ref.col.dtype and torch.equal(got.col, ref.col)
    assert torch.equal(got.val, ref.val)
