"""MemoryGraph: snapshot attributes, CSR order, caching, devices, from_tensors validation."""

from __future__ import annotations

import copy
import io
import math
import pickle

import pytest
import torch
from torch_geometric.data import Data

from soulmem_torch.embedding import stack_field_embeddings
from soulmem_torch.embedding.fields import FIELD_INDEX, FIELD_NAMES
from soulmem_torch.errors import NotFoundError, ValidationError
from soulmem_torch.functional.codes import (
    LINK_PROC,
    LINK_SEM,
    LINK_SIT_ABSTRACT_TO_SPECIFIC,
    LINK_SIT_SPECIFIC_TO_ABSTRACT,
    NODE_ABSTRACT,
    NODE_PROCEDURE,
    NODE_SEMANTIC,
    NODE_SPECIFIC,
)
from soulmem_torch.graph import MemoryGraph
from soulmem_torch.model import MemoryId
from soulmem_torch.runtime import MemoryCluster
from tests.conftest import fixture_path
from tests.runtime.helpers import (
    T0,
    a2s_link,
    abstract,
    embedding,
    proc,
    proc_link,
    s2a_link,
    sem,
    sem_link,
    specific,
)


@pytest.fixture
def small_cluster() -> tuple[MemoryCluster, dict[str, MemoryId]]:
    """Nodes p (specific), x (procedure), s (sem), a (abstract), in that order; links parked
    and released out of source order."""
    s, p, a, x = sem("s"), specific("p"), abstract("a"), proc("x")
    cluster = MemoryCluster()
    # p's links arrive first, then s's, so CSR sorting has work to do.
    p.mem_links += [s2a_link(p.id, a.id, intensity=0.5), proc_link(p.id, x.id, prob=0.25)]
    s.mem_links += [sem_link(s.id, p.id, confidence=0.7, intensity=2.0), sem_link(s.id, a.id)]
    a.mem_links += [a2s_link(a.id, p.id)]
    cluster.add_note(p, embedding(4, fields=("narrative",), seed=1))
    cluster.add_note(x)
    cluster.add_note(s, embedding(4, seed=2))
    cluster.add_note(a)
    return cluster, {"s": s.id, "p": p.id, "a": a.id, "x": x.id}


def test_snapshot_attributes(small_cluster):
    cluster, ids = small_cluster
    g = MemoryGraph.of(cluster)
    assert isinstance(g, Data) and isinstance(g, MemoryGraph)
    assert g.num_nodes == 4 and g.num_edges == 5
    assert g.ids == cluster.ids() == [ids["p"], ids["x"], ids["s"], ids["a"]]
    assert g.index_of == {mid: i for i, mid in enumerate(g.ids)}
    assert g.node_type.tolist() == [NODE_SPECIFIC, NODE_PROCEDURE, NODE_SEMANTIC, NODE_ABSTRACT]
    assert g.is_specific.tolist() == [True, False, False, False]
    assert g.is_procedure.tolist() == [False, True, False, False]
    assert g.is_semantic.tolist() == [False, False, True, False]
    assert g.is_abstract.tolist() == [False, False, False, True]
    # Materialization order: p->x (x added), s->p, then a's arrival releases p->a, s->a (in
    # parking order) before a's own a->p. CSR order by source keeps that order within a row.
    assert g.edge_index.tolist() == [[0, 0, 2, 2, 3], [1, 3, 0, 3, 0]]
    assert g.rowptr.tolist() == [0, 2, 2, 4, 5]
    assert g.edge_kind.tolist() == [
        LINK_PROC, LINK_SIT_SPECIFIC_TO_ABSTRACT, LINK_SEM, LINK_SEM, LINK_SIT_ABSTRACT_TO_SPECIFIC,
    ]  # fmt: skip
    assert g.intensity.dtype == torch.float64 and g.intensity.tolist() == [1.0, 0.5, 2.0, 0.9, 1.0]
    assert g.confidence.dtype == torch.float32
    assert g.confidence.tolist() == pytest.approx([0, 0, 0.7, 0.9, 0], abs=1e-7)
    assert g.confidence[2].item() == torch.tensor(0.7, dtype=torch.float32).item()
    assert g.prob.dtype == torch.float64 and g.prob.tolist() == [0.25, 0.0, 0.0, 0.0, 0.0]
    links = {lk.id: lk for lk in cluster.links()}
    assert [(g.index_of[links[k].from_], g.index_of[links[k].to]) for k in g.link_ids] == list(
        zip(*g.edge_index.tolist())
    )
    assert g.create_time_ns.tolist() == [T0.ns_since_epoch] * 4
    assert g.retrieval_count.tolist() == [0, 0, 0, 0]
    assert g.version == cluster.version
    g.validate()  # PyG's own checks pass


