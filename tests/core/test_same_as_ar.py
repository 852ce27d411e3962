"""Same seed, same picture: every lossless tree decoder and Jacobi window (1-D and 2-D, coupled or not) emits plain
AR's tokens for a seed, token for token, in float64 on the embedded model and drafter (which accept about three
tokens a forward, so long accepted paths, rejections and bonus tokens all happen), whatever the tree or window, the
batch position, the layout (the CPU's exact windows or the GPU path's bands and fixed trips) or greedy decoding.
The residual rules, kept as options, sample the same law but not the same picture (the controls that the
comparison can fail)."""
from __future__ import annotations

import contextlib

import pytest
import torch

from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.decoding.acceptance.neighbors import build_neighbors
from lantern_core.decoding.acceptance.relaxation import Relaxation
from lantern_core.decoding.generate import generate
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.step_graphs import gpu_path
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.drafting import DynamicShape
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding.trees.specs import MC_SIM_7B_63, NAIVE_EXTEND_57, chain_tree
from lantern_core.loading.embedded import load_embedded

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SAMPLED = SamplingConfig(cfg_scale=4.0, temperature=1.0)
FILTERED = SamplingConfig(cfg_scale=3.0, temperature=0.9, top_k=200, top_p=0.95)
GREEDY = SamplingConfig(cfg_scale=4.0, temperature=0.0)
SMALL_EAGLE2 = DynamicShape(depth=4, top_k=5, nodes=20)
MODES = {
    "static_tree naive_extend_57": SpeculativeConfig(static_tree=NAIVE_EXTEND_57),
    "static_tree mc_sim_7b_63": SpeculativeConfig(static_tree=MC_SIM_7B_63),
    "static_tree chain 6": SpeculativeConfig(static_tree=chain_tree(6)),
    "eagle2 d5 k10 n58": SpeculativeConfig(tree="dynamic"),
    "eagle2 d4 k5 n20": SpeculativeConfig(tree="dynamic", dynamic=SMALL_EAGLE2),
    "lantern delta 0": SpeculativeConfig(tree="dynamic", relaxation=Relaxation(k=10, delta=0.0)),
    "lantern_pp lambda 1": SpeculativeConfig(static_tree=NAIVE_EXTEND_57, relaxation=Relaxation(k=10, lam=1.0)),
}
LABELS = [0, 3, 5]
SEED = 11


@pytest.fixture(scope="module")
def embedded():
    pipe = load_embedded("cpu", torch.float64, drafter=True)
    return pipe.gpt.model, pipe.drafter.model, build_neighbors(pipe.vq.model.quantize.embedding.weight, 10)


_AR: dict = {}


def ar_tokens(model, sampling: SamplingConfig) -> torch.Tensor:
    if sampling not in _AR:
        _AR[sampling] = generate(model, Condition.classes(LABELS), sampling, make_generators(SEED, len(LABELS)),
                                 compile="off").tokens
    return _AR[sampling]


def speculative_run(models, spec, sampling, labels=LABELS, seed=SEED, layout="exact"):
    """A tree or Jacobi decoder's result for `labels` (seeds seed, seed + 1, ...), in the CPU's layout or the GPU path's."""
    model, drafter, neighbors = models
    context = gpu_path() if layout == "gpu path" else contextlib.nullcontext()
    with context:
        if isinstance(spec, JacobiConfig):
            return jacobi_generate(model, Condition.classes(labels), sampling, spec, make_generators(seed, len(labels)),
                                   compile="off")
        return speculative_generate(model, drafter, Condition.classes(labels), sampling, spec,
                                    make_generators(seed, len(labels)), neighbors if spec.relaxation else None,
                                    compile="off")


@pytest.mark.parametrize("name", sorted(MODES))
def test_lossless_trees_give_ar_tokens_for_the_seed(embedded, name):
    model = embedded[0]
    result = speculative_run(embedded, MODES[name], SAMPLED)
    assert torch.equal(result.tokens, ar_tokens(model, SAMPLED)), name
    assert result.stats.mean_accepted_length > 1.5  # drafts were accepted: the walk, not only bonus tokens, spoke


@pytest.mark.parametrize("name", ["eagle2 d4 k5 n20", "static_tree naive_extend_57"])
def test_filters_the_gpu_layout_and_batch_positions_keep_ar_tokens(embedded, name):
    """Top-k, top-p and a temperature; the GPU path's banded windows and fixed trips; image 2 of a batch run
    alone with seed + 2."""
    model = embedded[0]
    expected = ar_tokens(model, FILTERED)
    assert torch.equal(speculative_run(embedded, MODES[name], FILTERED, layout="gpu path").tokens, expected)
    alone = speculative_run(embedded, MODES[name], FILTERED, labels=LABELS[2:], seed=SEED + 2)
    assert torch.equal(alone.tokens[0], expected[2])


@pytest.mark.parametrize("name", ["eagle2 d4 k5 n20", "static_tree naive_extend_57"])
def test_greedy_trees_give_ar_tokens(embedded, name):
    model = embedded[0]
    assert torch.equal(speculative_run(embedded, MODES[name], GREEDY).tokens, ar_tokens(model, GREEDY))


