"""The `auto` tree: the choice follows the cost curve (a GPU-like flat curve keeps the big tree, a
CPU-like steep one keeps a small one), stays rank-closed, its expected length is exact for sub-trees,
and a run calibrates once, then reuses its choice."""
import torch

from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees import auto as tree_auto
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding.trees.specs import NAIVE_EXTEND_57, TreeSpec
from lantern_core.decoding.cost_curve import CostCurve
from lantern_core.decoding.trees.auto import choose_subtree, measure_costs, node_rates
from tests.tiny_models import TINY_C2I, random_drafter, random_gpt


def geometric_rates(tree: TreeSpec, accept=0.6):
    """P(node on the path) when each sibling attempt succeeds with `accept`: a proper profile (the rates of a
    node's children sum to at most its own)."""
    rates = {}
    for p in tree.paths:
        rate = 1.0
        for rank in p:
            rate *= accept * (1 - accept) ** rank
        rates[p] = rate
    return rates


def test_flat_costs_keep_the_whole_tree_and_steep_costs_a_small_one():
    rates = geometric_rates(NAIVE_EXTEND_57)
    gpu = CostCurve(((1, 1.0), (64, 1.05)), draft_s=0.01)
    cpu = CostCurve(((1, 1.0), (2, 1.3), (4, 1.7), (8, 2.6), (16, 3.0), (32, 3.7), (64, 5.2)), draft_s=0.35)
    big, _ = choose_subtree(NAIVE_EXTEND_57, rates, gpu)
    small, _ = choose_subtree(NAIVE_EXTEND_57, rates, cpu)
    assert big.num_nodes >= 50
    assert 1 <= small.num_nodes <= 12
    for tree in (big, small):  # TreeSpec validates prefix- and rank-closure; every node comes from the base
        assert set(tree.paths) <= set(NAIVE_EXTEND_57.paths)


def test_the_chosen_rate_is_expected_tokens_over_time():
    rates = geometric_rates(NAIVE_EXTEND_57)
    curve = CostCurve(((1, 1.0), (64, 2.0)), draft_s=0.1)
    tree, rate = choose_subtree(NAIVE_EXTEND_57, rates, curve)
    expected = 1 + sum(rates[p] for p in tree.paths)
    assert abs(rate - expected / (curve.verify(tree.num_nodes + 1) + tree.depth * 0.1)) < 1e-9


def test_node_rates_follow_the_buffer_order():
    counts = [10] + list(range(1, NAIVE_EXTEND_57.num_nodes + 1))
    rates = node_rates(NAIVE_EXTEND_57, counts, 10)
    assert rates[NAIVE_EXTEND_57.paths[0]] == 0.1 and rates[NAIVE_EXTEND_57.paths[-1]] == 5.7


def test_measured_curve_and_auto_runs_calibrate_once(monkeypatch):
    monkeypatch.setattr(tree_auto, "_AUTO_CHOICES", {})  # choices are process-wide (by weights digest)
    model = random_gpt(TINY_C2I)
    drafter = random_drafter(model)
    curve = measure_costs(model, drafter, rows=2, reps=1)
    assert [n for n, _ in curve.verify_s] == sorted(n for n, _ in curve.verify_s)
    assert all(t > 0 for _, t in curve.verify_s) and curve.draft_s > 0
    sampling = SamplingConfig(cfg_scale=2.0)
    first = speculative_generate(model, drafter, Condition.classes([0, 1]), sampling, SpeculativeConfig(tree="auto"),
                                 make_generators(0, 2))
    assert "calibrated" in first.stats.tree and first.stats.tree.startswith("auto_")
    redo = speculative_generate(model, drafter, Condition.classes([0, 1]), sampling, SpeculativeConfig(tree="auto"),
                                make_generators(0, 2))
    assert torch.equal(redo.tokens, first.tokens)  # calibration never changes what a seed draws
    chosen = tree_auto._AUTO_CHOICES[tree_auto._pair(model, drafter)]
    ((tree, note),) = chosen.values()
    assert "tok/s for plain AR" in note and note in first.stats.tree
    assert set(tree.paths) <= set(NAIVE_EXTEND_57.paths)  # a static sub-tree, drafted as one
    assert first.stats.accepted_histogram and len(first.stats.accepted_histogram) <= tree.depth + 1
    again = speculative_generate(model, drafter, Condition.classes([2, 3]), sampling, SpeculativeConfig(tree="auto"),
                                 make_generators(5, 2))  # the same batch size reuses the choice
    assert again.stats.tree.split(" ")[0] == first.stats.tree.split(" ")[0] and "calibrated" not in again.stats.tree
    other = speculative_generate(model, drafter, Condition.classes([2]), SamplingConfig(cfg_scale=1.0),
                                 SpeculativeConfig(tree="auto"), make_generators(5, 1))
    assert "calibrated" in other.stats.tree  # a different sampling setting calibrates afresh
    assert torch.all(again.tokens >= 0)


def test_auto_times_forwards_as_runs_make_them_on_cuda(monkeypatch):
    """On CUDA the cost curve times a captured graph's replay (what a run replays), not the eager call; capture
    is stood in for here (`stand_in_graphs`) and the device is only named."""
    import lantern_core.decoding.cost_curve as cost_curve
    from lantern_core.decoding import step_graphs
    from stand_in_graphs import stand_in_capture

    captured = []

    def capture(step, device, pool=None, prepare=lambda: None):
        graph = stand_in_capture(step_graphs)(step, device, pool, prepare)
        captured.append(graph)
        return graph

    monkeypatch.setattr(step_graphs, "capture", capture)
    monkeypatch.setattr(cost_curve, "synchronize", lambda device: None)
    calls = []
    assert cost_curve.time_call(lambda: calls.append(1), torch.device("cuda"), reps=3) >= 0
    (graph,) = captured
    assert graph.replays == 1 + 3  # the warm-up call and every timed call replayed the graph
    assert cost_curve.time_call(lambda: calls.append(1), torch.device("cpu"), reps=3) >= 0 and len(captured) == 1