def test_snapshot_embeddings(small_cluster):
    cluster, ids = small_cluster
    g = MemoryGraph.of(cluster)
    f = len(FIELD_NAMES)
    assert g.tag_emb.shape == (4, 4) and g.tag_emb.dtype == torch.float32
    assert g.tag_mask.tolist() == [True, False, True, False]
    assert g.field_emb.shape == (4, f, 4) and g.field_mask.shape == (4, f)
    p_emb = cluster[ids["p"]].embedding
    torch.testing.assert_close(g.tag_emb[0], p_emb.tag)
    torch.testing.assert_close(g.field_emb[0, FIELD_INDEX["narrative"]], p_emb.fields["narrative"])
    assert g.field_mask[0].nonzero().flatten().tolist() == [FIELD_INDEX["narrative"]]
    assert g.field_mask[2].nonzero().flatten().tolist() == [
        FIELD_INDEX[n] for n in ("content", "aliases", "description")
    ]
    assert not g.field_mask[1].any() and not g.field_emb[1].any() and not g.tag_emb[1].any()


def test_no_embedding_gives_none():
    cluster = MemoryCluster()
    cluster.add_note(sem())
    g = MemoryGraph.of(cluster)
    assert g.tag_emb is None and g.tag_mask is None
    assert g.field_emb is None and g.field_mask is None
    assert "tag_emb" not in g.keys()


def test_stacker_matches_contract():
    embs = [embedding(3, seed=0), None, embedding(3, fields=("fused_self",), seed=1)]
    tag, tag_mask, field, field_mask = stack_field_embeddings(embs, 3)
    assert tag.shape == (3, 3) and field.shape == (3, len(FIELD_NAMES), 3)
    assert tag_mask.tolist() == [True, False, True]
    assert field_mask[2].nonzero().flatten().tolist() == [FIELD_INDEX["fused_self"]]
    torch.testing.assert_close(field[2, FIELD_INDEX["fused_self"]], embs[2].fields["fused_self"])


def test_rebuilt_only_when_cluster_changed(small_cluster):
    cluster, ids = small_cluster
    g = MemoryGraph.of(cluster)
    assert MemoryGraph.of(cluster) is g
    g.cache["ppr"] = "operator"
    note = cluster[ids["s"]].note
    note.retrieval_increment()
    assert MemoryGraph.of(cluster) is g  # not declared yet
    cluster.mark_changed(ids["s"])
    g2 = MemoryGraph.of(cluster)
    assert g2 is not g and g2.cache == {}
    assert g2.retrieval_count[g2.index_of[ids["s"]]].item() == 1


def test_to_device_copies_and_keeps_bookkeeping(small_cluster, device):
    cluster, _ = small_cluster
    g = MemoryGraph.of(cluster)
    g.cache["k"] = 1
    moved = g.to(device)
    assert moved.device.type == device.type
    for key in ("edge_index", "rowptr", "intensity", "confidence", "prob", "node_type", "tag_emb",
                "field_mask", "is_semantic", "create_time_ns"):  # fmt: skip
        assert getattr(moved, key).device.type == device.type, key
    assert moved.ids == g.ids and moved.link_ids == g.link_ids and moved.version == g.version
    assert g.device.type == "cpu"  # never moved in place
    if device.type == "cpu":
        assert moved is g
    else:
        assert moved is not g and moved.cache == {} and g.cache == {"k": 1}
        assert MemoryGraph.of(cluster, device) is MemoryGraph.of(cluster, device)
        back = moved.cpu()
        assert torch.equal(back.edge_index, g.edge_index)
    idx, mask = moved.indices([g.ids[2], MemoryId(), g.ids[0]], return_mask=True)
    assert idx.device.type == device.type
    assert idx.tolist() == [2, 0] and mask.tolist() == [True, False, True]


