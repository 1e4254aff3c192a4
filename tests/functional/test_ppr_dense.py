"""Exact dense PPR (``ppr_dense``): against the power iteration at tol 1e-14 and a numpy closed
form with the dangling rule folded in; batch and zero-padding invariance bit for bit; the
factor cache; empty graphs, damping 0 and every bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.ppr import build_transition, ppr_power_iteration
from soulmem_torch.functional.ppr_dense import (
    DenseFactors,
    dense_factors,
    dense_ppr_entries,
    ppr_dense,
)
from tests.functional.test_ppr import closed_form as closed_form_with_weights
from tests.functional.test_ppr import memory_graphs

F64 = torch.float64
DAMPINGS = [0.15, 0.65, 0.9]


# ------------------------------------------------------------------------------------------
# Graphs and the reference
# ------------------------------------------------------------------------------------------


def awkward_graph(n: int, e: int, seed: int, batch: int = 6):
    """A random graph with every awkward feature: dangling nodes (the last three), zero-weight
    edges, self loops, parallel edges, a node whose out-weights all are 0 (node 0: its mass
    leaks), keys with weight 0 (``key_mask`` only), a dangling key; ``(edge_index, weight,
    personalization (n, batch), key_mask (n, batch))`` on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    live = n - 3  # nodes n-3 .. n-1 have no out-edge
    src = torch.randint(0, live, (e,), generator=gen)
    dst = torch.randint(0, n, (e,), generator=gen)
    loops = torch.arange(1, live, 4)
    src = torch.cat([src, loops, src[:5], torch.tensor([0, 0])])  # self loops, parallels
    dst = torch.cat([dst, loops, dst[:5], torch.tensor([1, 2])])
    weight = torch.rand(src.numel(), generator=gen, dtype=F64) + 0.05
    weight[torch.rand(src.numel(), generator=gen) < 0.15] = 0.0  # e.g. Procedure targets
    weight[src == 0] = 0.0  # a row whose weights all are 0
    perm = torch.randperm(src.numel(), generator=gen)  # any edge order
    edge_index = torch.stack([src[perm], dst[perm]])
    weight = weight[perm]
    pers = torch.zeros(n, batch, dtype=F64)
    key_mask = torch.zeros(n, batch, dtype=torch.bool)
    for b in range(batch):
        k = int(torch.randint(1, 5, (1,), generator=gen))
        idx = torch.randperm(n, generator=gen)[:k]
        pers[idx, b] = torch.rand(k, generator=gen, dtype=F64) + 0.01
        extra = torch.randperm(n, generator=gen)[:2]
        key_mask[extra, b] = pers[extra, b] == 0  # zero-weight keys
    pers[n - 1, 0] = 0.5  # a dangling key
    pers[0, 1] = 0.7  # the leaking node as a key
    key_mask[n - 2, 2] = pers[n - 2, 2] == 0  # a dangling zero-weight key
    return edge_index, weight, pers, key_mask


def numpy_reference(n, edge_index, weight, pers, key_mask, damping):
    """``x = (1 - d) (I - d P_s^T)^-1 s`` per column, normalized, where ``P_s`` is ``P`` (rows
    normalized, a zero row stays zero) with each dangling row (no out-edge at all) replaced by
    the uniform distribution over the query's keys."""
    src, dst = edge_index.cpu().numpy()
    mat = np.zeros((n, n))
    np.add.at(mat, (src, dst), weight.cpu().numpy())
    rows = mat.sum(1, keepdims=True)
    trans = np.divide(mat, rows, out=np.zeros_like(mat), where=rows != 0)
    dangling = np.bincount(src, minlength=n) == 0
    p = pers.cpu().numpy().reshape(n, -1)
    keys = (p != 0) | key_mask.cpu().numpy().reshape(n, -1)
    out = np.zeros_like(p)
    for b in range(p.shape[1]):
        ps = trans.copy()
        ps[dangling] = keys[:, b] / keys[:, b].sum()
        s = p[:, b] / p[:, b].sum()
        x = np.linalg.solve(np.eye(n) - damping * ps.T, (1.0 - damping) * s)
        out[:, b] = x / x.sum()
    return out


def l1(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b).sum(0)


