"""MemoryCluster: the original's cluster tests (memory_cluster/tests.rs, tests2.rs) and more."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from soulmem_torch.embedding.fields import EmbeddedMemoryNote, MemoryEmbedding
from soulmem_torch.errors import NotFoundError, ValidationError
from soulmem_torch.graph import MemoryGraph
from soulmem_torch.model import LinkId, MemoryId
from soulmem_torch.runtime import GraphMemoryLink, MemoryCluster
from tests.runtime.helpers import embedding, sem, sem_link


def edge_ids(cluster: MemoryCluster) -> list[LinkId]:
    return [lk.id for lk in cluster.links()]


# ---- the original's tests -------------------------------------------------------------------
def test_refresh_node_merges_new_links():
    a, b, c = MemoryId(), MemoryId(), MemoryId()
    link_ab, link_ac = sem_link(a, b), sem_link(a, c)
    cluster = MemoryCluster()
    cluster.add_note(sem(id=a, links=[link_ab]))
    cluster.add_note(sem(id=b))
    cluster.add_note(sem(id=c))
    assert cluster.has_link(link_ab.id)
    cluster[a].note.mem_links.append(link_ac)  # mutate in place, then declare it
    cluster.mark_changed(a)
    assert cluster.has_link(link_ac.id)


def test_remove_node_prunes_link_index_so_edge_can_be_rebuilt():
    a, b = MemoryId(), MemoryId()
    link_ab = sem_link(a, b)
    cluster = MemoryCluster()
    cluster.add_note(sem(id=a, links=[link_ab]))
    cluster.add_note(sem(id=b))
    assert cluster.has_link(link_ab.id)
    assert cluster.remove_note(b) is not None
    assert not cluster.has_link(link_ab.id)
    cluster.add_note(sem(id=b))
    assert cluster.has_link(link_ab.id)
    edge = cluster.get_link(link_ab.id)
    assert edge is not None and (edge.from_, edge.to) == (a, b)


def test_add_single_node_and_lookup():
    cluster = MemoryCluster()
    note = sem("A")
    assert cluster.add_note(note, embedding())
    assert note.id in cluster
    assert cluster.get(note.id).note is note
    assert cluster.get(note.id).embedding is not None
    assert len(cluster) == 1


def test_add_single_node_deduplicates():
    cluster = MemoryCluster()
    first = sem("A")
    assert cluster.add_note(first)
    assert not cluster.add_note(sem("A again", id=first.id))
    assert len(cluster) == 1
    assert cluster[first.id].note is first  # not replaced
    assert first.retrieval_count == 0  # a duplicate add is not a retrieval


def test_merge_creates_edges():
    cluster = MemoryCluster()
    a, b = MemoryId(), MemoryId()
    cluster.add_note(sem(id=a, links=[sem_link(a, b)]))
    cluster.add_note(sem(id=b))
    assert len(cluster) == 2 and cluster.num_links == 1
    out = cluster.out_links(a)
    assert len(out) == 1 and cluster.has_link(out[0].id)


def test_merge_handles_pending_edges():
    cluster = MemoryCluster()
    a, b = MemoryId(), MemoryId()
    cluster.add_note(sem(id=a, links=[sem_link(a, b)]))
    assert cluster.num_links == 0
    assert [lk.to for lk in cluster.pending_links()] == [b]
    cluster.add_note(sem(id=b))
    assert cluster.num_links == 1
    assert cluster.pending_links() == []


def test_merge_does_not_duplicate_edges():
    cluster = MemoryCluster()
    a, b = MemoryId(), MemoryId()
    link = sem_link(a, b)
    cluster.add_note(sem(id=a, links=[link]))
    cluster.add_note(sem(id=b))
    assert cluster.num_links == 1
    cluster.add_note(sem(id=a, links=[link]))  # the same link again, through a duplicate
    cluster.mark_changed(a)
    assert cluster.num_links == 1 and cluster.has_link(link.id)


def test_merge_batch():
    a, b, c = MemoryId(), MemoryId(), MemoryId()
    cluster = MemoryCluster()
    added = cluster.add_notes(
        [
            sem(id=a, links=[sem_link(a, b), sem_link(a, c)]),
            sem(id=b, links=[sem_link(b, c)]),
            sem(id=c),
        ],
        links_after_nodes=True,
    )
    assert added == [True, True, True]
    assert len(cluster) == 3 and cluster.num_links == 3
    assert cluster.pending_links() == []


def test_add_notes_default_is_the_add_note_loop_and_merge_is_links_after_nodes():
    a, b, c = MemoryId(), MemoryId(), MemoryId()
    ac, ba = sem_link(a, c), sem_link(b, a)
    notes = [sem(id=a, links=[ac]), sem(id=b, links=[ba]), sem(id=c)]
    one_by_one = MemoryCluster()
    for note in notes:
        one_by_one.add_note(note)
    batch = MemoryCluster()
    batch.add_notes(notes)
    merged = MemoryCluster()
    merged.add_notes(notes, links_after_nodes=True)
    assert edge_ids(one_by_one) == edge_ids(batch) == [ba.id, ac.id]  # a->c waits for c
    assert edge_ids(merged) == [ac.id, ba.id]


def test_remove_single_node():
    a, b = MemoryId(), MemoryId()
    link = sem_link(a, b)
    cluster = MemoryCluster()
    cluster.add_note(sem(id=a, links=[link]))
    cluster.add_note(sem(id=b))
    removed = cluster.remove_note(b)
    assert isinstance(removed, EmbeddedMemoryNote) and removed.note.id == b
    assert b not in cluster and len(cluster) == 1
    assert cluster.num_links == 0
    assert [(lk.id, lk.from_, lk.to) for lk in cluster.pending_links()] == [(link.id, a, b)]


def test_remove_nonexistent_node():
    assert MemoryCluster().remove_note(MemoryId()) is None


def test_has_edge_and_link_index():
    a, b = MemoryId(), MemoryId()
    link = sem_link(a, b)
    cluster = MemoryCluster()
    cluster.add_note(sem(id=a, links=[link]))
    cluster.add_note(sem(id=b))
    assert cluster.has_link(link.id) and cluster.get_link(link.id) is not None


def test_refresh_node_without_change_keeps_edges():
    a, b = MemoryId(), MemoryId()
    cluster = MemoryCluster()
    cluster.add_note(sem(id=a, links=[sem_link(a, b)]))
    cluster.add_note(sem(id=b))
    cluster.mark_changed(a)
    assert cluster.num_links == 1


def test_refresh_node_adds_missing_edges():
    a, b, c = MemoryId(), MemoryId(), MemoryId()
    cluster = MemoryCluster()
    cluster.add_notes([sem(id=a), sem(id=b), sem(id=c)])
    assert cluster.num_links == 0
    cluster[a].note.mem_links = [sem_link(a, b), sem_link(a, c)]
    cluster.mark_changed(a)
    assert cluster.num_links == 2


def test_remove_single_node_cleans_pending_edges_from_source():
    a, b = MemoryId(), MemoryId()
    cluster = MemoryCluster()
    cluster.add_note(sem(id=a, links=[sem_link(a, b)]))
    assert len(cluster.pending_links()) == 1
    cluster.remove_note(a)
    assert cluster.pending_links() == []
    cluster.add_note(sem(id=b))  # nothing to materialize from a removed source
    assert cluster.num_links == 0


def test_directed_linked_edges():
    a, b = MemoryId(), MemoryId()
    cluster = MemoryCluster()
    cluster.add_note(sem(id=a, links=[sem_link(a, b)]))
    cluster.add_note(sem(id=b))
    assert len(cluster.out_links(a)) == 1 and len(cluster.in_links(b)) == 1
    assert cluster.out_links(MemoryId()) == []


def test_graph_memory_link_intensity_roundtrip():
    a, b = MemoryId(), MemoryId()
    link = sem_link(a, b)
    cluster = MemoryCluster()
    cluster.add_note(sem(id=a, links=[link]))
    cluster.add_note(sem(id=b))
    edge = cluster.get_link(link.id)
    assert isinstance(edge, GraphMemoryLink)
    assert edge.intensity == 0.9 and edge.id == link.id
    assert edge.link_type.verb == "related"
    assert edge.to_memory_link() == link


def test_get_indexes_none_for_missing():
    cluster = MemoryCluster()
    assert cluster.get(MemoryId()) is None
    assert cluster.get_link(LinkId()) is None
    assert not cluster.has_link(LinkId())
    with pytest.raises(NotFoundError, match="not in the cluster"):
        cluster.index_of(MemoryId())
    with pytest.raises(NotFoundError):
        cluster[MemoryId()]
    with pytest.raises(KeyError):  # NotFoundError is also a KeyError
        cluster[MemoryId()]


# ---- re-parking, order, ids ------------------------------------------------------------------
def test_removal_reparks_incoming_links_keeping_id_and_intensity_newest_first():
    a, b, t = MemoryId(), MemoryId(), MemoryId()
    l1 = sem_link(a, t, intensity=0.25)
    l2 = sem_link(b, t, intensity=0.5)
    l3 = sem_link(a, t, intensity=0.75)  # a parallel edge
    cluster = MemoryCluster()
    cluster.add_notes([sem(id=a, links=[l1]), sem(id=b, links=[l2]), sem(id=t)])
    cluster[a].note.mem_links.append(l3)
    cluster.mark_changed(a)
    assert edge_ids(cluster) == [l1.id, l2.id, l3.id]
    cluster.remove_note(t)
    pending = cluster.pending_links()
    assert [lk.id for lk in pending] == [l3.id, l2.id, l1.id]  # newest first, as petgraph
    assert [lk.intensity for lk in pending] == [0.75, 0.5, 0.25]
    assert [lk.from_ for lk in pending] == [a, b, a]
    cluster.add_note(sem(id=t))
    assert edge_ids(cluster) == [l3.id, l2.id, l1.id]
    assert [lk.intensity for lk in cluster.out_links(a)] == [0.75, 0.25]


def test_removal_drops_owned_links_and_self_loops():
    a, b = MemoryId(), MemoryId()
    own = sem_link(a, b)
    loop = sem_link(a, a)
    cluster = MemoryCluster()
    cluster.add_notes([sem(id=a, links=[own, loop]), sem(id=b)])
    assert cluster.num_links == 2
    cluster.remove_note(a)
    assert cluster.num_links == 0 and cluster.pending_links() == []


def test_pending_materializes_before_own_links_in_parking_order():
    a, b, c = MemoryId(), MemoryId(), MemoryId()
    ab = sem_link(a, c)
    bc = sem_link(b, c)
    ca = sem_link(c, a)
    cluster = MemoryCluster()
    cluster.add_note(sem(id=a, links=[ab]))
    cluster.add_note(sem(id=b, links=[bc]))
    cluster.add_note(sem(id=c, links=[ca]))
    assert edge_ids(cluster) == [ab.id, bc.id, ca.id]


def test_node_index_is_adding_order_compacted_after_removal():
    notes = [sem(str(i)) for i in range(5)]
    cluster = MemoryCluster()
    cluster.add_notes(notes)
    assert [cluster.index_of(n.id) for n in notes] == [0, 1, 2, 3, 4]
    cluster.remove_note(notes[1].id)
    assert cluster.ids() == [notes[i].id for i in (0, 2, 3, 4)]
    assert [cluster.index_of(notes[i].id) for i in (0, 2, 3, 4)] == [0, 1, 2, 3]
    cluster.add_note(notes[1])
    assert cluster.index_of(notes[1].id) == 4
    assert [item.note.id for item in cluster] == cluster.ids()


def test_duplicate_link_ids_first_wins():
    a, b, c = MemoryId(), MemoryId(), MemoryId()
    first = sem_link(a, c)
    clash = sem_link(b, c).model_copy(update={"id": first.id})
    cluster = MemoryCluster()
    cluster.add_notes([sem(id=a, links=[first]), sem(id=b, links=[clash]), sem(id=c)])
    assert cluster.num_links == 1
    assert cluster.get_link(first.id).from_ == a


def test_duplicate_note_merges_only_new_links():
    a, b, c = MemoryId(), MemoryId(), MemoryId()
    ab = sem_link(a, b)
    ac = sem_link(a, c)
    cluster = MemoryCluster()
    original = sem("A", id=a, links=[ab])
    cluster.add_notes([original, sem(id=b), sem(id=c)])
    version = cluster.version
    assert not cluster.add_note(sem("A2", id=a, links=[ab, ac]))
    assert cluster[a].note is original and original.mem_type.content == "A"
    assert [lk.id for lk in original.mem_links] == [ab.id, ac.id]
    assert edge_ids(cluster) == [ab.id, ac.id]
    assert cluster.version > version
    version = cluster.version
    assert not cluster.add_note(sem("A3", id=a))  # nothing new: no change
    assert cluster.version == version


def test_duplicate_ids_within_one_batch():
    a = MemoryId()
    cluster = MemoryCluster()
    assert cluster.add_notes([sem("x", id=a), sem("y", id=a)]) == [True, False]
    assert cluster[a].note.mem_type.content == "x"


def test_link_source_is_the_holding_note():
    a, b, other = MemoryId(), MemoryId(), MemoryId()
    odd = sem_link(other, b)  # 'from' names some other note
    cluster = MemoryCluster()
    cluster.add_notes([sem(id=a, links=[odd]), sem(id=b)])
    assert cluster.get_link(odd.id).from_ == a


# ---- mark_changed / remove_link ---------------------------------------------------------------
def test_mark_changed_takes_over_intensity_type_target_and_removals():
    a, b, c = MemoryId(), MemoryId(), MemoryId()
    ab, ac = sem_link(a, b, intensity=0.5), sem_link(a, c)
    cluster = MemoryCluster()
    cluster.add_notes([sem(id=a, links=[ab, ac]), sem(id=b), sem(id=c)])
    note = cluster[a].note
    note.mem_links[0].intensity = 0.125
    cluster.mark_changed(a)
    assert cluster.get_link(ab.id).intensity == 0.125
    assert edge_ids(cluster) == [ab.id, ac.id]  # updated in place, order kept
    note.mem_links[0].to = c  # re-target
    cluster.mark_changed(a)
    assert cluster.get_link(ab.id).to == c
    note.mem_links = [note.mem_links[0]]  # drop ac
    cluster.mark_changed(a)
    assert edge_ids(cluster) == [ab.id]
    with pytest.raises(NotFoundError):
        cluster.mark_changed(MemoryId())


def test_mark_changed_updates_parked_links():
    a, missing = MemoryId(), MemoryId()
    link = sem_link(a, missing, intensity=0.5)
    cluster = MemoryCluster()
    cluster.add_note(sem(id=a, links=[link]))
    cluster[a].note.mem_links[0].intensity = 0.25
    cluster.mark_changed(a)
    assert [lk.intensity for lk in cluster.pending_links()] == [0.25]
    cluster[a].note.mem_links = []
    cluster.mark_changed(a)
    assert cluster.pending_links() == []


def test_remove_link_everywhere():
    a, b, missing = MemoryId(), MemoryId(), MemoryId()
    ab, parked = sem_link(a, b), sem_link(a, missing)
    cluster = MemoryCluster()
    cluster.add_notes([sem(id=a, links=[ab, parked]), sem(id=b)])
    removed = cluster.remove_link(ab.id)
    assert removed is not None and removed.id == ab.id
    assert cluster.num_links == 0
    assert [lk.id for lk in cluster[a].note.mem_links] == [parked.id]
    assert cluster.remove_link(parked.id) is None
    assert cluster.pending_links() == [] and cluster[a].note.mem_links == []
    cluster.mark_changed(a)  # nothing resurrects
    assert cluster.num_links == 0
    version = cluster.version
    assert cluster.remove_link(LinkId()) is None
    assert cluster.version == version


# ---- embeddings and validation -------------------------------------------------------------------
def test_embedding_is_optional_and_width_is_enforced():
    cluster = MemoryCluster()
    assert cluster.add_note(sem("no embedding"))
    assert cluster.embedding_dim is None
    assert cluster.add_note(sem("four"), embedding(4))
    assert cluster.embedding_dim == 4
    bad = sem("eight")
    with pytest.raises(
        ValidationError, match=r"embedding of note .*\.tag: expected width 4, found 8"
    ):
        cluster.add_note(bad, embedding(8))
    assert bad.id not in cluster


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (
            lambda: MemoryEmbedding(tag=torch.tensor([0.0, math.nan, 0, 0])),
            r"\.tag: expected finite",
        ),
        (
            lambda: MemoryEmbedding(
                tag=torch.zeros(4), fields={"content": torch.full((4,), math.inf)}
            ),
            r"\.fields\['content'\]: expected finite",
        ),
        (
            lambda: MemoryEmbedding(tag=torch.zeros(4), fields={"content": torch.zeros(3)}),
            r"\.fields\['content'\]: expected width 4, found 3",
        ),
        (
            lambda: MemoryEmbedding(tag=torch.zeros(4), fields={"colour": torch.zeros(4)}),
            r"\.fields\['colour'\]: expected a name in FIELD_NAMES",
        ),
        (lambda: MemoryEmbedding(tag=torch.zeros(2, 2)), r"\.tag: expected a 1-D float tensor"),
        (
            lambda: MemoryEmbedding(tag=torch.zeros(4, dtype=torch.int64)),
            r"\.tag: expected a 1-D float",
        ),
        (lambda: torch.zeros(4), r"expected a MemoryEmbedding or None, found Tensor"),
    ],
)
def test_bad_embeddings_are_rejected_naming_the_field(make, pattern):
    cluster = MemoryCluster()
    version = cluster.version
    with pytest.raises(ValidationError, match=pattern):
        cluster.add_note(sem(), make())
    assert len(cluster) == 0 and cluster.version == version


def test_add_notes_is_atomic_on_bad_input():
    cluster = MemoryCluster()
    good, bad = sem("good"), sem("bad")
    with pytest.raises(ValidationError, match="width 4, found 5"):
        cluster.add_notes([good, bad], [embedding(4), embedding(5)])
    assert len(cluster) == 0
    with pytest.raises(ValidationError, match=r"notes\[1\]: expected a MemoryNote"):
        cluster.add_notes([good, "not a note"])
    with pytest.raises(ValidationError, match="one entry per note"):
        cluster.add_notes([good], [])
    assert len(cluster) == 0


def test_fixed_embedding_dim_and_set_embedding():
    cluster = MemoryCluster(embedding_dim=4)
    note = sem()
    cluster.add_note(EmbeddedMemoryNote(note=note, embedding=embedding(4)))
    with pytest.raises(ValidationError, match="expected width 4, found 6"):
        cluster.set_embedding(note.id, embedding(6))
    version = cluster.version
    cluster.set_embedding(note.id, None)
    assert cluster[note.id].embedding is None and cluster.version > version
    assert cluster.embedding_dim == 4
    with pytest.raises(NotFoundError):
        cluster.set_embedding(MemoryId(), None)
    with pytest.raises(ValidationError, match="embedding_dim"):
        MemoryCluster(embedding_dim=0)


def test_inferred_dim_is_released_when_no_embedding_is_left():
    cluster = MemoryCluster()
    note = sem()
    cluster.add_note(note, embedding(4))
    cluster.set_embedding(note.id, embedding(8, seed=1))  # the only one: may change width
    assert cluster.embedding_dim == 8
    cluster.remove_note(note.id)
    assert cluster.embedding_dim is None
    cluster.add_note(sem(), embedding(3))
    assert cluster.embedding_dim == 3


# ---- version and graph cache ------------------------------------------------------------------
def test_version_bumps_on_every_change_and_graph_is_cached():
    cluster = MemoryCluster()
    a, b = sem("a"), sem("b")
    versions = [cluster.version]
    cluster.add_note(a)
    versions.append(cluster.version)
    g1 = MemoryGraph.of(cluster)
    assert MemoryGraph.of(cluster) is g1 and g1.version == cluster.version
    a.mem_links.append(sem_link(a.id, b.id))
    cluster.mark_changed(a.id)
    versions.append(cluster.version)
    cluster.add_note(b)
    versions.append(cluster.version)
    cluster.set_embedding(b.id, embedding())
    versions.append(cluster.version)
    cluster.remove_note(b.id)
    versions.append(cluster.version)
    assert versions == sorted(set(versions))
    g2 = MemoryGraph.of(cluster)
    assert g2 is not g1 and g2.version == cluster.version


def test_graph_cache_per_device(device):
    cluster = MemoryCluster()
    cluster.add_note(sem())
    g = MemoryGraph.of(cluster, device)
    assert g.device.type == device.type
    assert MemoryGraph.of(cluster, device) is g
    assert MemoryGraph.of(cluster).device.type == "cpu"


# ---- property test: the invariants of the pending-link bookkeeping -------------------------------
@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["add", "remove"]), st.integers(0, 5)), max_size=30),
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=12),
)
def test_pending_invariants_hold_under_random_adds_and_removes(ops, link_pairs):
    ids = [MemoryId() for _ in range(6)]
    links = {i: [] for i in range(6)}
    for s, t in link_pairs:
        links[s].append(sem_link(ids[s], ids[t]))
    cluster = MemoryCluster()
    for op, i in ops:
        if op == "add":
            cluster.add_note(sem(id=ids[i], links=links[i]))
        else:
            cluster.remove_note(ids[i])
    present = set(cluster.ids())
    edges = {lk.id: lk for lk in cluster.links()}
    pending = {lk.id: lk for lk in cluster.pending_links()}
    assert not (edges.keys() & pending.keys())
    for mid in present:
        for link in cluster[mid].note.mem_links:
            if link.to in present:
                assert (
                    link.id in edges
                    and edges[link.id].from_ == mid
                    and edges[link.id].to == link.to
                )
            else:
                assert link.id in pending and pending[link.id].from_ == mid
    for lk in edges.values():
        assert lk.from_ in present and lk.to in present
    for lk in pending.values():
        assert lk.from_ in present and lk.to not in present
    assert len(edges) + len(pending) == sum(len(cluster[m].note.mem_links) for m in present)


# -- the bulk finiteness check of add_notes ----------------------------------------------------
def test_bulk_finite_check_names_the_first_bad_vector_among_views_and_loose_ones() -> None:
    import pytest
    import torch

    from soulmem_torch.embedding.fields import MemoryEmbedding
    from soulmem_torch.errors import ValidationError
    from soulmem_torch.model import MemoryNote, SemMemory
    from soulmem_torch.runtime.cluster import MemoryCluster, first_non_finite

    def sem(i: int) -> MemoryNote:
        return MemoryNote.build(SemMemory(content=f"c{i}", aliases=[], concept_type="Entity",
                                          description=""))  # fmt: skip

    matrix = torch.zeros(12, 4)
    views = list(matrix.unbind(0))
    loose = [torch.ones(4) for _ in range(3)]
    assert first_non_finite(views + loose) is None
    matrix[7, 2] = float("nan")  # an in-place change: the remembered check no longer holds
    loose[1][0] = float("inf")
    assert first_non_finite(views + loose) == 7
    assert first_non_finite(loose + views) == 1
    notes = [sem(i) for i in range(4)]
    embs = [MemoryEmbedding(tag=views[2 * i], fields={"content": views[2 * i + 1]})
            for i in range(4)]  # fmt: skip
    cluster = MemoryCluster()
    with pytest.raises(ValidationError, match=rf"note {notes[3].id}\.fields\['content'\]: .*NaN"):
        cluster.add_notes(notes, embs)
    assert len(cluster) == 0  # nothing added
    matrix[7, 2] = 0.0
    assert cluster.add_notes(notes, embs) == [True] * 4
    # a structural error later in the batch does not hide an earlier NaN
    matrix2 = torch.zeros(3, 4)
    matrix2[0, 0] = float("inf")
    bad = [MemoryEmbedding(tag=matrix2[0]), MemoryEmbedding(tag=torch.zeros(5))]
    with pytest.raises(ValidationError, match="expected finite values"):
        MemoryCluster().add_notes([sem(8), sem(9)], bad)
