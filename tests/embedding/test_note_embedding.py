"""Note embedding (SPEC §3) against a per-note reference that embeds every string on its own;
batching (few calls, each distinct string once); the DECISIONs; the field layout and stacking;
plain mode; validated construction from user vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from soulmem_torch.embedding import (
    FIELD_INDEX,
    FIELD_NAMES,
    EmbeddedMemoryNote,
    MemoryEmbedding,
    chunk_text,
    embed_notes,
    embed_notes_plain,
    embed_texts,
    note_plain_text,
    stack_field_embeddings,
    stack_plain_embeddings,
)
from soulmem_torch.errors import ValidationError
from soulmem_torch.model import (
    AbstractSituation,
    ConceptType,
    Context,
    Environment,
    Event,
    Location,
    MemoryNote,
    Participant,
    SemMemory,
    SpecificSituation,
)
from tests.embedding.helpers import T0, FakeEmbedder, random_note

EXPECTED_FIELDS = {
    "Semantic": {"content", "aliases", "description"},
    "Location": {"location_name", "location_coordinates", "fused_self"},
    "Participant": {"participant_name", "participant_role", "participant_fused", "fused_self"},
    "Environment": {"environment_atmosphere", "environment_tone", "fused_self"},
    "Event": {"event_action", "event_initiator", "event_target", "fused_self"},
    "Procedure": set(),
}


def _reference(note: MemoryNote, e: FakeEmbedder) -> dict[str, np.ndarray]:
    """SPEC §3, one string at a time (float64 means of float32 vectors)."""

    def v(text: str) -> np.ndarray:
        return e.vector(text).astype(np.float32).astype(np.float64)

    def mean(vs):
        return np.mean(vs, axis=0)

    def chunked(text: str) -> np.ndarray:
        chunks = chunk_text(text)
        return mean([v(c) for c in chunks]) if chunks else np.zeros(e.dim)

    out = {"tag": mean([v(t) for t in note.tags]) if note.tags else np.zeros(e.dim)}
    mt = note.mem_type
    if isinstance(mt, SemMemory):
        out["content"] = chunked(mt.content)
        out["aliases"] = mean([v(a) for a in mt.aliases]) if mt.aliases else out["content"]
        out["description"] = chunked(mt.description)
    elif isinstance(mt, SpecificSituation):
        out["narrative"] = chunked(mt.narrative)
        ctx = mt.context
        if ctx.location is not None:
            out["location_name"] = v(ctx.location.name)
            out["location_coordinates"] = v(ctx.location.coordinates)
        if ctx.participants:
            names = [v(p.name) for p in ctx.participants]
            roles = [v(p.role) for p in ctx.participants]
            out["participant_name"], out["participant_role"] = mean(names), mean(roles)
            out["participant_fused"] = mean([0.7 * n + 0.3 * r for n, r in zip(names, roles)])
        out["environment_atmosphere"] = v(ctx.environment.atmosphere)
        out["environment_tone"] = v(ctx.environment.tone)
        if ctx.event:
            w = np.array([ev.action_intensity for ev in ctx.event])
            w = w / w.sum() if w.sum() != 0 else np.full(len(w), 1 / len(w))
            for part in ("action", "initiator", "target"):
                out[f"event_{part}"] = sum(
                    wi * v(getattr(ev, part)) for wi, ev in zip(w, ctx.event)
                )
    elif isinstance(mt, AbstractSituation):
        leaf = mt.leaf
        if isinstance(leaf, Location):
            out["location_name"], out["location_coordinates"] = v(leaf.name), v(leaf.coordinates)
            out["fused_self"] = mean([out["location_name"], out["location_coordinates"]])
        elif isinstance(leaf, Participant):
            out["participant_name"], out["participant_role"] = v(leaf.name), v(leaf.role)
            out["participant_fused"] = 0.7 * v(leaf.name) + 0.3 * v(leaf.role)
            out["fused_self"] = out["participant_fused"]
        elif isinstance(leaf, Environment):
            out["environment_atmosphere"] = v(leaf.atmosphere)
            out["environment_tone"] = v(leaf.tone)
            out["fused_self"] = mean([out["environment_atmosphere"], out["environment_tone"]])
        else:
            for part in ("action", "initiator", "target"):
                out[f"event_{part}"] = v(getattr(leaf, part))
            out["fused_self"] = mean(
                [out["event_action"], out["event_initiator"], out["event_target"]]
            )
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_embed_notes_matches_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    notes = [random_note(rng) for _ in range(60)]
    e = FakeEmbedder(dim=5)
    got = embed_notes(notes, e, batch_size=4)
    for note, emb in zip(notes, got):
        ref = _reference(note, e)
        assert emb.tag.dtype == torch.float32 and emb.dim == 5
        np.testing.assert_allclose(emb.tag.numpy(), ref.pop("tag"), atol=1e-6)
        assert set(emb.fields) == set(ref), note.kind
        for name, vec in ref.items():
            np.testing.assert_allclose(emb.fields[name].numpy(), vec, atol=1e-6, err_msg=name)
    # every distinct string embedded exactly once, in batches of at most 4
    flat = [t for call in e.calls for t in call]
    assert len(flat) == len(set(flat)) and all(len(c) <= 4 for c in e.calls)


class _Dense:
    """The same embedder behind a plain callable: the plan's dense path."""

    def __init__(self, inner) -> None:
        self.inner, self.dim = inner, inner.dim

    def __call__(self, texts):
        return self.inner(texts)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_hashing_embedders_cells_path_is_the_dense_path_bit_for_bit(seed: int) -> None:
    from soulmem_torch.embedding import HashingEmbedder

    rng = np.random.default_rng(seed)
    notes = [random_note(rng) for _ in range(80)]
    emb = HashingEmbedder(dim=64)
    for got, want in zip(embed_notes(notes, emb), embed_notes(notes, _Dense(emb))):
        assert torch.equal(got.tag, want.tag)
        assert got.fields.keys() == want.fields.keys()
        for name in got.fields:
            assert torch.equal(got.fields[name], want.fields[name]), name
    texts = [chunk_text("a long text " * 40, 50)[0], "", "守护穗织", "the"] * 3
    assert torch.equal(embed_texts(texts, emb), embed_texts(texts, _Dense(emb)))
    assert embed_texts([], emb).shape == (0, 64)
    with pytest.raises(ValidationError, match="batch_size"):
        embed_notes(notes, emb, batch_size=0)