def assert_same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal bits on the CPU; within 1e-15 on CUDA, whose ``index_add_`` adds in any order."""
    if a.device.type == "cpu":
        assert torch.equal(a, b)
    else:
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15)


# ------------------------------------------------------------------------------------------
# Accuracy
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("damping", DAMPINGS)
@pytest.mark.parametrize("n, e, seed", [(12, 30, 0), (40, 120, 1), (97, 400, 2)])
def test_equals_power_iteration_and_closed_form(device, n, e, seed, damping):
    edge_index, weight, pers, key_mask = awkward_graph(n, e, seed)
    op = build_transition(edge_index.to(device), weight.to(device), num_nodes=n)
    assert set(range(n - 3, n)) <= set(op.dangling_index.tolist())
    got = ppr_dense(op, pers.to(device), key_mask=key_mask.to(device), damping=damping)
    assert got.dtype == F64 and got.device.type == device.type and got.shape == (n, 6)
    power = ppr_power_iteration(
        op, pers.to(device), key_mask=key_mask.to(device), damping=damping, tol=1e-14
    )
    exact = numpy_reference(n, edge_index, weight, pers, key_mask, damping)
    got_np = got.cpu().numpy()
    assert (got_np >= -1e-16).all()
    np.testing.assert_allclose(got_np.sum(0), 1.0, atol=1e-13)
    assert (l1(got_np, power.cpu().numpy()) <= 1e-12).all()
    assert (l1(got_np, exact) <= 1e-12).all()
    # the zero-weight keys matter: without them the dangling mass goes elsewhere
    bare = ppr_dense(op, pers.to(device), damping=damping).cpu().numpy()
    assert (l1(bare, numpy_reference(n, edge_index, weight, pers, key_mask & False, damping))
            <= 1e-12).all()  # fmt: skip
    assert l1(bare[:, 2:3], got_np[:, 2:3])[0] > 1e-6


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(graph=memory_graphs(), damping=st.sampled_from([0.0, 0.15, 0.65, 0.9, 0.99]))
def test_typed_memory_graphs_equal_closed_form(graph, damping):
    """The dynamic edge weights of random typed memory graphs (Procedure targets give zero
    weights and zero rows)."""
    n, edge_index, weight, pers, key_mask = graph
    op = build_transition(edge_index, weight, num_nodes=n)
    got = ppr_dense(op, pers, key_mask=key_mask, damping=damping).numpy()
    exact = closed_form_with_weights(n, edge_index, weight, pers, key_mask, damping)
    # (I - d P_s^T) has condition number up to ~2 / (1 - d): 200 at d = 0.99
    assert (l1(got, exact) <= 1e-12 / (1.0 - damping)).all()


def test_one_dimensional_input_gives_one_dimensional_output(device):
    edge_index, weight, pers, key_mask = awkward_graph(20, 60, seed=3)
    op = build_transition(edge_index.to(device), weight.to(device), num_nodes=20)
    out = ppr_dense(op, pers[:, 2].to(device), key_mask=key_mask[:, 2].to(device))
    assert out.shape == (20,) and out.dtype == F64
    batch = ppr_dense(op, pers.to(device), key_mask=key_mask.to(device))
    torch.testing.assert_close(out, batch[:, 2], rtol=0, atol=1e-15)
    # a float32 personalization on another device is accepted (widened, moved)
    out32 = ppr_dense(op, pers[:, 2].float(), key_mask=key_mask[:, 2])
    assert out32.shape == (20,) and out32.device.type == device.type


# ------------------------------------------------------------------------------------------
# Bit-identical layouts
# ------------------------------------------------------------------------------------------


def test_batch_invariance_is_bit_identical(device):
    edge_index, weight, pers, key_mask = awkward_graph(60, 200, seed=4, batch=16)
    op = build_transition(edge_index.to(device), weight.to(device), num_nodes=60)
    pers, key_mask = pers.to(device), key_mask.to(device)
    batch = ppr_dense(op, pers, key_mask=key_mask)
    for b in range(16):
        one = ppr_dense(op, pers[:, b], key_mask=key_mask[:, b])
        col = ppr_dense(op, pers[:, b : b + 1], key_mask=key_mask[:, b : b + 1])
        pair = ppr_dense(op, pers[:, [b, 0]], key_mask=key_mask[:, [b, 0]])
        assert_same_bits(one, batch[:, b])
        assert_same_bits(col[:, 0], batch[:, b])
        assert_same_bits(pair[:, 0], batch[:, b])


def _entries(op, pers, key_mask, damping, width=None):
    """``dense_ppr_entries`` inputs as ``ppr_dense`` builds them, rows zero-padded to
    ``width``."""
    f = dense_factors(op, damping)
    keys = (pers != 0) | key_mask
    col, node = keys.T.nonzero(as_tuple=True)
    rows = f.inverse_t.index_select(0, node)
    if width is not None:
        rows = torch.cat([rows, rows.new_zeros(rows.shape[0], width - rows.shape[1])], 1)
    return rows, f.dangling_mass.index_select(0, node), pers[node, col], col


def test_zero_padded_entries_give_the_same_bits(device):
    n, b = 30, 8
    edge_index, weight, pers, key_mask = awkward_graph(n, 90, seed=5, batch=b)
    op = build_transition(edge_index.to(device), weight.to(device), num_nodes=n)
    pers, key_mask = pers.to(device), key_mask.to(device)
    rows, mass, w, q = _entries(op, pers, key_mask, 0.65)
    plain = dense_ppr_entries(rows, mass, w, q, num_queries=b, damping=0.65)
    assert plain.shape == (b, n)
    assert_same_bits(plain.T.contiguous(), ppr_dense(op, pers, key_mask=key_mask))
    for width in (n + 1, n + 17, 3 * n):
        rows, mass, w, q = _entries(op, pers, key_mask, 0.65, width)
        padded = dense_ppr_entries(rows, mass, w, q, num_queries=b, damping=0.65)
        assert padded.shape == (b, width)
        assert bool((padded[:, n:] == 0).all())
        assert_same_bits(padded[:, :n], plain)


def test_entries_with_scratch_rows_give_the_same_bits(device):
    """``scratch=True`` scales the caller's rows in place: the same result, bit for bit, and
    the rows are what it says they become (each scaled by its entry's share)."""
    n, b = 30, 8
    edge_index, weight, pers, key_mask = awkward_graph(n, 90, seed=7, batch=b)
    op = build_transition(edge_index.to(device), weight.to(device), num_nodes=n)
    pers, key_mask = pers.to(device), key_mask.to(device)
    rows, mass, w, q = _entries(op, pers, key_mask, 0.65)
    kept = rows.clone()
    plain = dense_ppr_entries(rows, mass, w, q, num_queries=b, damping=0.65)
    assert_same_bits(rows, kept)  # (not scratch: the rows are left as they were)
    spent = dense_ppr_entries(rows, mass, w, q, num_queries=b, damping=0.65, scratch=True)
    assert_same_bits(spent, plain)
    assert not torch.equal(rows, kept)


def test_entries_without_weight_or_entries_give_zero_rows():
    edge_index, weight, pers, key_mask = awkward_graph(15, 40, seed=6, batch=3)
    op = build_transition(edge_index, weight, num_nodes=15)
    rows, mass, w, q = _entries(op, pers, key_mask, 0.5)
    keep = q != 1
    out = dense_ppr_entries(
        rows[keep], mass[keep], torch.where(q[keep] == 2, 0.0, w[keep]), q[keep],
        num_queries=4, damping=0.5,
    )  # fmt: skip
    assert out.shape == (4, 15)
    assert bool((out[1:] == 0).all())  # no entry (1), weights all 0 (2), absent (3)
    torch.testing.assert_close(out[0].sum(), torch.tensor(1.0, dtype=F64))


# ------------------------------------------------------------------------------------------
# Edge cases
# ------------------------------------------------------------------------------------------


def test_empty_graph_and_empty_batch(device):
    op = build_transition(
        torch.zeros(2, 0, dtype=torch.int64, device=device),
        torch.zeros(0, dtype=F64, device=device),
        num_nodes=0,
    )
    assert ppr_dense(op, torch.zeros(0, 3, dtype=F64)).shape == (0, 3)
    assert ppr_dense(op, torch.zeros(0, dtype=F64)).shape == (0,)
    f = dense_factors(op, 0.65)
    assert f.inverse_t.shape == (0, 0) and f.dangling_mass.shape == (0,)
    edge_index, weight, pers, _ = awkward_graph(10, 20, seed=1)
    op = build_transition(edge_index.to(device), weight.to(device), num_nodes=10)
    assert ppr_dense(op, pers[:, :0]).shape == (10, 0)


def test_graph_without_edges_keeps_every_mass_on_the_keys():
    # every node dangling: a query's mass goes back to its keys, evenly; the restart puts s
    op = build_transition(torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0, dtype=F64),
                          num_nodes=5)  # fmt: skip
    pers = torch.tensor([0.0, 3.0, 1.0, 0.0, 0.0], dtype=F64)
    d = 0.65
    got = ppr_dense(op, pers, damping=d)
    # x = (1-d) s + d * sum(x) / 2 on the two keys
    want = torch.tensor([0.0, (1 - d) * 0.75 + d / 2, (1 - d) * 0.25 + d / 2, 0.0, 0.0],
                        dtype=F64)  # fmt: skip
    torch.testing.assert_close(got, want, rtol=0, atol=1e-15)


