"""Every exact decoding mode samples exactly the autoregressive law over whole images.

Tiny class-conditional models whose every image can be enumerated (2x2 grid with 5 codes: 625 images;
3x3 grid with 3 codes: 19,683 images) on two sets of weights, with drafters whose next-token laws are
very peaked (where a renormalisation bug hid: under CFG a rejected sibling can leave less than float32's smallest
normal number of drafter mass). Each case decodes a few thousand images, every image with its own
generator, through the public entry points (`speculative_generate`, `jacobi_generate`, `generate`), and
compares whole images with the enumerated law (`tests/whole_image_law.py`) by a pooled chi-square.
Cases cover static trees (deeper than the image, branching, chains), LANTERN at delta 0 and LANTERN++
at lambda 1 on a static tree, EAGLE-2 dynamic trees, SJD, coupled SJD and plain AR, with CFG on and off
and with top-k / top-p, and on int8 and fp8 targets (against the quantized model's own law). Wrong-rule
controls show the same test rejects: the pre-fix renormalisation of the drafter's leftover mass (a bug
once shipped), a forgotten residual, a miscalibrated sampler, and a quantized target's images against the
full-precision law.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

import lantern_core.decoding.acceptance.siblings as acceptance
import lantern_core.decoding.trees.iteration as tree_iteration
import lantern_core.decoding.trees.walk as tree_walk
from lantern_core.benchmarks.rule_acceptance import TinyWeights
from lantern_core.conditioning import Condition
from lantern_core.config import GPTConfig, SamplingConfig
from lantern_core.decoding.trees.drafting import DynamicShape
from lantern_core.decoding.generate import generate
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.models.drafter import EagleDrafter
from lantern_core.models.gpt import LlamaGenGPT
from lantern_core.models.quantized import quantize_blocks, scheme_named
from lantern_core.decoding.acceptance.neighbors import build_neighbors
from lantern_core.decoding.acceptance.relaxation import Relaxation
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding.trees.specs import NAIVE_EXTEND_57, TreeSpec, chain_tree
from tests.whole_image_law import ImageLaw, image_law, pooled_pvalue
from tests.wrong_rules import conditional_draft_floored, residual_forgotten

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # kilobyte models

LABEL = 2
PASS, FAIL = 1e-3, 1e-6  # an exact mode must not look wrong at 1e-3; a wrong rule must look wrong at 1e-6
GRIDS = {
    "2x2v5": GPTConfig(dim=32, n_layer=2, n_head=2, vocab_size=5, model_type="c2i", num_classes=4,
                       cls_token_num=1, grid_size=2),
    "3x3v3": GPTConfig(dim=32, n_layer=2, n_head=2, vocab_size=3, model_type="c2i", num_classes=4,
                       cls_token_num=1, grid_size=3),
}
# two children at the root and under the first child, three levels: branching but shallower than 3x3
SMALL_TREE = TreeSpec("small_branching_6", ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))
CFG2 = SamplingConfig(cfg_scale=2.0, temperature=1.0)


@dataclass(frozen=True)
class Weights:
    grid: str
    seed: int
    output_std: float  # the target's output layer: small = flat laws, large = peaked laws
    quantized: str = "none"  # the target's blocks in int8 / fp8 (the drafter stays float32)


WEIGHTS = {"A": Weights("2x2v5", 0, 0.3), "B": Weights("2x2v5", 5, 0.08), "C": Weights("3x3v3", 7, 0.3),
           "A-int8": Weights("2x2v5", 0, 0.3, "int8"), "C-fp8": Weights("3x3v3", 7, 0.3, "fp8")}


@dataclass(frozen=True)
class Case:
    weights: str
    mode: str  # "static", "dynamic", "sjd", "sjd_coupled", "ar"
    sampling: SamplingConfig
    images: int
    tree: TreeSpec = NAIVE_EXTEND_57
    relaxation: Relaxation | None = None
    exact_rule: str = "same_as_ar"  # trees: AR's own draws (the default) or the residual rule


CASES = {
    # the shape that exposed the renormalisation bug: a 5-deep branching tree on 4-token images under CFG (on the
    # pre-fix code the top-k case gave p = 2e-11, weights B p = 2e-24)
    "static_naive57_cfg": Case("A", "static", CFG2, 3000),
    "static_naive57_cfg_topk3": Case("A", "static", SamplingConfig(cfg_scale=2.0, temperature=1.0, top_k=3), 2500),
    "static_naive57_nocfg": Case("B", "static", SamplingConfig(cfg_scale=1.0, temperature=1.0), 2500),
    "static_naive57_cfg_weightsB": Case("B", "static", SamplingConfig(cfg_scale=3.0, temperature=1.0), 2000),
    # the residual rule (`exact_rule="residual"`), kept as an option: its own whole-image checks
    "residual_naive57_cfg": Case("A", "static", CFG2, 3000, exact_rule="residual"),
    "residual_naive57_cfg_weightsB": Case("B", "static", SamplingConfig(cfg_scale=3.0, temperature=1.0), 2000,
                                          exact_rule="residual"),
    "residual_lantern_delta0_3x3_topp": Case("C", "static", SamplingConfig(cfg_scale=2.0, temperature=1.0, top_p=0.9),
                                             1500, SMALL_TREE, Relaxation(k=2, delta=0.0), "residual"),
    "residual_eagle2_cfg_topk3": Case("A", "dynamic", SamplingConfig(cfg_scale=2.0, temperature=1.0, top_k=3), 2500,
                                      exact_rule="residual"),
    "static_small_3x3_cfg_topp": Case("C", "static", SamplingConfig(cfg_scale=2.0, temperature=1.0, top_p=0.9),
                                      2000, SMALL_TREE),
    "static_chain4_3x3_cfg": Case("C", "static", CFG2, 1500, chain_tree(4)),
    "lantern_delta0_cfg_topp_weightsB": Case("B", "static", SamplingConfig(cfg_scale=3.0, temperature=1.0, top_p=0.8),
                                             2000, relaxation=Relaxation(k=3, delta=0.0)),
    "lantern_pp_lambda1_3x3_cfg": Case("C", "static", CFG2, 1500, SMALL_TREE, Relaxation(k=2, lam=1.0)),
    "eagle2_cfg_topk3": Case("A", "dynamic", SamplingConfig(cfg_scale=2.0, temperature=1.0, top_k=3), 2500),
    "eagle2_3x3_nocfg": Case("C", "dynamic", SamplingConfig(cfg_scale=1.0, temperature=1.0), 1500),
    "sjd_cfg": Case("A", "sjd", CFG2, 3000),
    "sjd_coupled_3x3_cfg_topk2": Case("C", "sjd_coupled", SamplingConfig(cfg_scale=2.0, temperature=1.0, top_k=2),
                                      2500),
    "ar_cfg_3x3": Case("C", "ar", CFG2, 6000),
    # a quantized target: the law is the quantized model's own (exactness is relative to the target sampled)
    "static_naive57_cfg_int8": Case("A-int8", "static", CFG2, 2500),
    "sjd_coupled_3x3_cfg_fp8": Case("C-fp8", "sjd_coupled", CFG2, 2000),
}
DYNAMIC = DynamicShape(depth=4, top_k=3, nodes=8)


def build_models(w: Weights) -> tuple[LlamaGenGPT, EagleDrafter]:
    """A target with random weights and a drafter initialised from it (`benchmarks.rule_acceptance.TinyWeights`,
    whose tokens-per-forward table measures these models): the drafter's laws are far sharper than the target's
    and often disagree with it, so most siblings' acceptances go through the residual."""
    config = GRIDS[w.grid]
    model, drafter = TinyWeights(w.grid, config.grid_size, config.vocab_size, w.seed, w.output_std).build()
    assert model.config == config
    return quantize_blocks(model, scheme_named(w.quantized)).eval(), drafter