def test_the_cells_path_leaves_a_non_finite_vector_to_the_dense_check() -> None:
    from soulmem_torch.embedding import HashingEmbedder

    emb = HashingEmbedder(dim=16, idf={"wcat": float("nan")})
    note = MemoryNote.build(
        SemMemory(content="cat", aliases=[], concept_type="Entity", description="")
    )
    with pytest.raises(ValidationError, match="NaN or inf"):
        embed_notes([note], emb)


def test_field_sets_per_kind() -> None:
    rng = np.random.default_rng(5)
    notes = [random_note(rng) for _ in range(80)]
    for note, emb in zip(notes, embed_notes(notes, FakeEmbedder())):
        mt = note.mem_type
        key = type(mt.leaf).__name__ if isinstance(mt, AbstractSituation) else note.kind
        if key == "SpecificSituation":
            ctx = mt.context
            want = {"narrative", "environment_atmosphere", "environment_tone"}
            if ctx.location is not None:
                want |= {"location_name", "location_coordinates"}
            if ctx.participants:
                want |= {"participant_name", "participant_role", "participant_fused"}
            if ctx.event:
                want |= {"event_action", "event_initiator", "event_target"}
        else:
            want = EXPECTED_FIELDS[key]
        assert set(emb.fields) == want


def _specific(narrative: str, events: list[Event]) -> MemoryNote:
    ctx = Context.new(environment=Environment(atmosphere="a", tone="t"), event=events)
    return MemoryNote.build(SpecificSituation(narrative=narrative, time_span=T0, context=ctx))


def test_decisions_zero_intensity_and_empty_text() -> None:
    e = FakeEmbedder(dim=4)
    events = [Event(action=x, action_intensity=0.0, initiator="i", target="t") for x in ("p", "q")]
    (emb,) = embed_notes([_specific("  ", events)], e)
    want = (e.vector("p") + e.vector("q")) / 2
    np.testing.assert_allclose(emb.fields["event_action"].numpy(), want, atol=1e-6)
    assert (emb.fields["narrative"] == 0).all()  # whitespace narrative: no chunk, zero vector
    assert (emb.tag == 0).all()  # no tags


def test_long_text_is_chunked_and_mean_pooled() -> None:
    e = FakeEmbedder(dim=4)
    text = "甲" * 250
    (emb,) = embed_notes([_specific(text, [])], e)
    want = (e.vector("甲" * 200) + e.vector("甲" * 50)) / 2
    np.testing.assert_allclose(emb.fields["narrative"].numpy(), want, atol=1e-6)
    (whole,) = embed_notes([_specific(text, [])], e, chunk_chars=None)
    np.testing.assert_allclose(whole.fields["narrative"].numpy(), e.vector(text), atol=1e-6)


def test_accepts_embedded_notes_and_rejects_junk() -> None:
    note = random_note(np.random.default_rng(1))
    (a,) = embed_notes([EmbeddedMemoryNote(note)], FakeEmbedder())
    (b,) = embed_notes([note], FakeEmbedder())
    assert torch.equal(a.tag, b.tag)
    with pytest.raises(ValidationError, match=r"notes\[0\]"):
        embed_notes(["not a note"], FakeEmbedder())  # type: ignore[list-item]
    assert embed_notes([], FakeEmbedder()) == []