def test_damping_zero_returns_the_normalized_personalization(device):
    edge_index, weight, pers, key_mask = awkward_graph(25, 70, seed=7)
    op = build_transition(edge_index.to(device), weight.to(device), num_nodes=25)
    got = ppr_dense(op, pers.to(device), key_mask=key_mask.to(device), damping=0.0)
    s = pers / pers.sum(0)
    torch.testing.assert_close(got.cpu(), s, rtol=1e-15, atol=1e-300)
    f = dense_factors(op, 0.0)
    assert torch.equal(f.inverse_t.cpu(), torch.eye(25, dtype=F64))


# ------------------------------------------------------------------------------------------
# The factor cache
# ------------------------------------------------------------------------------------------


def test_dense_factors_are_cached_per_damping(device):
    edge_index, weight, pers, key_mask = awkward_graph(18, 50, seed=8)
    op = build_transition(edge_index.to(device), weight.to(device), num_nodes=18)
    assert op.cache == {}
    first = dense_factors(op, 0.65)
    assert isinstance(first, DenseFactors) and first.damping == 0.65
    assert first.inverse_t.shape == (18, 18) and first.dangling_mass.shape == (18,)
    assert first.inverse_t.device.type == device.type
    assert dense_factors(op, 0.65) is first
    assert dense_factors(op, 0.65, cache=False) is first  # reuses an existing entry
    assert len(op.cache) == 1
    # ppr_dense reads the cached factors (and stores those of a new damping)
    pers, key_mask = pers.to(device), key_mask.to(device)
    out = ppr_dense(op, pers, key_mask=key_mask, damping=0.65)
    assert len(op.cache) == 1
    assert_same_bits(out, ppr_dense(op, pers, key_mask=key_mask, damping=0.65, factors=first))
    ppr_dense(op, pers, key_mask=key_mask, damping=0.3)
    assert len(op.cache) == 2 and dense_factors(op, 0.3) is not first
    # cache=False computes without storing
    fresh = build_transition(edge_index.to(device), weight.to(device), num_nodes=18)
    loose = dense_factors(fresh, 0.65, cache=False)
    assert fresh.cache == {}
    assert_same_bits(loose.inverse_t, first.inverse_t)
    assert_same_bits(loose.dangling_mass, first.dangling_mass)
    assert dense_factors(fresh, 0.65, cache=False) is not loose
    # factors computed elsewhere are accepted (same bits as the cached ones)
    assert_same_bits(ppr_dense(fresh, pers, key_mask=key_mask, damping=0.65, factors=loose), out)
    assert fresh.cache == {}
    # .to() does not carry the cache
    moved = op.to(device)
    assert moved is not op and moved.cache == {} and len(op.cache) == 2
    assert dense_factors(moved, 0.65) is not first


