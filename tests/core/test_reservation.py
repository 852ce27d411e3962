"""The run reservation (`decoding/reservation.py`): its dry run on the meta device against what real runs
allocate (`memory_track` on the CPU), for plain AR and one case per distinct code path of the plan (every mode
family, greedy and sampled, one image and a shrinking batch); the refusal of a run that does not fit, with what
would fit; and on CUDA against `torch.cuda.max_memory_allocated`. Every sampled mode at batch 1 and 4 next to its
reservation (reported, on the embedded model): `make bench` (`lantern_core.benchmarks.run_memory`)."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from lantern_core.benchmarks.decode_counts import jacobi_modes, tree_modes
from lantern_core.benchmarks.run_memory import run_decoder
from lantern_core.conditioning import Condition
from lantern_core.config import GPTConfig, SamplingConfig
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.acceptance.neighbors import build_neighbors
from lantern_core.decoding.reservation import PlannedRun, RunMemoryError, check_run_fits, meta_twin, plan_run_memory
from lantern_core.memory_track import track_allocations
from lantern_core.models.gpt import LlamaGenGPT
from lantern_core.models.quantized import quantizable_bytes
from tiny_models import TINY_C2I, TINY_T2I, random_drafter, random_gpt

# 8 x 8 tokens (16 x 16 for the 2-D modes, whose lower-row geometry needs rows of 16), a vocabulary of 512
# (trees of 10 children, 10 neighbours), two layers: every buffer of the embedded model's runs, at a fraction of
# the cost of tracking each op of a real run
CONFIG = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=512, model_type="c2i", num_classes=5, cls_token_num=1,
                   grid_size=8)
CONFIG_2D = replace(CONFIG, grid_size=16)
TOLERANCE = 0.15  # the planner's promised bound; the dry run lands within 2 % on every mode below
MODES = [("ar", None, False)] + tree_modes(10) + jacobi_modes(10)
BY_NAME = {name: (spec, greedy) for name, spec, greedy in MODES}
# One run per distinct path of the plan (`reservation._dry_ar` / `_dry_tree` / `_dry_jacobi` and the state each
# allocates), not every mode x {greedy, sampled} x batch {1, 3}. Batch 3 also takes the shrinking-batch copy
# (`state.select` once an image is done, eager devices only); batch 1 the one-image run without it. Greedy
# changes the plan only by the uniforms (tree) and the Gumbel table (Jacobi): one greedy case per decoder.
CASES = [  # (mode name, batch): the path it covers
    ("ar", 3),  # _dry_ar: KV cache, uniforms, prefill, last step's window (no batch-dependent branch)
    ("static_tree naive_extend_57", 3),  # static tree plan, sampled (uniforms), shrinking batch; + cache-only control
    ("lantern_pp lambda 5 (naive_extend_57)", 1),  # static tree + neighbour table (LANTERN++ lambda), one image
    ("eagle2 d5 k10 n58 greedy", 3),  # dynamic EAGLE-2 tree, greedy (no uniforms), shrinking batch
    ("lantern delta 0.1 (eagle2 d5 k10 n58)", 1),  # dynamic tree + LANTERN delta relaxation, sampled, one image
    ("sjd w16", 3),  # 1-D Jacobi, uncoupled (no Gumbel table), shrinking batch
    ("sjd w16 greedy", 1),  # greedy Jacobi
    ("sjd_coupled w16", 3),  # coupled SJD: the Gumbel noise table; + cache-only control
    ("sjd_relaxed lambda 5 w16", 1),  # relaxed Jacobi with LANTERN's lambda: neighbour table
    ("sjd_relaxed gsd w16", 3),  # relaxed Jacobi with GSD's groups
    ("sjd continuation w16", 1),  # SJD-PAC continuation: the drawn laws
    ("sjd_coupled 2-D w15 + next row w16", 1),  # lossless 2-D: lower-row windows (16 x 16 tokens)
    ("sjd_coupled proactive 4 x depth 3 w16", 3),  # proactive leaves (LeafBuffers), coupled, shrinking batch
    ("sjd continuation proactive 4 x depth 3 w16", 1),  # leaves without coupling (Gumbel table from the leaves)
    ("sjd_coupled relaxed 2-D w8, 6 rows x w6 (lossy)", 3),  # relaxed 2-D: RowState, rows committing, shrinking
]
CONTROLS = {"static_tree naive_extend_57", "sjd_coupled w16"}  # the KV cache alone misses these by > 15 %
COVERED_ELSEWHERE = {  # modes of MODES without a case of their own: the case whose path they take
    "static_tree naive_extend_57 greedy": "eagle2 d5 k10 n58 greedy",  # greedy tree (no uniforms)
    "lantern_pp lambda 5 (naive_extend_57) greedy": "eagle2 d5 k10 n58 greedy",
    "lantern delta 0.1 (eagle2 d5 k10 n58) greedy": "eagle2 d5 k10 n58 greedy",
    "eagle2 d5 k10 n58": "lantern delta 0.1 (eagle2 d5 k10 n58)",  # dynamic tree, sampled
    # the residual rule allocates what the relaxed rules do (walk uniforms, a sampled static tree's Exp(1) table)
    "static_tree naive_extend_57 residual rule": "lantern_pp lambda 5 (naive_extend_57)",
    "eagle2 d5 k10 n58 residual rule": "lantern delta 0.1 (eagle2 d5 k10 n58)",
}


def build(config: GPTConfig):
    model = random_gpt(config)
    drafter = random_drafter(model)
    neighbors = build_neighbors(torch.randn(config.vocab_size, 8, generator=torch.Generator().manual_seed(0)), 10)
    return model, drafter, neighbors


@pytest.fixture(scope="module")
def pair():
    return build(CONFIG)


@pytest.fixture(scope="module")
def pair_2d():
    return build(CONFIG_2D)


def sampling_for(greedy: bool) -> SamplingConfig:
    return SamplingConfig(cfg_scale=3.0, temperature=0.0 if greedy else 1.0)


def measured_peak(model, drafter, neighbors, spec, batch: int, sampling: SamplingConfig) -> int:
    condition = Condition.classes([i % CONFIG.num_classes for i in range(batch)])
    with torch.no_grad(), track_allocations() as tally:
        run_decoder(model, drafter, condition, sampling, spec, neighbors)
    return tally.peak


def planned(model, drafter, neighbors, spec, batch: int, sampling: SamplingConfig, **kw):
    condition = Condition.classes([i % CONFIG.num_classes for i in range(batch)])
    uses_drafter = spec is not None and not isinstance(spec, JacobiConfig)
    return plan_run_memory(PlannedRun(model, condition, sampling, spec, drafter if uses_drafter else None,
                                      neighbors if spec is not None else None, **{"compile": "off", **kw}))


def test_the_cases_cover_every_mode_family():
    """A mode added to `tree_modes` / `jacobi_modes` needs a case here (or a line in COVERED_ELSEWHERE)."""
    names = [name for name, _ in CASES]
    assert len(set(names)) == len(names) and set(names) | set(COVERED_ELSEWHERE) == set(BY_NAME)
    assert set(COVERED_ELSEWHERE.values()) <= set(names) and not set(names) & set(COVERED_ELSEWHERE)
    assert {batch for _, batch in CASES} == {1, 3} and CONTROLS <= {name for name, _ in CASES}


@pytest.mark.parametrize("name,batch", CASES, ids=[f"{name}-{batch}" for name, batch in CASES])
def test_the_reservation_is_within_15_percent_of_what_the_run_allocates(pair, pair_2d, name, batch):
    """The plan within the bound; for the CONTROLS also the control that the bound discriminates: the KV cache
    alone (what the sampler reserved before) misses a coupled SJD run's noise table and rings of laws, and a tree
    run's drafter cache, by far more than 15 %."""
    spec, greedy = BY_NAME[name]
    model, drafter, neighbors = pair_2d if isinstance(spec, JacobiConfig) and spec.rows > 1 else pair
    sampling = sampling_for(greedy)
    real = measured_peak(model, drafter, neighbors, spec, batch, sampling)
    plan = planned(model, drafter, neighbors, spec, batch, sampling)
    assert abs(plan.peak / real - 1) <= TOLERANCE, (name, batch, plan, real)
    assert 0 < plan.state <= plan.peak
    if name in CONTROLS:
        cache_only = planned(model, drafter, neighbors, None, batch, sampling).state
        assert real / cache_only > 1 + TOLERANCE, (name, real, cache_only)


