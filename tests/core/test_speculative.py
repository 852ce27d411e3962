"""Speculative decoding end to end on tiny random models: greedy speculation reproduces greedy AR token
for token (static trees of every shape, the dynamic tree, c2i and left-padded t2i, CFG with an interval);
zero relaxation (delta = 0, lambda = 1) reproduces the exact modes draw for draw; relaxed runs stay within
their budget; stats and the heat map add up; batches equal single runs with seed + i."""
import pytest
import torch

from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.decoding.trees.drafting import DynamicShape
from lantern_core.errors import ConfigError
from lantern_core.decoding.generate import generate
from lantern_core.decoding.acceptance.neighbors import build_neighbors
from lantern_core.decoding.acceptance.relaxation import Relaxation
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding.trees.specs import MC_SIM_7B_63, NAIVE_EXTEND_57, TreeSpec, chain_tree
from tests.tiny_models import TINY_C2I, TINY_T2I, random_drafter, random_gpt

SPECS = {
    "naive_extend_57": SpeculativeConfig(static_tree=NAIVE_EXTEND_57),
    "mc_sim_7b_63": SpeculativeConfig(static_tree=MC_SIM_7B_63),
    "chain_1": SpeculativeConfig(static_tree=chain_tree(1)),
    "chain_20": SpeculativeConfig(static_tree=chain_tree(20)),  # deeper than the spare RoPE rows
    "user_tree": SpeculativeConfig(static_tree=TreeSpec("mine", ((0,), (1,), (0, 0), (0, 0, 0)))),
    "eagle2": SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(depth=4, top_k=4, nodes=12)),
}


def conditions(kind):
    if kind == "c2i":
        return random_gpt(TINY_C2I, seed=5), Condition.classes([2, 4, 0])
    g = torch.Generator().manual_seed(9)
    caption = torch.randn(2, 6, 24, generator=g)
    mask = torch.tensor([[False, False, True, True, True, True], [True] * 6])
    return random_gpt(TINY_T2I, seed=5), Condition(caption=caption, caption_mask=mask)


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_greedy_speculation_equals_greedy_ar(kind, name):
    model, cond = conditions(kind)
    drafter = random_drafter(model)
    sampling = SamplingConfig(cfg_scale=3.0, cfg_interval=5, temperature=0.0)
    ar = generate(model, cond, sampling)
    spec = speculative_generate(model, drafter, cond, sampling, SPECS[name])
    assert torch.equal(spec.tokens, ar.tokens)
    assert spec.stats.iterations + cond.batch == spec.stats.forward_passes



@pytest.mark.parametrize("name", ["naive_extend_57", "eagle2"])
def test_zero_relaxation_reproduces_exact_draw_for_draw(name):
    model, cond = conditions("c2i")
    drafter = random_drafter(model)
    table = build_neighbors(torch.randn(TINY_C2I.vocab_size, 3, generator=torch.Generator().manual_seed(1)), 6)
    sampling = SamplingConfig(cfg_scale=2.0, temperature=1.0, top_k=30)
    base = SPECS[name]
    exact = speculative_generate(model, drafter, cond, sampling, base, make_generators(3, cond.batch))
    for rule in (Relaxation(k=6, delta=0.0), Relaxation(k=6, lam=1.0)):
        relaxed = speculative_generate(model, drafter, cond, sampling,
                                       SpeculativeConfig(base.tree, base.static_tree, base.dynamic, rule),
                                       make_generators(3, cond.batch), neighbors=table)
        assert torch.equal(relaxed.tokens, exact.tokens)
        assert relaxed.stats.max_absorbed == 0.0


@pytest.mark.parametrize("name", ["naive_extend_57", "eagle2"])
def test_relaxation_spends_at_most_its_budget_and_raises_acceptance(name):
    model, cond = conditions("c2i")
    drafter = random_drafter(model)
    table = build_neighbors(torch.randn(TINY_C2I.vocab_size, 3, generator=torch.Generator().manual_seed(1)), 20)
    sampling = SamplingConfig(cfg_scale=2.0, temperature=1.0)
    base = SPECS[name]
    exact = speculative_generate(model, drafter, cond, sampling, base, make_generators(3, cond.batch))
    delta = 0.3
    loose = SpeculativeConfig(base.tree, base.static_tree, base.dynamic, Relaxation(k=20, delta=delta))
    relaxed = speculative_generate(model, drafter, cond, sampling, loose, make_generators(3, cond.batch),
                                   neighbors=table)
    assert 0 < relaxed.stats.max_absorbed <= delta + 1e-6
    assert relaxed.stats.relaxed_tokens > 0
    assert relaxed.stats.mean_accepted_length > exact.stats.mean_accepted_length


def test_stats_and_heat_map_add_up():
    model, cond = conditions("c2i")
    sampling = SamplingConfig(cfg_scale=2.0, temperature=1.0)
    result = speculative_generate(model, random_drafter(model), cond, sampling, SPECS["naive_extend_57"],
                                  torch.Generator().manual_seed(0))
    s = result.stats
    N = TINY_C2I.num_image_tokens
    assert sum(s.accepted_histogram) == s.iterations
    emitted = sum((k + 1) * c for k, c in enumerate(s.accepted_histogram)) + cond.batch  # + prefill tokens
    assert emitted >= cond.batch * N  # the last iteration may overshoot the grid
    assert s.accepted_by_node[0] == s.iterations  # the root is on every path
    assert all(0 <= a <= 1 for a in s.acceptance_by_depth)
    assert result.accepted_per_cell.shape == result.tokens.shape
    assert (result.accepted_per_cell >= 1).all() and (result.accepted_per_cell <= NAIVE_EXTEND_57.depth + 1).all()
    assert result.tokens.min() >= 0 and result.tokens.max() < TINY_C2I.vocab_size
    assert s.drafter_forwards > s.iterations


def test_a_batch_equals_single_runs_with_consecutive_seeds():
    model, cond = conditions("c2i")
    drafter = random_drafter(model)
    sampling = SamplingConfig(cfg_scale=2.0, temperature=1.0)
    batch = speculative_generate(model, drafter, cond, sampling, SPECS["mc_sim_7b_63"], make_generators(40, 3))
    for i in range(3):
        one = speculative_generate(model, drafter, Condition.classes([int(cond.labels[i])]), sampling,
                                   SPECS["mc_sim_7b_63"], make_generators(40 + i, 1))
        assert torch.equal(one.tokens[0], batch.tokens[i])


def test_relaxation_without_a_neighbour_table_is_a_clear_error():
    model, cond = conditions("c2i")
    spec = SpeculativeConfig(relaxation=Relaxation(k=4, delta=0.1))
    with pytest.raises(ConfigError, match="neighbour table"):
        speculative_generate(model, random_drafter(model), cond, SamplingConfig(), spec)


def test_bad_dynamic_shape_names_the_parameter():
    with pytest.raises(ConfigError, match="dynamic tree"):
        SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(depth=2, top_k=2, nodes=99))


def test_weights_digest_follows_the_weights_not_the_object():
    from lantern_core.decoding.auto_store import weights_digest
    from tests.tiny_models import TINY_C2I, random_gpt

    a, b = random_gpt(TINY_C2I, seed=0), random_gpt(TINY_C2I, seed=0)
    assert a is not b and weights_digest(a) == weights_digest(b)
    c = random_gpt(TINY_C2I, seed=0)
    with torch.no_grad():
        c.layers[1].attention.wo.weight.view(-1)[-1] += 1.0  # the last value of one tensor
    assert weights_digest(c) != weights_digest(a)
