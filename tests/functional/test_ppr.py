"""PPR kernels: the sequential push against the original's own tests and a scan-based
transcription; the batched push, the power iteration and the naive iteration against a dense
float64 closed form and against each other; invariants; and every bad input."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional import (
    PREFERENCE_SEMANTIC,
    PREFERENCE_SITUATION,
    TransitionOperator,
    build_transition,
    dynamic_edge_weight,
    power_iteration_steps,
    ppr_forward_push,
    ppr_naive,
    ppr_power_iteration,
    ppr_sequential_push,
)
from soulmem_torch.functional.codes import (
    LINK_PROC,
    LINK_SEM,
    LINK_SIT_ABSTRACT_TO_SPECIFIC,
    LINK_SIT_SPECIFIC_TO_ABSTRACT,
    NODE_PROCEDURE,
    NODE_SEMANTIC,
)

F64 = torch.float64
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def f32(v: float) -> float:
    """A float32 value widened to float64 (what the original's f32 -> f64 casts give)."""
    return float(np.float32(v))


# ------------------------------------------------------------------------------------------
# References
# ------------------------------------------------------------------------------------------


def scan_push_reference(n, edges, weights, keys, bias, damping, threshold):
    """Straight transcription of the original's scan version of ``weighted_ppr_fp``.

    O(N) arg-max scan per push (``iter().max()`` returns the *last* maximum, i.e. the highest
    index), lazily cached newest-first normalized weights, ``continue`` on drops.
    """
    psum = 0.0
    for b in bias:
        psum += b
    if psum != 1.0:
        bias = [b / psum for b in bias]
    n_src = float(len(keys))
    out = [[] for _ in range(n)]
    for (s, t), w in zip(edges, weights):
        out[s].append((t, w))
    residue = [0.0] * n
    reserve = [0.0] * n
    for k, b in zip(keys, bias):
        residue[k] = b
    cache = {}
    for _ in range(max(n, 1) * 1024):
        u = 0
        for i in range(n):
            if residue[i] >= residue[u]:
                u = i
        r = residue[u]
        if r <= threshold:
            break
        if u not in cache:
            lst = out[u][::-1]
            total = 0.0
            for _, w in lst:
                total += w
            if total != 0.0:
                lst = [(t, w / total) for t, w in lst]
            cache[u] = lst
        lst = cache[u]
        residue[u] = 0.0
        reserve[u] += (1.0 - damping) * r
        if lst:
            if r * max(w for _, w in lst) > threshold:
                for t, w in lst:
                    residue[t] += damping * w * r
        elif r / n_src > threshold:
            for k in keys:
                residue[k] += damping * r / n_src
    total = 0.0
    for v in reserve:
        total += v
    return [] if total == 0.0 else [v / total for v in reserve]


def naive_reference(n, edges, keys, bias, damping, nb_iter):
    """Straight transcription of the original's ``naive_ppr`` (O(N^2 E) per step)."""
    psum = sum(bias)
    p = dict(zip(keys, bias if psum == 1.0 else [b / psum for b in bias]))
    out = [[t for s, t in edges if s == i] for i in range(n)]
    deg = [float(len(o)) for o in out]
    rank = [p.get(i, 0.0) for i in range(n)]
    for _ in range(nb_iter):
        new = []
        for c in range(n):
            acc = 0.0
            for i in range(n):
                if c in out[i]:
                    acc += damping * rank[i] / deg[i]
                elif deg[i] == 0.0 and c in p:
                    acc += damping * rank[i] / len(p)
            new.append(acc + ((1.0 - damping) * p[c] if c in p else 0.0))
        total = sum(new)
        if total != 0.0:
            rank = [v / total for v in new]
    total = sum(rank)
    return [v / total for v in rank]


def closed_form(n, edge_index, edge_weight, personalization, keys, damping):
    """Exact PPR: ``x = (1 - d)(I - d P_b^T)^-1 s_b`` per column, normalized (numpy float64)."""
    src, dst = edge_index.cpu().numpy()
    w = edge_weight.cpu().numpy().astype(np.float64)
    mat = np.zeros((n, n))
    np.add.at(mat, (src, dst), w)
    deg = np.bincount(src, minlength=n)
    rows = mat.sum(1)
    trans = np.divide(mat, rows[:, None], out=np.zeros_like(mat), where=rows[:, None] != 0)
    pers = personalization.cpu().numpy().reshape(n, -1).astype(np.float64)
    keyset = keys.cpu().numpy().reshape(n, -1) | (pers != 0)
    out = np.zeros_like(pers)
    for b in range(pers.shape[1]):
        pb = trans.copy()
        pb[deg == 0] = keyset[:, b] / keyset[:, b].sum()
        s = pers[:, b] / pers[:, b].sum()
        x = np.linalg.solve(np.eye(n) - damping * pb.T, (1.0 - damping) * s)
        out[:, b] = x / x.sum()
    return out


# ------------------------------------------------------------------------------------------
# Random graphs
# ------------------------------------------------------------------------------------------


@st.composite
def memory_graphs(draw, max_nodes=24, max_edges=70, max_queries=4):
    """Random memory graph: self loops, parallel edges, dangling nodes, Procedure targets,
    zero-weight keys."""
    n = draw(st.integers(1, max_nodes))
    num_edges = draw(st.integers(0, max_edges))
    pair = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))
    edges = draw(st.lists(pair, min_size=num_edges, max_size=num_edges))
    edges.sort(key=lambda e: e[0])  # CSR order, stable (insertion order within a source)
    kinds = draw(
        st.lists(
            st.sampled_from(
                [LINK_PROC, LINK_SEM, LINK_SIT_ABSTRACT_TO_SPECIFIC, LINK_SIT_SPECIFIC_TO_ABSTRACT]
            ),
            min_size=num_edges,
            max_size=num_edges,
        )
    )
    node_type = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    intensity = draw(st.lists(st.floats(0.0, 2.0), min_size=num_edges, max_size=num_edges))
    confidence = draw(st.lists(st.floats(0.0, 1.0), min_size=num_edges, max_size=num_edges))
    num_q = draw(st.integers(1, max_queries))
    pers = torch.zeros(n, num_q, dtype=F64)
    key_mask = torch.zeros(n, num_q, dtype=torch.bool)
    for b in range(num_q):
        keys = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=min(n, 4), unique=True))
        weights = draw(st.lists(st.floats(0.0, 1.0), min_size=len(keys), max_size=len(keys)))
        if sum(weights) <= 0:
            weights[0] = 1.0
        for k, w in zip(keys, weights):
            pers[k, b] = w
            key_mask[k, b] = True
    edge_index = torch.tensor(edges, dtype=torch.int64).reshape(-1, 2).T.contiguous()
    weight = dynamic_edge_weight(
        edge_index,
        torch.tensor(kinds, dtype=torch.int64),
        torch.tensor(intensity, dtype=F64),
        torch.tensor(confidence, dtype=torch.float32),
        torch.tensor(node_type, dtype=torch.int64),
        preference=draw(st.sampled_from([PREFERENCE_SEMANTIC, PREFERENCE_SITUATION])),
    )
    return n, edge_index, weight, pers, key_mask