@pytest.mark.parametrize("states", ["native", "hf_port"])
def test_a_padded_caption_prefix_is_planned_too(states):
    """Text-to-image with left-padded captions (the prefix mask, and LANTERN's HF-port drafter states, which
    run a second prefix forward): the plan stays within the bound."""
    config = replace(TINY_T2I, vocab_size=128)
    model = random_gpt(config)
    drafter = random_drafter(model)
    drafter.config = replace(drafter.config, prefix_states=states)
    caption = torch.randn(3, config.cls_token_num, config.caption_dim, generator=torch.Generator().manual_seed(2))
    mask = torch.arange(config.cls_token_num)[None] >= torch.tensor([2, 5, 0])[:, None]  # left padding
    condition = Condition(caption=caption, caption_mask=mask)
    spec = tree_modes(10)[0][1]
    sampling = sampling_for(False)
    with torch.no_grad(), track_allocations() as tally:
        run_decoder(model, drafter, condition, sampling, spec, None)
    plan = plan_run_memory(PlannedRun(model, condition, sampling, spec, drafter, compile="off"))
    assert abs(plan.peak / tally.peak - 1) <= TOLERANCE, (states, plan, tally.peak)


def test_the_dry_run_reads_no_weight_and_sizes_a_7b_cache_exactly():
    """A 7B LlamaGen shape built on the meta device (no weights exist) plans: its AR state is the bf16 KV cache
    (2 x layers x rows x heads x slots x head_dim) plus the token and mask buffers; bigger batches cost more."""
    config = GPTConfig(dim=4096, n_layer=32, n_head=32, vocab_size=16384, model_type="c2i", num_classes=1000,
                       cls_token_num=1, grid_size=24)
    with torch.device("meta"):
        model = LlamaGenGPT(config).to(torch.bfloat16)
    sampling = sampling_for(False)
    one, four = (plan_run_memory(PlannedRun(model, Condition.classes([0] * b), sampling, compile="off",
                                            device="cpu")) for b in (1, 4))
    cache = 2 * 32 * 2 * 32 * (1 + 576) * 128 * 2
    assert cache <= one.state < cache + 2**20
    assert four.state > 3.9 * one.state and four.peak > one.peak
    twin, = meta_twin(model)
    assert twin.layers[0].attention.wqkv.weight.is_meta


