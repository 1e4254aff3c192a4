"""The benchmark harness solves the problem it claims to: generators, reference, peer mapping.

``benchmarks/_graphs.py`` builds the graphs and the float64 reference; ``benchmarks/_peers.py``
maps each peer onto the same weighted PPR. These checks keep the benchmark's error columns honest:
if a peer adapter drifted to a different problem, its "error" would measure the adapter.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks import _graphs, _peers
from soulmem_torch.functional.ppr import build_transition, ppr_power_iteration


def test_original_edges_follow_the_original_benchmark() -> None:
    e = _graphs.original_edges(20)
    assert e.shape[1] == sum(min(10, i + 1) + 1 for i in range(20))
    row3 = e[1, e[0] == 3].tolist()
    assert row3 == [0, 1, 2, 3, 3]  # the first min(10, i + 1) nodes, then the self loop
    big = _graphs.original_edges(1001)
    assert big[1, big[0] == 1000].tolist() == [0, 1, 2, 3, 4, 1000]  # 5 beyond 1000 nodes


def test_barabasi_albert_has_the_requested_dangling_share() -> None:
    e = _graphs.barabasi_albert_edges(4000, 5, dangling=0.05, seed=3)
    out = torch.bincount(e[0], minlength=4000)
    assert 0.03 < float((out == 0).float().mean()) < 0.07
    assert e.shape[1] > 0.9 * 0.95 * 5 * 3995


def test_chung_lu_edges_in_range_and_heavy_tailed() -> None:
    e = _graphs.chung_lu_edges(5000, 50_000, seed=1)
    assert e.shape == (2, 50_000) and int(e.min()) >= 0 and int(e.max()) < 5000
    deg = torch.bincount(e[0], minlength=5000)
    assert int(deg.max()) > 20 * float(deg.float().mean())


@pytest.fixture(scope="module")
def case() -> _graphs.PprCase:
    pytest.importorskip("scipy")
    return _graphs.make_case("ba", _graphs.barabasi_albert_graph(600, 4, seed=2), 6)


def test_reference_direct_and_power_agree(case: _graphs.PprCase) -> None:
    g = case.graph
    assert int((torch.bincount(g.edge_index[0], minlength=g.num_nodes) == 0).sum()) > 0
    power = _graphs.reference_power(g.edge_index, case.edge_weight, case.personalization,
                                    num_nodes=case.num_nodes)  # fmt: skip
    assert float(_graphs.l1_error(power, case.reference).max()) < 1e-11


def test_library_power_iteration_matches_the_reference(case: _graphs.PprCase) -> None:
    g = case.graph
    op = build_transition(g.edge_index, case.edge_weight, num_nodes=case.num_nodes)
    x = ppr_power_iteration(op, case.personalization, tol=1e-12)
    assert case.error(x)["l1_max"] < 1e-10 and case.error(x)["top20"] == 1.0


def test_scipy_peer_is_the_same_iteration(case: _graphs.PprCase) -> None:
    x = _peers.scipy_run(_peers.scipy_prepare(case), 80)
    assert case.error(x)["l1_max"] < 1e-12


def test_igraph_peer_solves_the_same_problem(case: _graphs.PprCase) -> None:
    pytest.importorskip("igraph")
    x = _peers.igraph_run(_peers.igraph_prepare(case))
    assert case.error(x)["l1_max"] < 1e-8


def test_networkx_peer_solves_the_same_problem(case: _graphs.PprCase) -> None:
    pytest.importorskip("networkx")
    x = _peers.networkx_run(_peers.networkx_prepare(case), 1e-12)
    assert case.error(x)["l1_max"] < 1e-7


def test_pyg_peer_matches_its_own_problem(case: _graphs.PprCase) -> None:
    pytest.importorskip("numba")
    x = _peers.pyg_run(_peers.pyg_prepare(case), 1e-7)
    own = _peers.pyg_own_reference(case, case.batch)
    assert float(_graphs.l1_error(x, own).max()) < 1e-3
    assert case.error(x)["l1_max"] > 1e-3  # unweighted: a different problem, as documented


def test_topk_overlap_ignores_ties_among_zeros() -> None:
    ref = torch.tensor([[0.5], [0.3], [0.2], [0.0], [0.0]], dtype=torch.float64)
    x = torch.tensor([[0.5], [0.3], [0.2], [1e-9], [0.0]], dtype=torch.float64)
    assert float(_graphs.topk_overlap(x, ref, k=4)[0]) == 1.0