def keys_of(pers: torch.Tensor, key_mask: torch.Tensor, b: int) -> tuple[list[int], list[float]]:
    idx = (key_mask[:, b] | (pers[:, b] != 0)).nonzero().reshape(-1).tolist()
    return idx, pers[idx, b].tolist()


def l1(a, b) -> np.ndarray:
    return np.abs(np.asarray(a) - np.asarray(b)).sum(0)


# ------------------------------------------------------------------------------------------
# Sequential push: the original's unit tests (crates/soul-mem-algo/src/common/ppr/test.rs)
# ------------------------------------------------------------------------------------------

TOY_EDGES = torch.tensor([[0, 0, 1, 2], [1, 2, 2, 3]])  # a->b, a->c, b->c, c->d
TOY_EXPECTED = {
    (0,): [0.851652742, 0.06387396045, 0.07345504972, 0.01101824785],
    (1,): [0.0, 0.852878432, 0.1279320211, 0.01918954688],
    (0, 1): [0.4261326137, 0.4580925718, 0.1006738318, 0.00510098267],
}


def diff(actual: float, expected: float) -> float:
    eps = np.finfo(np.float64).eps
    return 0.0 if abs(expected) < eps and abs(actual) < eps else abs(actual - expected)


@pytest.mark.parametrize("keys", list(TOY_EXPECTED))
def test_sequential_toy_graph_matches_original_unit_test(keys):
    out = ppr_sequential_push(
        TOY_EDGES,
        torch.ones(4, dtype=F64),
        torch.tensor(keys),
        torch.ones(len(keys), dtype=F64),
        num_nodes=4,
        damping=0.15,
        threshold=0.002,
    )
    assert abs(out.sum().item() - 1.0) < 1e-6
    avg = 0.25 * sum(diff(a, e) for a, e in zip(out.tolist(), TOY_EXPECTED[keys]))
    assert avg < 0.005


@pytest.mark.parametrize("keys", list(TOY_EXPECTED))
def test_naive_toy_graph_matches_original_unit_test(keys):
    pers = torch.zeros(4, dtype=F64)
    pers[list(keys)] = 1.0
    out = ppr_naive(TOY_EDGES, pers, num_nodes=4, damping=0.15, nb_iter=15)
    assert abs(out.sum().item() - 1.0) < 1e-6
    avg = 0.25 * sum(diff(a, e) for a, e in zip(out.tolist(), TOY_EXPECTED[keys]))
    assert avg < 0.005


def test_sequential_weighted_hub_does_not_truncate():
    # Hub S (index 1) has 200 leaves (max weight 0.005: its push is dropped); T (index 0) has
    # a single edge to the far node U. Dropping S's push must not end the loop.
    leaves = list(range(2, 202))
    u = 202
    edges = [(0, u)] + [(1, leaf) for leaf in leaves]
    edges.sort(key=lambda e: e[0])
    edge_index = torch.tensor(edges).T
    out = ppr_sequential_push(
        edge_index,
        torch.ones(edge_index.shape[1], dtype=F64),
        torch.tensor([1, 0]),
        torch.ones(2, dtype=F64),
        num_nodes=203,
        damping=0.65,
        threshold=0.02,
    )
    assert out[u] > 0
    assert torch.isfinite(out).all() and (out >= 0).all() and (out <= 1).all()
    assert abs(out.sum().item() - 1.0) < 1e-5