def test_a_run_that_does_not_fit_is_refused_with_what_would_fit(pair):
    model, drafter, neighbors = pair
    sampling = sampling_for(False)
    spec = JacobiConfig(8, coupled=True, init="sample_left")
    condition = Condition.classes([0, 1, 2, 3])
    run = PlannedRun(model, condition, sampling, spec, None, None, compile="off")
    need = plan_run_memory(run)
    check_run_fits(run, need, need.peak)  # exactly enough: runs
    one = plan_run_memory(PlannedRun(model, condition.first(1), sampling, spec, compile="off"))
    with pytest.raises(RunMemoryError) as caught:
        check_run_fits(run, need, one.peak, quantizable_bytes(model))
    text = str(caught.value)
    assert "coupled jacobi w8" in text and "batch 4" in text and "free after loading the model" in text
    assert "lower batch_size to 1" in text and "mode 'ar'" in text
    assert "weights int8 or fp8" not in text  # freeing the weights alone would not make room
    with pytest.raises(RunMemoryError, match="weights int8 or fp8"):
        check_run_fits(run, need, need.peak - 1000, 10**6)
    assert isinstance(caught.value, MemoryError)


def test_plans_are_kept_per_shape(pair):
    model, drafter, neighbors = pair
    sampling = sampling_for(False)
    first = planned(model, drafter, neighbors, None, 2, sampling)
    assert planned(model, drafter, neighbors, None, 2, sampling) is first
    assert planned(model, drafter, neighbors, None, 2, sampling_for(True)) is not first


@pytest.mark.cuda
@pytest.mark.parametrize("name,spec,greedy", [MODES[0], tree_modes(10)[2], jacobi_modes(10)[1]],
                         ids=["ar", "eagle2", "sjd_coupled"])
def test_the_reservation_is_within_15_percent_of_cuda_peak(pair, name, spec, greedy):
    """On CUDA the allocator's own peak (after a warm-up run: cuBLAS workspaces, captured graphs and the
    runner registry's buffers are in place; their run is measured from there) against the plan at batch 4."""
    from lantern_core.decoding import step_graphs

    model, drafter, neighbors = (copy.deepcopy(t).to("cuda") for t in pair)
    sampling = sampling_for(greedy)
    condition = Condition.classes([0, 1, 2, 3], device="cuda")
    plan = planned(model, drafter, neighbors, spec, 4, sampling, compile="graphs")

    with torch.no_grad():
        step_graphs.release(model)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run_decoder(model, drafter, condition, sampling, spec, neighbors, compile="graphs")
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    step_graphs.release(model)
    assert abs(plan.peak / peak - 1) <= TOLERANCE, (name, plan, peak)


def test_settings_the_decoder_refuses_are_refused_by_the_plan_with_its_error(pair):
    """A tree wider than the vocabulary, or a relaxation without its neighbour table: the decoder's own
    ConfigError, from the plan, before the sampler places anything."""
    from lantern_core.decoding.trees.drafting import DynamicShape
    from lantern_core.decoding.acceptance.relaxation import Relaxation
    from lantern_core.decoding.trees.config import SpeculativeConfig
    from lantern_core.errors import ConfigError

    small = random_gpt(TINY_C2I)  # 48 codes
    condition = Condition.classes([0])
    wide = SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(2, 50, 4))
    with pytest.raises(ConfigError, match="top_k of at most 48"):
        plan_run_memory(PlannedRun(small, condition, sampling_for(False), wide, random_drafter(small), compile="off"))
    model = pair[0]  # 512 codes
    relaxed = JacobiConfig(8, coupled=True, init="sample_left", relaxation=Relaxation(k=10, lam=5.0))
    with pytest.raises(ConfigError, match="neighbour table"):
        plan_run_memory(PlannedRun(model, condition, sampling_for(False), relaxed, compile="off"))