_MODELS: dict[str, tuple] = {}


def models_for(name: str) -> tuple[LlamaGenGPT, EagleDrafter, torch.Tensor]:
    if name not in _MODELS:
        model, drafter = build_models(WEIGHTS[name])
        V = model.config.vocab_size
        codes = torch.randn(V, 4, generator=torch.Generator().manual_seed(11))
        _MODELS[name] = (model, drafter, build_neighbors(codes, V - 1))
    return _MODELS[name]


@torch.no_grad()
def decode(case: Case, seed: int = 123) -> torch.Tensor:
    model, drafter, neighbors = models_for(case.weights)
    condition = Condition.classes([LABEL] * case.images)
    generators = make_generators(seed, case.images)
    if case.mode == "ar":
        return generate(model, condition, case.sampling, generators).tokens
    if case.mode in ("sjd", "sjd_coupled"):
        config = JacobiConfig(window=3, coupled=case.mode == "sjd_coupled")
        return jacobi_generate(model, condition, case.sampling, config, generators).tokens
    spec = SpeculativeConfig(tree="dynamic", dynamic=DYNAMIC, exact_rule=case.exact_rule) if case.mode == "dynamic" \
        else SpeculativeConfig(tree="static", static_tree=case.tree, relaxation=case.relaxation,
                               exact_rule=case.exact_rule)
    return speculative_generate(model, drafter, condition, case.sampling, spec, generators,
                                neighbors=neighbors if case.relaxation else None).tokens