def test_sequential_forward_push_vs_naive_consistency():
    # association.rs: test_ppr_forward_push_vs_naive_consistency
    naive = ppr_naive(
        TOY_EDGES, torch.tensor([1.0, 0, 0, 0], dtype=F64), num_nodes=4, damping=0.15, nb_iter=20
    )
    push = ppr_sequential_push(
        TOY_EDGES,
        torch.ones(4, dtype=F64),
        torch.tensor([0]),
        torch.tensor([1.0], dtype=F64),
        num_nodes=4,
        damping=0.15,
        threshold=1e-6,
    )
    ns = sorted(naive.tolist(), reverse=True)
    fs = sorted(push.tolist(), reverse=True)
    assert all(abs(a - b) < 0.05 for a, b in zip(ns, fs))


def test_naive_pressure_large_graph():
    # 500 nodes; node i: self loop, then an edge to every node 0..=i (so i->i twice);
    # keys: the first 10 nodes, weight = their index (node 0 is a zero-weight key).
    src, dst = [], []
    for i in range(500):
        src.append(i)
        dst.append(i)
        src.extend([i] * (i + 1))
        dst.extend(range(i + 1))
    pers = torch.zeros(500, dtype=F64)
    pers[:10] = torch.arange(10, dtype=F64)
    key_mask = torch.zeros(500, dtype=torch.bool)
    key_mask[:10] = True
    out = ppr_naive(
        torch.tensor([src, dst]),
        pers,
        num_nodes=500,
        damping=0.15,
        nb_iter=15,
        key_mask=key_mask,
    )
    assert out.sum().item() - 1.0 < 1e-5


# Association snapshots (association.rs tests; insta snapshots of the latest original).
def test_sequential_multi_source_snapshot_bit_exact():
    # Three Semantic notes, Sem links 0->1 and 1->2 (confidence 0.8); sources (0, 0.6f32),
    # (1, 0.4f32); default config (damping 0.65, threshold 1e-5, Situation, 1.0 / 0.8).
    edge_index = torch.tensor([[0, 1], [1, 2]])
    weight = dynamic_edge_weight(
        edge_index,
        torch.tensor([LINK_SEM, LINK_SEM]),
        torch.ones(2, dtype=F64),
        torch.tensor([0.8, 0.8], dtype=torch.float32),
        torch.tensor([NODE_SEMANTIC] * 3),
    )
    out = ppr_sequential_push(
        edge_index,
        weight,
        torch.tensor([0, 1]),
        torch.tensor([f32(0.6), f32(0.4)], dtype=F64),
        num_nodes=3,
    )
    assert sorted(out.tolist(), reverse=True) == [
        0.42444612181420877,
        0.2996666695096889,
        0.2758872086761024,
    ]


@pytest.mark.parametrize("preference", [PREFERENCE_SEMANTIC, PREFERENCE_SITUATION])
def test_sequential_type_preference_snapshot_bit_exact(preference):
    # src -> b (Sem, 0.8) then src -> c (Situation AbstractToSpecific), all notes Semantic.
    edge_index = torch.tensor([[0, 0], [1, 2]])
    weight = dynamic_edge_weight(
        edge_index,
        torch.tensor([LINK_SEM, LINK_SIT_ABSTRACT_TO_SPECIFIC]),
        torch.ones(2, dtype=F64),
        torch.tensor([0.8, 0.0], dtype=torch.float32),
        torch.tensor([NODE_SEMANTIC] * 3),
        preference=preference,
    )
    out = ppr_sequential_push(
        edge_index, weight, torch.tensor([0]), torch.tensor([1.0], dtype=F64), num_nodes=3
    )
    assert sorted(out.tolist(), reverse=True) == [
        0.6060624907881965,
        0.1982598237872581,
        0.19567768542454533,
    ]


def test_sequential_procedure_target_gets_nothing():
    edge_index = torch.tensor([[0], [1]])
    weight = dynamic_edge_weight(
        edge_index,
        torch.tensor([LINK_PROC]),
        torch.ones(1, dtype=F64),
        torch.zeros(1),
        torch.tensor([NODE_SEMANTIC, NODE_PROCEDURE]),
    )
    out = ppr_sequential_push(
        edge_index, weight, torch.tensor([0]), torch.tensor([1.0], dtype=F64), num_nodes=2
    )
    assert out.tolist() == [1.0, 0.0]


# ------------------------------------------------------------------------------------------
# Sequential push: exact semantics
# ------------------------------------------------------------------------------------------