def test_the_residual_rule_samples_another_picture(embedded):
    """The control: the multi-draft residual rule (exact in law, `exact_rule="residual"`) does not reproduce AR's
    tokens, so the comparisons above can fail."""
    model = embedded[0]
    spec = SpeculativeConfig(static_tree=NAIVE_EXTEND_57, exact_rule="residual")
    tokens = speculative_run(embedded, spec, SAMPLED).tokens
    assert (tokens == ar_tokens(model, SAMPLED)).float().mean() < 0.5


COUPLED = dict(coupled=True, init="sample_left")
JACOBI = {
    "sjd w8": JacobiConfig(8, init="sample_left"),
    "sjd_coupled w4": JacobiConfig(4, **COUPLED),
    "sjd_coupled w12 random init": JacobiConfig(12, coupled=True, init="random"),
    "lossless 2-D w15 + next row w16": JacobiConfig(15, **COUPLED, rows=2, row_window=16, row_offset=-1),
    "sjd continuation w8": JacobiConfig(8, init="sample_left", continuation=True),
    "sjd_coupled proactive 4 x depth 3 w8": JacobiConfig(8, **COUPLED, proactive=4, proactive_depth=3),
    "sjd continuation proactive 3 x depth 2 w6": JacobiConfig(6, init="sample_left", continuation=True, proactive=3,
                                                              proactive_depth=2),
    "lossless 2-D proactive 3 x depth 3": JacobiConfig(15, **COUPLED, rows=2, row_window=16, row_offset=-1,
                                                       proactive=3),
}


@pytest.mark.parametrize("name", sorted(JACOBI))
def test_lossless_jacobi_windows_give_ar_tokens_for_the_seed(embedded, name):
    result = speculative_run(embedded, JACOBI[name], SAMPLED)
    assert torch.equal(result.tokens, ar_tokens(embedded[0], SAMPLED)), name
    assert result.stats.mean_accepted_length > 1.5


@pytest.mark.parametrize("name", ["sjd_coupled w4", "sjd_coupled proactive 4 x depth 3 w8",
                                  "lossless 2-D proactive 3 x depth 3"])
def test_jacobi_filters_the_gpu_layout_and_batch_positions_keep_ar_tokens(embedded, name):
    config = JACOBI[name]
    expected = ar_tokens(embedded[0], FILTERED)
    assert torch.equal(speculative_run(embedded, config, FILTERED, layout="gpu path").tokens, expected)
    assert torch.equal(speculative_run(embedded, config, FILTERED, labels=LABELS[1:2], seed=SEED + 1).tokens[0], expected[1])


def test_the_residual_jacobi_rule_samples_another_picture(embedded):
    config = JacobiConfig(8, init="sample_left", exact_rule="residual")
    tokens = speculative_run(embedded, config, SAMPLED).tokens
    assert (tokens == ar_tokens(embedded[0], SAMPLED)).float().mean() < 0.5


def test_proactive_leaves_are_taken_only_as_ar_draws(embedded, monkeypatch):
    """Proactive leaves are really taken under the AR-identical rule (so the proof above covers them), and the
    test can fail: a judge that takes the first leaf wherever the chain stops in the tree, whether or not it is
    AR's draw, leaves AR's picture."""
    import lantern_core.decoding.jacobi.iteration as jacobi_iteration
    from lantern_core.decoding.jacobi.proactive import LeafVerdict, judge_leaves_same_as_ar
    config = JACOBI["sjd_coupled proactive 4 x depth 3 w8"]
    taken = []

    def counted(*args):
        verdict = judge_leaves_same_as_ar(*args)
        taken.append(int((verdict.leaf >= 0).sum()))
        return verdict

    monkeypatch.setattr(jacobi_iteration, "judge_leaves_same_as_ar", counted)
    assert torch.equal(speculative_run(embedded, config, SAMPLED).tokens, ar_tokens(embedded[0], SAMPLED))
    assert sum(taken) >= 5, taken

    def any_leaf(filtered, leaf_filtered, gumbel, drafts, leaves, width):
        right = judge_leaves_same_as_ar(filtered, leaf_filtered, gumbel, drafts, leaves, width)
        G, D, K1 = leaves.shape
        run = right.run
        took = (run < D) & (run < width)
        leaf = torch.where(took, run.clamp(max=D - 1) * K1, torch.full_like(run, -1))
        V = filtered.shape[-1]
        after = leaf_filtered.gather(1, leaf.clamp(min=0)[:, None, None].expand(G, 1, V))[:, 0]
        noise = gumbel.gather(1, (run + 1).clamp(max=drafts.shape[1])[:, None, None].expand(G, 1, V))[:, 0]
        token = torch.where(took, (after + noise).argmax(-1), right.token)
        return LeafVerdict(run + took.long(), token, run, leaf)

    monkeypatch.setattr(jacobi_iteration, "judge_leaves_same_as_ar", any_leaf)
    tokens = speculative_run(embedded, config, SAMPLED).tokens
    assert (tokens == ar_tokens(embedded[0], SAMPLED)).float().mean() < 0.5