def test_dangling_mass_is_the_inverse_on_the_dangling_rows():
    edge_index, weight, _, _ = awkward_graph(16, 40, seed=9)
    op = build_transition(edge_index, weight, num_nodes=16)
    f = dense_factors(op, 0.8, cache=False)
    a = torch.eye(16, dtype=F64) - 0.8 * op.transpose.to_dense()
    torch.testing.assert_close(f.inverse_t.T @ a, torch.eye(16, dtype=F64), rtol=0, atol=1e-12)
    want = f.inverse_t[:, op.dangling_index].sum(1)
    torch.testing.assert_close(f.dangling_mass, want, rtol=1e-14, atol=1e-15)


# ------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------


def test_rejects_bad_input():
    edge_index, weight, pers, key_mask = awkward_graph(10, 30, seed=10, batch=3)
    op = build_transition(edge_index, weight, num_nodes=10)

    def bad(p):
        q = pers.clone()
        q[p[0], p[1]] = p[2]
        return q

    cases = [
        (dict(personalization=bad((2, 1, -0.5))), r"personalization: expected entries >= 0"),
        (dict(personalization=bad((3, 0, float("nan")))), r"personalization: expected finite"),
        (dict(personalization=bad((3, 0, float("inf")))), r"personalization: expected finite"),
        (dict(personalization=bad((slice(None), 1, 0.0))), r"personalization: .*positive sum"),
        (dict(personalization=pers[:9]), r"personalization: expected shape \(10,\)"),
        (dict(personalization=pers.bool()), "personalization: expected a real tensor"),
        (dict(key_mask=key_mask[:, :2]), r"key_mask: expected shape \(10, 3\)"),
        (dict(key_mask=key_mask[:, 0]), r"key_mask: expected shape \(10, 3\)"),
        (dict(key_mask=key_mask.float()), "key_mask: expected a bool tensor"),
        (dict(damping=1.0), "damping"),
        (dict(damping=-0.1), "damping"),
        (dict(damping=float("nan")), "damping"),
        (dict(damping="high"), "damping"),
        (dict(factors=dense_factors(op, 0.5, cache=False)), r"factors: .*damping 0\.65"),
    ]
    for kwargs, match in cases:
        args = {"personalization": pers, "key_mask": key_mask, "damping": 0.65, **kwargs}
        p = args.pop("personalization")
        with pytest.raises(ValidationError, match=match):
            ppr_dense(op, p, **args)
    small = build_transition(torch.tensor([[0], [1]]), torch.ones(1, dtype=F64), num_nodes=3)
    with pytest.raises(ValidationError, match=r"factors: .*size 10"):
        ppr_dense(op, pers, factors=dense_factors(small, 0.65, cache=False))
    with pytest.raises(ValidationError, match="operator: expected a TransitionOperator"):
        ppr_dense(object(), pers)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="operator"):
        dense_factors(object(), 0.65)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="damping"):
        dense_factors(op, 1.0)
    assert op.cache == {}  # nothing cached by the failed calls
    # validate=False skips the personalization checks (trusted input)
    out = ppr_dense(op, pers, key_mask=key_mask, validate=False)
    assert torch.equal(out, ppr_dense(op, pers, key_mask=key_mask))