@SETTINGS
@given(graph=memory_graphs(max_nodes=12, max_edges=30, max_queries=1), data=st.data())
def test_sequential_bit_identical_to_scan_transcription(graph, data):
    n, edge_index, weight, pers, key_mask = graph
    damping = data.draw(st.sampled_from([0.0, 0.15, 0.5, 0.65, 0.9]))
    threshold = data.draw(st.sampled_from([1e-2, 1e-4, 1e-5, 1e-7]))
    keys, bias = keys_of(pers, key_mask, 0)
    ours = ppr_sequential_push(
        edge_index,
        weight,
        torch.tensor(keys),
        torch.tensor(bias, dtype=F64),
        num_nodes=n,
        damping=damping,
        threshold=threshold,
    )
    ref = scan_push_reference(
        n, edge_index.T.tolist(), weight.tolist(), keys, bias, damping, threshold
    )
    assert ours.tolist() == ref


def test_sequential_sums_out_weights_newest_first():
    # Oldest-first, 1.0 + 1e-16 + 1e-16 == 1.0; newest-first, the two tiny weights add up
    # before meeting 1.0 and the sum is 1.0000000000000002: a different normalized weight.
    edge_index = torch.tensor([[0, 0, 0], [1, 2, 3]])
    weight = torch.tensor([1.0, 1e-16, 1e-16], dtype=F64)
    out = ppr_sequential_push(
        edge_index,
        weight,
        torch.tensor([0]),
        torch.tensor([1.0], dtype=F64),
        num_nodes=4,
        damping=0.5,
        threshold=1e-3,
    )
    ref = scan_push_reference(4, edge_index.T.tolist(), weight.tolist(), [0], [1.0], 0.5, 1e-3)
    assert out.tolist() == ref
    assert 1e-16 + 1e-16 + 1.0 != 1.0 + 1e-16 + 1e-16
    # The same links inserted in the opposite order sum oldest-first: different bits.
    flipped = ppr_sequential_push(
        edge_index[:, [2, 1, 0]],
        weight[[2, 1, 0]],
        torch.tensor([0]),
        torch.tensor([1.0], dtype=F64),
        num_nodes=4,
        damping=0.5,
        threshold=1e-3,
    )
    assert flipped.tolist() != out.tolist()


def test_sequential_ties_go_to_the_highest_index():
    # Two keys with equal residue and one push allowed: only the higher index is processed.
    out = ppr_sequential_push(
        torch.zeros(2, 0, dtype=torch.int64),
        torch.zeros(0, dtype=F64),
        torch.tensor([0, 1]),
        torch.tensor([1.0, 1.0], dtype=F64),
        num_nodes=2,
        max_iterations=1,
    )
    assert out.tolist() == [0.0, 1.0]


def test_sequential_iteration_cap_keeps_the_certificate():
    n = 6
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]])
    weight = torch.ones(6, dtype=F64)
    out, stats = ppr_sequential_push(
        edge_index,
        weight,
        torch.tensor([0]),
        torch.tensor([1.0], dtype=F64),
        num_nodes=n,
        damping=0.9,
        threshold=1e-9,
        max_iterations=7,
        return_stats=True,
    )
    assert not stats.converged and stats.iterations == 7
    exact = closed_form(
        n, edge_index, weight, torch.eye(n, 1, dtype=F64), torch.zeros(n, 1, dtype=torch.bool), 0.9
    )
    assert l1(out.numpy(), exact[:, 0]) <= stats.error_bound.item()


def test_sequential_zero_weight_key_receives_dangling_mass():
    # Node 0 -> 1, node 1 dangling; key 2 has weight 0 but shares the dangling mass.
    edge_index = torch.tensor([[0], [1]])
    out = ppr_sequential_push(
        edge_index,
        torch.ones(1, dtype=F64),
        torch.tensor([0, 2]),
        torch.tensor([1.0, 0.0], dtype=F64),
        num_nodes=3,
        threshold=1e-12,
    )
    assert out[2] > 0
    pers = torch.tensor([[1.0], [0.0], [0.0]], dtype=F64)
    keys = torch.tensor([[True], [False], [True]])
    exact = closed_form(3, edge_index, torch.ones(1, dtype=F64), pers, keys, 0.65)
    np.testing.assert_allclose(out.numpy(), exact[:, 0], atol=1e-9)


def test_sequential_empty_graph_and_nothing_reserved():
    empty = ppr_sequential_push(
        torch.zeros(2, 0, dtype=torch.int64),
        torch.zeros(0, dtype=F64),
        torch.zeros(0, dtype=torch.int64),
        torch.zeros(0, dtype=F64),
        num_nodes=0,
    )
    assert empty.shape == (0,)
    # Every key's weight below the threshold: nothing pushed, the original returns empty.
    out = ppr_sequential_push(
        torch.zeros(2, 0, dtype=torch.int64),
        torch.zeros(0, dtype=F64),
        torch.arange(4),
        torch.ones(4, dtype=F64),
        num_nodes=4,
        threshold=0.3,
    )
    assert out.shape == (0,)