_LAWS: dict[tuple, ImageLaw] = {}


def law_for(weights: str, sampling: SamplingConfig) -> ImageLaw:
    key = (weights, sampling)
    if key not in _LAWS:
        _LAWS[key] = image_law(models_for(weights)[0], LABEL, sampling)
    return _LAWS[key]


def pvalue(case: Case, law_sampling: SamplingConfig | None = None) -> float:
    return pooled_pvalue(law_for(case.weights, law_sampling or case.sampling), decode(case))


@pytest.mark.parametrize("name", sorted(CASES))
def test_exact_mode_samples_the_ar_law_over_whole_images(name):
    p = pvalue(CASES[name])
    assert p > PASS, f"{name}: whole-image chi-square p = {p:.3g}"


# ------------------------------------------------------------------------------------ wrong-rule controls


def test_the_pre_fix_renormalisation_is_rejected(monkeypatch):
    monkeypatch.setattr(acceptance, "conditional_draft", conditional_draft_floored)
    assert pvalue(replace(CASES["residual_naive57_cfg_weightsB"], images=1500)) < FAIL


def test_a_forgotten_residual_is_rejected(monkeypatch):
    monkeypatch.setattr(tree_walk, "accept_siblings", residual_forgotten)
    assert pvalue(replace(CASES["static_naive57_nocfg"], images=1500, exact_rule="residual")) < FAIL


def test_noise_shared_across_positions_is_rejected(monkeypatch):
    """The AR-identical walk is AR's law only because every position races with its own noise: a tree whose
    nodes all race with the noise of the root's position (a plausible indexing slip) is rejected."""
    real = tree_iteration.tree_positions
    monkeypatch.setattr(tree_iteration, "tree_positions", lambda root, depth, device: real(root, depth, device) * 0)
    assert pvalue(replace(CASES["static_naive57_cfg"], images=1500)) < FAIL


def test_a_walk_that_skips_the_parent_check_is_rejected(monkeypatch):
    """A walk that accepts a node whose token is its parent's draw without checking the ancestors above it
    (the deepest passing node wins) emits tokens AR would not draw."""
    def no_ancestry(draws, parents, depths, mask, node_tokens, depth, paths=None):
        G, n1 = node_tokens.shape
        return tree_walk.walk_same_as_ar(draws, parents, depths, torch.eye(n1, dtype=torch.bool).expand(G, n1, n1),
                                         node_tokens, depth, paths)
    monkeypatch.setattr(tree_iteration, "walk_same_as_ar", no_ancestry)
    assert pvalue(replace(CASES["static_naive57_cfg"], images=1500)) < FAIL


def test_a_miscalibrated_sampler_is_rejected():
    """AR at temperature 1.15 tested against the temperature-1 law: the test has power on whole images."""
    case = CASES["ar_cfg_3x3"]
    hot = Case(case.weights, "ar", SamplingConfig(cfg_scale=2.0, temperature=1.15), case.images)
    assert pvalue(hot, law_sampling=case.sampling) < FAIL


def test_the_enumerated_law_sums_to_one():
    """Each step's distribution comes from its own teacher-forced row, so the product law sums to 1 only
    if rows, positions and the CFG pairing line up (the law is not renormalised)."""
    for name, sampling in (("A", CFG2), ("C", SamplingConfig(cfg_scale=2.0, temperature=1.0, top_p=0.9))):
        assert abs(float(law_for(name, sampling).probs.sum()) - 1.0) < 1e-5


def test_quantizing_changes_the_law_the_quantized_cases_test():
    """The quantized cases test a law of their own: quantization moves whole-image probabilities (total
    variation 0.019 for A in int8, 0.09 for C in fp8), and the fp8 case's images are rejected against the
    full-precision law."""
    for plain, quantized in (("A", "A-int8"), ("C", "C-fp8")):
        moved = (law_for(plain, CFG2).probs - law_for(quantized, CFG2).probs).abs().sum() / 2
        assert float(moved) > 5e-3, (quantized, float(moved))
    assert pooled_pvalue(law_for("C", CFG2), decode(CASES["sjd_coupled_3x3_cfg_fp8"])) < FAIL