def test_indices_and_to_ids(small_cluster):
    cluster, ids = small_cluster
    g = MemoryGraph.of(cluster)
    assert g.indices([ids["a"], ids["p"]]).tolist() == [3, 0]
    assert g.indices([]).tolist() == []
    with pytest.raises(NotFoundError, match="not a node of this graph"):
        g.indices([MemoryId()], strict=True)
    assert g.to_ids(torch.tensor([3, 0])) == [ids["a"], ids["p"]]


def test_copy_pickle_and_deepcopy_drop_the_cache(small_cluster):
    cluster, _ = small_cluster
    g = MemoryGraph.of(cluster)
    g.cache["x"] = torch.ones(2)
    for other in (copy.copy(g), copy.deepcopy(g), pickle.loads(pickle.dumps(g))):
        assert isinstance(other, MemoryGraph)
        assert other.cache == {} and other.ids == g.ids and other.version == g.version
        assert torch.equal(other.edge_index, g.edge_index)
        assert other.index_of[g.ids[1]] == 1
    buffer = io.BytesIO()
    torch.save(g, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded.cache == {} and loaded.ids == g.ids
    assert g.cache["x"].tolist() == [1.0, 1.0]


def test_empty_cluster_graph():
    g = MemoryGraph.of(MemoryCluster())
    assert g.num_nodes == 0 and g.edge_index.shape == (2, 0) and g.rowptr.tolist() == [0]
    assert g.ids == []


# ---- from_tensors ------------------------------------------------------------------------------
def _synthetic(n=5, e=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        edge_index=torch.randint(0, n, (2, e), generator=g),
        num_nodes=n,
        edge_kind=torch.randint(0, 4, (e,), generator=g),
        node_type=torch.randint(0, 4, (n,), generator=g),
        intensity=torch.rand(e, generator=g, dtype=torch.float64),
        confidence=torch.rand(e, generator=g),
        prob=torch.rand(e, generator=g, dtype=torch.float64),
    )


def test_from_tensors_sorts_stably_and_permutes_attributes(device):
    args = _synthetic()
    args = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    link_ids = [f"link{i}" for i in range(12)]
    g = MemoryGraph.from_tensors(**args, link_ids=link_ids)
    src = args["edge_index"][0].cpu()
    perm = torch.tensor(sorted(range(12), key=lambda i: (src[i].item(), i)))  # stable reference
    assert g.device.type == device.type
    assert torch.equal(g.edge_index.cpu(), args["edge_index"].cpu()[:, perm])
    assert torch.equal(g.intensity.cpu(), args["intensity"].cpu()[perm])
    kind = args["edge_kind"].cpu()[perm]
    assert torch.equal(g.edge_kind.cpu(), kind)
    conf = torch.where(kind == LINK_SEM, args["confidence"].cpu()[perm], 0.0)
    assert torch.equal(g.confidence.cpu(), conf)
    prob = torch.where(kind == LINK_PROC, args["prob"].cpu()[perm], 0.0)
    assert torch.equal(g.prob.cpu(), prob)
    assert g.link_ids == [link_ids[i] for i in perm.tolist()]
    counts = torch.bincount(src, minlength=5)
    assert g.rowptr.cpu().tolist() == [0, *torch.cumsum(counts, 0).tolist()]
    assert g.version is None


def test_from_tensors_defaults_and_lazy_ids():
    ei = torch.tensor([[0, 1, 1], [1, 0, 2]])
    g = MemoryGraph.from_tensors(
        ei, num_nodes=3, edge_kind=torch.tensor([LINK_SEM, LINK_PROC, LINK_SIT_ABSTRACT_TO_SPECIFIC]),
        node_type=torch.tensor([NODE_SEMANTIC, NODE_SPECIFIC, NODE_PROCEDURE]),
    )  # fmt: skip
    assert g.intensity.tolist() == [1.0, 1.0, 1.0]
    assert g.confidence.tolist() == [1.0, 0.0, 0.0]
    assert g.prob.tolist() == [0.0, 1.0, 0.0]
    assert g.create_time_ns.tolist() == [0, 0, 0] and g.retrieval_count.tolist() == [0, 0, 0]
    assert g.tag_emb is None
    twin = copy.copy(g)  # copies share the lazily created ids
    ids = g.ids
    assert len(ids) == 3 and len(set(ids)) == 3 and g.ids is ids and twin.ids is ids
    assert len(g.link_ids) == 3 and twin.link_ids is g.link_ids
    assert g.indices([ids[2]]).tolist() == [2]


def test_from_tensors_embeddings():
    n, d, f = 3, 5, len(FIELD_NAMES)
    base = _synthetic(n=n, e=4)
    g = MemoryGraph.from_tensors(
        **base, tag_emb=torch.randn(n, d, dtype=torch.float64), field_emb=torch.randn(n, f, d),
        field_mask=torch.zeros(n, f, dtype=torch.bool),
    )  # fmt: skip
    assert g.tag_emb.dtype == torch.float32 and g.tag_mask.all()
    assert g.field_emb.shape == (n, f, d) and not g.field_mask.any()


def _err(pattern, **override):
    args = _synthetic()
    args.update(override)
    with pytest.raises(ValidationError, match=pattern):
        MemoryGraph.from_tensors(**args)


def test_from_tensors_validation_errors_name_the_field():
    n, e, f = 5, 12, len(FIELD_NAMES)
    _err(r"edge_index: expected shape \(2, E\)", edge_index=torch.zeros(3, e, dtype=torch.long))
    _err("edge_index: expected an integer tensor", edge_index=torch.zeros(2, e))
    bad = torch.zeros(2, e, dtype=torch.long)
    bad[1, 7] = 5
    _err(
        r"edge_index: expected node indices in \[0, 5\), found 5 at edge_index\[1, 7\]",
        edge_index=bad,
    )
    bad = torch.zeros(2, e, dtype=torch.long)
    bad[0, 3] = -1
    _err(r"found -1 at edge_index\[0, 3\]", edge_index=bad)
    _err("num_nodes: expected an int >= 0", num_nodes=-1)
    _err("num_nodes: expected an int >= 0", num_nodes=2.5)
    _err(r"edge_kind: expected shape \(12,\)", edge_kind=torch.zeros(11, dtype=torch.long))
    _err(r"edge_kind: expected codes in \(0, 1, 2, 3\), found 7 at edge 0",
         edge_kind=torch.tensor([7] + [0] * 11))  # fmt: skip
    _err(
        r"node_type: expected codes in .* found 9 at node 2",
        node_type=torch.tensor([0, 1, 9, 0, 0]),
    )
    _err(r"node_type: expected shape \(5,\)", node_type=torch.zeros(4, dtype=torch.long))
    neg = torch.ones(e, dtype=torch.float64)
    neg[4] = -0.5
    _err(r"intensity: expected finite values >= 0.0, found -0.5 at edge 4", intensity=neg)
    nan = torch.ones(e, dtype=torch.float64)
    nan[2] = math.nan
    _err(r"intensity: expected finite values >= 0.0, found nan at edge 2", intensity=nan)
    _err("intensity: expected a floating-point tensor", intensity=torch.ones(e, dtype=torch.long))
    _err(r"confidence: expected finite values in \[0.0, 1.0\], found 1.5 at edge 0",
         confidence=torch.tensor([1.5] + [0.5] * 11))  # fmt: skip
    _err(r"prob: expected finite values in \[0.0, 1.0\], found -0.25 at edge 11",
         prob=torch.tensor([0.5] * 11 + [-0.25], dtype=torch.float64))  # fmt: skip
    _err(r"prob: expected finite values .* found inf", prob=torch.full((e,), math.inf))
    _err(r"retrieval_count: expected values >= 0, found -1 at node 0",
         retrieval_count=torch.tensor([-1, 0, 0, 0, 0]))  # fmt: skip
    emb = torch.zeros(n, 4)
    emb[1, 2] = math.nan
    _err(r"tag_emb: expected finite values, found nan at \(1, 2\)", tag_emb=emb)
    _err(r"tag_emb: expected shape \(5, 4\)", tag_emb=torch.zeros(4, 4))
    _err(r"field_emb: expected shape \(5, 15, 4\)", field_emb=torch.zeros(n, 3, 4))
    _err(r"field_emb: expected width D = 4 \(that of tag_emb\), found 6",
         tag_emb=torch.zeros(n, 4), field_emb=torch.zeros(n, f, 6))  # fmt: skip
    inf = torch.zeros(n, f, 4)
    inf[0, 0, 0] = -math.inf
    _err("field_emb: expected finite values, found -inf", field_emb=inf)
    _err("tag_mask: expected a bool tensor", tag_emb=torch.zeros(n, 4), tag_mask=torch.ones(n))
    _err("tag_mask: given without tag_emb", tag_mask=torch.ones(n, dtype=torch.bool))
    _err("ids: expected 5 MemoryId values, found 1", ids=[MemoryId()])
    same = MemoryId()
    _err("ids: expected distinct", ids=[same] * 5)
    _err("link_ids: expected 12 LinkId values", link_ids=[])


def test_from_tensors_empty_graph():
    g = MemoryGraph.from_tensors(
        torch.zeros(2, 0, dtype=torch.long), num_nodes=0,
        edge_kind=torch.zeros(0, dtype=torch.long), node_type=torch.zeros(0, dtype=torch.long),
    )  # fmt: skip
    assert g.num_nodes == 0 and g.num_edges == 0 and g.rowptr.tolist() == [0]


def test_congyu_cluster_snapshot():
    from soulmem_torch.model.soul_tune import load_soul_tune_graph

    loaded = load_soul_tune_graph(fixture_path("soul_tune", "congyu", "graph.json"))
    cluster = MemoryCluster()
    cluster.add_notes(loaded.notes)
    g = MemoryGraph.of(cluster)
    assert g.num_nodes == 34 and g.num_edges == len(cluster.links()) + 0
    assert g.num_edges + len(cluster.pending_links()) == loaded.num_links == 61
    assert bool((g.edge_index[0][1:] >= g.edge_index[0][:-1]).all())
    assert (
        int(g.is_semantic.sum() + g.is_specific.sum() + g.is_abstract.sum() + g.is_procedure.sum())
        == 34
    )


def _sample_cluster() -> MemoryCluster:
    from soulmem_torch.data import sample_memory_path
    from soulmem_torch.model.soul_tune import load_soul_tune_graph

    cluster = MemoryCluster()
    cluster.add_notes(load_soul_tune_graph(sample_memory_path()).notes)
    return cluster


def test_from_cluster_edge_columns_are_each_links_values() -> None:
    # reference: the columns read link by link, as the original's graph export reads them
    cluster = _sample_cluster()
    graph = MemoryGraph.from_cluster(cluster)
    index = {mid: i for i, mid in enumerate(cluster.ids())}
    want = {}
    for link in cluster.links():
        lt = link.link_type
        kind = {"SemMemLink": LINK_SEM, "TrigToAction": LINK_PROC}.get(type(lt).__name__)
        want[link.id] = (
            index[link.from_], index[link.to], float(link.intensity),
            float(torch.tensor(float(lt.confidence), dtype=torch.float32))
            if kind == LINK_SEM else 0.0,
            float(lt.prob) if kind == LINK_PROC else 0.0,
        )  # fmt: skip
    assert len(want) == graph.num_edges > 0
    for e, lid in enumerate(graph.link_ids):
        src, dst = graph.edge_index[:, e].tolist()
        got = (src, dst, float(graph.intensity[e]), float(graph.confidence[e]),
               float(graph.prob[e]))  # fmt: skip
        assert got == want[lid]


def test_from_cluster_names_a_bad_link(monkeypatch) -> None:
    cluster = _sample_cluster()
    links = cluster.links()
    from types import SimpleNamespace

    def stand_in(link, **change):  # a link with the cluster's link's attributes, changed
        fields = ("id", "from_", "to", "link_type", "intensity")
        return SimpleNamespace(**{**{f: getattr(link, f) for f in fields}, **change})

    stray = MemoryId()
    dangling = stand_in(links[3], to=stray)
    monkeypatch.setattr(cluster, "links", lambda: [*links, dangling])
    with pytest.raises(ValidationError, match=f"edge {dangling.id} names note {stray}"):
        MemoryGraph.from_cluster(cluster)

    class Unknown:
        pass

    odd = stand_in(links[5], link_type=Unknown())
    monkeypatch.setattr(cluster, "links", lambda: [*links, odd])
    with pytest.raises(ValidationError, match=f"edge {odd.id} has link_type Unknown"):
        MemoryGraph.from_cluster(cluster)


def _embedded_cluster(dim: int) -> MemoryCluster:
    from soulmem_torch import SoulMem
    from soulmem_torch.data import sample_memory_path
    from soulmem_torch.embedding import HashingEmbedder
    from soulmem_torch.model.soul_tune import load_soul_tune_graph

    mem = SoulMem(embedder=HashingEmbedder(dim=dim))
    mem.add_notes(load_soul_tune_graph(sample_memory_path()).notes)
    return mem.working_memory.cluster


def _same_graph(a: MemoryGraph, b: MemoryGraph) -> None:
    for name in ("edge_index", "rowptr", "edge_kind", "intensity", "confidence", "prob",
                 "node_type", "is_semantic", "is_specific", "is_abstract", "is_procedure",
                 "create_time_ns", "retrieval_count", "tag_emb", "tag_mask", "field_rows",
                 "field_pos"):  # fmt: skip
        x, y = getattr(a, name, None), getattr(b, name, None)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x, y), name
    assert a.num_nodes == b.num_nodes and a.version == b.version
    assert list(a.ids) == list(b.ids) and list(a.link_ids) == list(b.link_ids)