def test_sequential_3000_nodes_is_fast():
    # The original's large benchmark graph: node i links to nodes 0..min(5, i+1) then itself.
    n = 3000
    src, dst = [], []
    for i in range(n):
        for j in range(min(5, i + 1)):
            src.append(i)
            dst.append(j)
        src.append(i)
        dst.append(i)
    keys = torch.arange(30)
    start = time.perf_counter()
    out = ppr_sequential_push(
        torch.tensor([src, dst]),
        torch.ones(len(src), dtype=F64),
        keys,
        keys.to(F64),
        num_nodes=n,
        damping=0.15,
        threshold=1e-4,
    )
    assert time.perf_counter() - start < 10.0
    assert abs(out.sum().item() - 1.0) < 1e-12


# ------------------------------------------------------------------------------------------
# Batched kernels vs the dense closed form and vs the sequential push
# ------------------------------------------------------------------------------------------


@SETTINGS
@given(graph=memory_graphs(), data=st.data())
def test_forward_push_within_its_certificate(graph, data):
    n, edge_index, weight, pers, key_mask = graph
    damping = data.draw(st.sampled_from([0.0, 0.15, 0.65, 0.9]))
    threshold = data.draw(st.sampled_from([1e-3, 1e-5, 1e-8]))
    op = build_transition(edge_index, weight, num_nodes=n)
    out, stats = ppr_forward_push(
        op, pers, key_mask=key_mask, damping=damping, threshold=threshold, return_stats=True
    )
    exact = closed_form(n, edge_index, weight, pers, key_mask, damping)
    assert stats.converged
    assert (out >= 0).all()
    sums = out.sum(0)
    reserved = stats.reserve_mass > 0
    assert torch.allclose(sums[reserved], torch.ones_like(sums[reserved]), atol=1e-12)
    assert (sums[~reserved] == 0).all()
    err = l1(out.numpy(), exact)
    bound = stats.error_bound.numpy()
    assert (err <= bound + 1e-12).all(), (err, bound)
    # A priori: final residues are each <= threshold.
    assert (stats.residue_mass <= threshold * n + 1e-15).all()

    # Against the sequential oracle, column by column: within the sum of both certificates.
    for b in range(pers.shape[1]):
        keys, bias = keys_of(pers, key_mask, b)
        seq, seq_stats = ppr_sequential_push(
            edge_index,
            weight,
            torch.tensor(keys),
            torch.tensor(bias, dtype=F64),
            num_nodes=n,
            damping=damping,
            threshold=threshold,
            return_stats=True,
        )
        if seq.numel() == 0:
            continue
        gap = l1(seq.numpy(), out[:, b].numpy())
        assert gap <= bound[b] + seq_stats.error_bound.item() + 1e-12


@SETTINGS
@given(graph=memory_graphs(), data=st.data())
def test_power_iteration_within_tolerance(graph, data):
    n, edge_index, weight, pers, key_mask = graph
    damping = data.draw(st.sampled_from([0.0, 0.15, 0.65, 0.9]))
    tol = data.draw(st.sampled_from([1e-3, 1e-6, 1e-10]))
    op = build_transition(edge_index, weight, num_nodes=n)
    out = ppr_power_iteration(op, pers, key_mask=key_mask, damping=damping, tol=tol)
    exact = closed_form(n, edge_index, weight, pers, key_mask, damping)
    assert (out >= 0).all()
    assert torch.allclose(out.sum(0), torch.ones(pers.shape[1], dtype=F64), atol=1e-12)
    # sum(x) >= 1 - d (x >= (1 - d) s), so 2 tol / sum(x) <= 2 tol / (1 - d).
    assert (l1(out.numpy(), exact) <= 2 * tol / (1 - damping) + 1e-12).all()
    # Fixed-step mode: the same iterate for the same K.
    steps = power_iteration_steps(damping, tol)
    same = ppr_power_iteration(op, pers, key_mask=key_mask, damping=damping, num_steps=steps)
    assert torch.equal(out, same)


def test_power_iteration_without_leaks_is_within_two_tol():
    # Every node has an out-edge with positive weight: sum(x) == 1, bound 2 tol.
    gen = torch.Generator().manual_seed(0)
    n = 200
    src = torch.arange(n).repeat_interleave(3)
    dst = torch.randint(0, n, (3 * n,), generator=gen)
    weight = torch.rand(3 * n, generator=gen, dtype=F64) + 0.1
    pers = torch.rand(n, 3, generator=gen, dtype=F64)
    edge_index = torch.stack([src, dst])
    op = build_transition(edge_index, weight, num_nodes=n)
    keys = torch.zeros(n, 3, dtype=torch.bool)
    exact = closed_form(n, edge_index, weight, pers, keys, 0.85)
    for tol in (1e-2, 1e-4, 1e-8):
        out = ppr_power_iteration(op, pers, damping=0.85, tol=tol)
        err = l1(out.numpy(), exact)
        assert (err <= 2 * tol).all()
    assert (err < 1e-7).all()


@SETTINGS
@given(graph=memory_graphs(max_queries=1), data=st.data())
def test_naive_matches_transcription(graph, data):
    n, edge_index, _, pers, key_mask = graph
    damping = data.draw(st.sampled_from([0.0, 0.15, 0.65]))
    nb_iter = data.draw(st.integers(0, 12))
    keys, bias = keys_of(pers, key_mask, 0)
    out = ppr_naive(
        edge_index, pers, num_nodes=n, damping=damping, nb_iter=nb_iter, key_mask=key_mask
    )
    ref = naive_reference(n, edge_index.T.tolist(), keys, bias, damping, nb_iter)
    np.testing.assert_allclose(out[:, 0].numpy(), ref, rtol=1e-12, atol=1e-15)