def test_device_argument(device: torch.device) -> None:
    note = random_note(np.random.default_rng(2))
    (emb,) = embed_notes([note], FakeEmbedder(), device=device)
    assert emb.tag.device.type == device.type


# -------------------------------------------------------------------------------------------
# MemoryEmbedding construction and stacking
# -------------------------------------------------------------------------------------------
def test_from_vector_and_from_fields_validate() -> None:
    e = MemoryEmbedding.from_vector(np.arange(4.0))
    assert e.tag.dtype == torch.float32 and e.fields == {} and e.dim == 4
    with pytest.raises(ValidationError, match="width 3"):
        MemoryEmbedding.from_vector(torch.ones(4), dim=3)
    with pytest.raises(ValidationError, match="finite"):
        MemoryEmbedding.from_vector(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValidationError, match="1-D"):
        MemoryEmbedding.from_vector(torch.ones(2, 2))
    with pytest.raises(ValidationError, match="1-D"):
        MemoryEmbedding.from_vector(torch.ones(3, dtype=torch.long))
    f = MemoryEmbedding.from_fields(torch.zeros(3), {"content": [1.0, 2.0, 3.0]})
    assert f.fields["content"].dtype == torch.float32
    with pytest.raises(ValidationError, match=r"fields\['content'\].*width 3"):
        MemoryEmbedding.from_fields(torch.zeros(3), {"content": torch.ones(2)})
    with pytest.raises(ValidationError, match=r"fields\['bogus'\]"):
        MemoryEmbedding.from_fields(torch.zeros(3), {"bogus": torch.ones(3)})
    with pytest.raises(ValidationError, match=r"fields\['aliases'\].*inf"):
        MemoryEmbedding.from_fields(torch.zeros(2), {"aliases": [1.0, float("inf")]})
    bad = MemoryEmbedding(tag=torch.zeros(3), fields={"narrative": torch.ones(4)})
    with pytest.raises(ValidationError, match=r"note\.fields\['narrative'\]"):
        bad.validate(where="note")
    assert f.validate(dim=3) is f
    moved = f.to(torch.float64)
    assert moved.tag.dtype == torch.float64 and moved.fields["content"].dtype == torch.float64


def test_stack_field_embeddings() -> None:
    rng = np.random.default_rng(4)
    notes = [random_note(rng) for _ in range(10)]
    embs: list[MemoryEmbedding | None] = list(embed_notes(notes, FakeEmbedder(dim=3)))
    embs[2] = None
    tag, tag_mask, field_emb, field_mask = stack_field_embeddings(embs)
    assert tag.shape == (10, 3) and field_emb.shape == (10, len(FIELD_NAMES), 3)
    assert tag.dtype == field_emb.dtype == torch.float32
    assert tag_mask.tolist() == [e is not None for e in embs]
    for i, e in enumerate(embs):
        if e is None:
            assert not field_mask[i].any() and (field_emb[i] == 0).all()
            continue
        assert torch.equal(tag[i], e.tag)
        for name in FIELD_NAMES:
            present = name in e.fields
            assert bool(field_mask[i, FIELD_INDEX[name]]) == present
            if present:
                assert torch.equal(field_emb[i, FIELD_INDEX[name]], e.fields[name])
    with pytest.raises(ValidationError, match=r"embeddings\[1\]\.tag: expected width 3"):
        stack_field_embeddings([MemoryEmbedding(torch.zeros(3)), MemoryEmbedding(torch.zeros(4))])
    with pytest.raises(ValidationError, match=r"embeddings\[0\]\.fields\['content'\]"):
        stack_field_embeddings(
            [MemoryEmbedding(torch.zeros(2), {"content": torch.tensor([0.0, float("nan")])})]
        )
    with pytest.raises(ValidationError, match="dim"):
        stack_field_embeddings([None])
    empty = stack_field_embeddings([], 5)
    assert empty[0].shape == (0, 5) and empty[2].shape == (0, len(FIELD_NAMES), 5)


def test_plain_mode() -> None:
    e = FakeEmbedder(dim=4)
    note = MemoryNote.build(
        SemMemory(content="丛雨", aliases=[], concept_type=ConceptType.ENTITY, description="剑灵")
    )
    assert note_plain_text(note) == "丛雨\n剑灵"
    (emb,) = embed_notes_plain([note], e)
    np.testing.assert_allclose(emb.tag.numpy(), e.vector("丛雨\n剑灵"), atol=1e-6)
    x, mask = stack_plain_embeddings([emb, None])
    assert x.shape == (2, 4) and mask.tolist() == [True, False] and (x[1] == 0).all()
    q = embed_texts(["丛雨\n剑灵", ""], e, query=True)
    assert torch.allclose(q[0], x[0]) and (q[1] == 0).all()