def test_from_clusters_builds_each_clusters_own_snapshot(monkeypatch) -> None:
    """Many clusters' snapshots in one pass are each cluster's own, bit for bit (the route
    through ``from_tensors``): without embeddings, with sparse and with dense compact tables,
    empty, with links out of source order (CSR-sorted per cluster, link ids following); a
    value a check refuses is named as ``from_tensors`` names it; ``of_many`` caches them."""
    from soulmem_torch import graph as graph_module

    plain, sparse, narrow = _sample_cluster(), _embedded_cluster(1024), _embedded_cluster(16)
    shuffled = _sample_cluster()
    links = shuffled.links()
    monkeypatch.setattr(shuffled, "links", lambda: links[::-1])
    clusters = [plain, MemoryCluster(), sparse, shuffled, narrow]
    built = MemoryGraph.from_clusters(clusters)
    assert isinstance(sparse_graph := built[2], MemoryGraph) and sparse_graph.tag_emb is not None
    for cluster, graph in zip(clusters, built):
        want = graph_module._checked_graph(graph_module._cluster_columns(cluster))
        _same_graph(graph, want)
    assert built[3].link_ids != [lk.id for lk in links[::-1]]  # (it was sorted)
    assert MemoryGraph.from_clusters([]) == []

    from types import SimpleNamespace

    bad = SimpleNamespace(**{f: getattr(links[2], f) for f in ("id", "from_", "to", "link_type")},
                          intensity=-0.5)  # fmt: skip
    monkeypatch.setattr(shuffled, "links", lambda: [*links[:2], bad, *links[3:]])
    with pytest.raises(ValidationError, match=r"intensity: expected finite values >= 0.0, "
                       r"found -0.5 at edge \d+"):  # fmt: skip
        MemoryGraph.from_clusters([plain, shuffled])
    monkeypatch.setattr(shuffled, "links", lambda: links)

    fresh = [_sample_cluster(), _sample_cluster()]
    got = MemoryGraph.of_many([fresh[0], fresh[1], fresh[0]])
    assert got[0] is got[2] is MemoryGraph.of(fresh[0]) and got[1] is MemoryGraph.of(fresh[1])
    _same_graph(got[1], MemoryGraph.from_cluster(fresh[1]))