def test_naive_converges_to_unweighted_closed_form():
    # Without parallel edges no mass leaks, so the per-step normalization keeps the linear
    # fixed point: the naive iteration converges to the closed form with unit weights.
    gen = torch.Generator().manual_seed(1)
    n = 30
    pairs = torch.unique(torch.randint(0, n * n, (70,), generator=gen))
    edge_index = torch.stack([pairs // n, pairs % n])
    pers = torch.zeros(n, 2, dtype=F64)
    pers[3, 0] = 1.0
    pers[[5, 7], 1] = torch.tensor([0.2, 0.8], dtype=F64)
    out = ppr_naive(edge_index, pers, num_nodes=n, damping=0.65, nb_iter=200)
    keys = torch.zeros(n, 2, dtype=torch.bool)
    exact = closed_form(n, edge_index, torch.ones(pairs.shape[0], dtype=F64), pers, keys, 0.65)
    np.testing.assert_allclose(out.numpy(), exact, atol=1e-12)


# ------------------------------------------------------------------------------------------
# Batch independence, devices, edge cases
# ------------------------------------------------------------------------------------------


def random_graph(n: int, e: int, seed: int, device: torch.device):
    gen = torch.Generator().manual_seed(seed)
    src, _ = torch.sort(torch.randint(0, n, (e,), generator=gen))
    dst = torch.randint(0, n, (e,), generator=gen)
    weight = torch.rand(e, generator=gen, dtype=F64)
    weight[torch.rand(e, generator=gen) < 0.1] = 0.0  # e.g. Procedure targets
    pers = torch.zeros(n, 256, dtype=F64)
    for b in range(256):
        idx = torch.randint(0, n, (3,), generator=gen)
        pers[idx, b] = torch.rand(3, generator=gen, dtype=F64) + 0.01
    edge_index = torch.stack([src, dst]).to(device)
    return build_transition(edge_index, weight.to(device), num_nodes=n), pers.to(device)


def test_batch_of_256_equals_single_queries(device):
    op, pers = random_graph(300, 1200, seed=3, device=device)
    push, stats = ppr_forward_push(op, pers, threshold=1e-6, return_stats=True)
    power = ppr_power_iteration(op, pers, tol=1e-8)
    for b in (0, 17, 255):
        one_push, one_stats = ppr_forward_push(op, pers[:, b], threshold=1e-6, return_stats=True)
        one_power = ppr_power_iteration(op, pers[:, b], tol=1e-8)
        assert one_push.shape == (300,) and one_stats.error_bound.shape == ()
        if device.type == "cpu":
            assert torch.equal(one_push, push[:, b])
            assert torch.equal(one_stats.error_bound, stats.error_bound[b])
        else:  # atomics reorder float sums on CUDA: a push may flip at the threshold
            gap = (one_push - push[:, b]).abs().sum()
            assert gap <= one_stats.error_bound + stats.error_bound[b]
        torch.testing.assert_close(one_power, power[:, b], rtol=1e-12, atol=1e-15)


def test_devices_agree_with_cpu(device):
    op_cpu, pers = random_graph(200, 900, seed=5, device=torch.device("cpu"))
    op = op_cpu.to(device)
    assert op.device.type == device.type
    got, stats = ppr_forward_push(op, pers.to(device), threshold=1e-7, return_stats=True)
    ref, ref_stats = ppr_forward_push(op_cpu, pers, threshold=1e-7, return_stats=True)
    assert got.device.type == device.type and got.dtype == F64
    assert ((got.cpu() - ref).abs().sum(0) <= stats.error_bound.cpu() + ref_stats.error_bound).all()
    got = ppr_power_iteration(op, pers.to(device), tol=1e-9)
    assert got.device.type == device.type and got.dtype == F64
    torch.testing.assert_close(got.cpu(), ppr_power_iteration(op_cpu, pers, tol=1e-9))
    edge_index = torch.tensor([[0, 0, 1, 2], [1, 2, 2, 3]], device=device)
    pers4 = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64, device=device)
    got = ppr_naive(edge_index, pers4, num_nodes=4, damping=0.15, nb_iter=15)
    assert got.device.type == device.type
    ref = ppr_naive(edge_index.cpu(), pers4.cpu(), num_nodes=4, damping=0.15, nb_iter=15)
    torch.testing.assert_close(got.cpu(), ref)


def test_non_contiguous_personalization():
    op, pers = random_graph(60, 240, seed=11, device=torch.device("cpu"))
    pers_t = pers[:, :8].t().contiguous().t()  # same values, column-major strides
    assert not pers_t.is_contiguous()
    for fn in (ppr_forward_push, ppr_power_iteration):
        assert torch.equal(fn(op, pers_t), fn(op, pers[:, :8].contiguous()))


def test_damping_zero_returns_personalization():
    op, pers = random_graph(50, 200, seed=7, device=torch.device("cpu"))
    pers = pers[:, :5]
    s = pers / pers.sum(0)
    torch.testing.assert_close(ppr_power_iteration(op, pers, damping=0.0), s, rtol=1e-15, atol=0)
    torch.testing.assert_close(ppr_forward_push(op, pers, damping=0.0, threshold=1e-9), s)
    assert power_iteration_steps(0.0, 1e-6) == 0


def test_subnormal_personalization_does_not_overflow():
    op, _ = random_graph(20, 60, seed=4, device=torch.device("cpu"))
    pers = torch.zeros(20, 2, dtype=F64)
    pers[3, 0] = 2.2e-311
    pers[[4, 5], 1] = 1e-310
    for fn in (ppr_forward_push, ppr_power_iteration):
        out = fn(op, pers)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.sum(0), torch.ones(2, dtype=F64))