def test_dense_factors_of_many_graphs_equal_each_graphs_bit_for_bit(monkeypatch):
    import importlib

    from soulmem_torch.functional.ppr_dense import dense_factors_many

    module = importlib.import_module("soulmem_torch.functional.ppr_dense")
    monkeypatch.setattr(module, "_BATCH_FLOATS", 3 * 18 * 18)  # cut into batches
    ops = []
    for seed, n in enumerate([18, 7, 18, 18, 1, 18, 7, 18, 18, 0, 30]):
        if n < 5:  # a lone node, an empty graph
            edge_index, weight = torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0, dtype=F64)
        else:
            edge_index, weight, _, _ = awkward_graph(n, 3 * n, seed=seed)
        ops.append(build_transition(edge_index, weight, num_nodes=n))
    cached = dense_factors(ops[3], 0.7)  # already cached: reused as it is
    many = dense_factors_many(ops, 0.7, cache=False)
    assert many[3] is cached
    assert all(op.cache == {} for k, op in enumerate(ops) if k != 3)
    for op, got in zip(ops, many):
        want = dense_factors(op, 0.7, cache=False)
        assert got.damping == want.damping == 0.7
        assert_same_bits(got.inverse_t, want.inverse_t)
        assert_same_bits(got.dangling_mass, want.dangling_mass)
    stored = dense_factors_many(ops, 0.7)
    assert all(dense_factors(op, 0.7) is f for op, f in zip(ops, stored))