def test_power_iteration_steps_certify():
    for d in (0.15, 0.5, 0.65, 0.9, 0.99):
        for tol in (1e-1, 1e-5, 1e-12):
            k = power_iteration_steps(d, tol)
            assert d ** (k + 1) <= tol and (k == 0 or d**k > tol)
    assert power_iteration_steps(0.5, 0.25) == 1
    assert power_iteration_steps(0.5, 2.0) == 0


def test_empty_graph_and_empty_batch():
    op = build_transition(
        torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0, dtype=F64), num_nodes=0
    )
    for fn in (ppr_forward_push, ppr_power_iteration):
        assert fn(op, torch.zeros(0, 3, dtype=F64)).shape == (0, 3)
    op, pers = random_graph(10, 20, seed=1, device=torch.device("cpu"))
    assert ppr_forward_push(op, pers[:, :0]).shape == (10, 0)
    assert ppr_power_iteration(op, pers[:, :0]).shape == (10, 0)


def test_push_zero_column_when_nothing_reserved():
    op, _ = random_graph(10, 20, seed=1, device=torch.device("cpu"))
    pers = torch.zeros(10, 2, dtype=F64)
    pers[:, 0] = 1.0  # ten keys of 0.1 each, all <= threshold 0.2
    pers[0, 1] = 1.0
    out, stats = ppr_forward_push(op, pers, threshold=0.2, return_stats=True)
    assert (out[:, 0] == 0).all() and stats.reserve_mass[0] == 0
    assert math.isinf(stats.error_bound[0].item())
    assert out[:, 1].sum().item() == pytest.approx(1.0)


def test_push_round_cap():
    op, pers = random_graph(100, 400, seed=2, device=torch.device("cpu"))
    out, stats = ppr_forward_push(op, pers[:, :4], threshold=1e-12, max_rounds=2, return_stats=True)
    assert stats.iterations == 2 and not stats.converged
    assert torch.isfinite(out).all()


def test_transition_operator():
    edge_index = torch.tensor([[2, 0, 0, 0, 1], [0, 1, 1, 0, 3]])  # unsorted, parallel, loop
    weight = torch.tensor([1.0, 1.0, 2.0, 1.0, 0.0], dtype=F64)
    op = build_transition(edge_index, weight, num_nodes=4)
    assert isinstance(op, TransitionOperator)
    assert op.rowptr.tolist() == [0, 3, 4, 5, 5]
    assert op.col.tolist() == [1, 1, 0, 3, 0]  # stable within a source
    assert op.weight.tolist() == [0.25, 0.5, 0.25, 0.0, 1.0]
    assert op.out_degree.tolist() == [3, 1, 1, 0]
    assert op.max_weight.tolist() == [0.5, 0.0, 1.0, 0.0]
    assert op.dangling_index.tolist() == [3]
    dense_t = op.transpose.to_dense()
    expected = torch.zeros(4, 4, dtype=F64)
    expected[1, 0] = 0.75  # parallel edges merged
    expected[0, 0] = 0.25
    expected[0, 2] = 1.0
    assert torch.equal(dense_t, expected)
    assert op.num_edges == 5


# ------------------------------------------------------------------------------------------
# Bad inputs: clear errors, never a hang
# ------------------------------------------------------------------------------------------

ONE_EDGE = torch.tensor([[0], [1]])


def seq(**kw):
    args = {
        "num_nodes": 2,
        "damping": 0.65,
        "threshold": 1e-5,
    }
    args.update(kw)
    index = args.pop("index", torch.tensor([0]))
    weight = args.pop("weight", torch.tensor([1.0], dtype=F64))
    return ppr_sequential_push(ONE_EDGE, torch.ones(1, dtype=F64), index, weight, **args)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"damping": 1.0}, "damping"),
        ({"damping": -0.1}, "damping"),
        ({"damping": float("nan")}, "damping"),
        ({"damping": "high"}, "damping"),
        ({"threshold": 0.0}, "threshold"),
        ({"threshold": -1e-5}, "threshold"),
        ({"threshold": float("inf")}, "threshold"),
        ({"threshold": float("nan")}, "threshold"),
        ({"max_iterations": -1}, "max_iterations"),
        ({"num_nodes": -1}, "num_nodes"),
        ({"index": torch.zeros(0, dtype=torch.int64), "weight": torch.zeros(0, dtype=F64)}, "sum"),
        ({"weight": torch.tensor([0.0], dtype=F64)}, "positive sum"),
        ({"weight": torch.tensor([float("nan")], dtype=F64)}, "finite"),
        ({"weight": torch.tensor([-1.0], dtype=F64)}, ">= 0"),
        ({"index": torch.tensor([5])}, r"\[0, 2\)"),
        ({"index": torch.tensor([1, 1]), "weight": torch.ones(2, dtype=F64)}, "distinct"),
        ({"weight": torch.ones(2, dtype=F64)}, "shape"),
    ],
)
def test_sequential_rejects(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        seq(**kwargs)


def test_sequential_rejects_bad_edges():
    with pytest.raises(ValidationError, match="edge_weight"):
        ppr_sequential_push(
            ONE_EDGE,
            torch.tensor([float("nan")], dtype=F64),
            torch.tensor([0]),
            torch.ones(1, dtype=F64),
            num_nodes=2,
        )
    with pytest.raises(ValidationError, match="edge_index"):
        ppr_sequential_push(
            torch.tensor([[0], [7]]),
            torch.ones(1, dtype=F64),
            torch.tensor([0]),
            torch.ones(1, dtype=F64),
            num_nodes=2,
        )


@pytest.mark.parametrize("kernel", ["push", "power", "naive"])
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"damping": 1.0}, "damping"),
        ({"damping": -0.5}, "damping"),
        ({"damping": float("nan")}, "damping"),
        ({"pers": torch.zeros(2, 1, dtype=F64)}, "positive sum"),
        ({"pers": torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=F64)}, "column 1"),
        ({"pers": torch.tensor([[float("nan")], [1.0]], dtype=F64)}, "finite"),
        ({"pers": torch.tensor([[float("inf")], [1.0]], dtype=F64)}, "finite"),
        ({"pers": torch.tensor([[-1.0], [2.0]], dtype=F64)}, ">= 0"),
        ({"pers": torch.ones(3, 1, dtype=F64)}, "shape"),
        ({"key_mask": torch.ones(2, 1)}, "bool"),
        ({"key_mask": torch.ones(2, 2, dtype=torch.bool)}, "shape"),
    ],
)
def test_batched_reject(kernel, kwargs, match):
    kwargs = dict(kwargs)
    pers = kwargs.pop("pers", torch.tensor([[1.0], [0.0]], dtype=F64))
    kwargs.setdefault("damping", 0.65)
    with pytest.raises(ValidationError, match=match):
        if kernel == "naive":
            ppr_naive(ONE_EDGE, pers, num_nodes=2, nb_iter=5, **kwargs)
        else:
            op = build_transition(ONE_EDGE, torch.ones(1, dtype=F64), num_nodes=2)
            fn = ppr_forward_push if kernel == "push" else ppr_power_iteration
            fn(op, pers, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"threshold": 0.0}, "threshold"),
        ({"threshold": float("nan")}, "threshold"),
        ({"max_rounds": 0}, "max_rounds"),
    ],
)
def test_push_rejects(kwargs, match):
    op = build_transition(ONE_EDGE, torch.ones(1, dtype=F64), num_nodes=2)
    with pytest.raises(ValidationError, match=match):
        ppr_forward_push(op, torch.tensor([1.0, 0.0], dtype=F64), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tol": 0.0}, "tol"),
        ({"tol": -1.0}, "tol"),
        ({"tol": float("nan")}, "tol"),
        ({"num_steps": -1}, "num_steps"),
        ({"num_steps": 2.5}, "num_steps"),
        ({"tol": 1e-3, "num_steps": 3}, "at most one"),
    ],
)
def test_power_rejects(kwargs, match):
    op = build_transition(ONE_EDGE, torch.ones(1, dtype=F64), num_nodes=2)
    with pytest.raises(ValidationError, match=match):
        ppr_power_iteration(op, torch.tensor([1.0, 0.0], dtype=F64), **kwargs)


def test_operator_rejects():
    with pytest.raises(ValidationError, match=">= 0"):
        build_transition(ONE_EDGE, torch.tensor([-1.0], dtype=F64), num_nodes=2)
    with pytest.raises(ValidationError, match="finite"):
        build_transition(ONE_EDGE, torch.tensor([float("inf")], dtype=F64), num_nodes=2)
    with pytest.raises(ValidationError, match=r"\(2, E\)"):
        build_transition(
            torch.zeros(3, 1, dtype=torch.int64), torch.ones(1, dtype=F64), num_nodes=2
        )
    with pytest.raises(ValidationError, match="TransitionOperator"):
        ppr_forward_push(ONE_EDGE, torch.tensor([1.0, 0.0], dtype=F64))
    with pytest.raises(ValidationError, match="nb_iter"):
        ppr_naive(
            ONE_EDGE, torch.tensor([1.0, 0.0], dtype=F64), num_nodes=2, damping=0.5, nb_iter=-1
        )
