"""The 8-bit KV cache (`GPTConfig.kv_cache="int8"`): symmetric per-(row, head, slot) scales, each entry within
half its scale of what was written; about half the bytes; every decoder reads and writes it through the same
calls, so greedy runs of every exact mode equal greedy AR with that cache (trees compact the scales with the
codes: leaving them behind is caught), batches equal single runs, and a step stays capturable (no host read,
nothing made off the device)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lantern_core.benchmarks import decode_counts
from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.decoding.generate import generate
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding.trees.specs import NAIVE_EXTEND_57
from lantern_core.errors import ConfigError
from lantern_core.loading.embedded import load_embedded
from lantern_core.models.kv_cache import KVCache, quantize_int8

GREEDY = SamplingConfig(cfg_scale=4.0, temperature=0.0)


@pytest.fixture(scope="module")
def embedded():
    """The embedded model and drafter in float64: a token's keys computed in a window and in an AR step differ in
    the last bits of float32, which can move an int8 code by one step (a larger change than float32's own
    rounding); in float64 that never happens here, so equality tests the decoders' logic, not that noise."""
    pipe = load_embedded("cpu", torch.float64, drafter=True)
    import copy

    model = copy.deepcopy(pipe.gpt.model).set_kv_cache("int8")
    return model, pipe.drafter.model, pipe.gpt.model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_each_entry_is_within_half_its_scale(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 7, 64, generator=g) * torch.logspace(-3, 3, 7)[:, None]  # scales over six decades
    x[0, 0, 0] = 0.0  # an all-zero vector
    codes, scale = quantize_int8(x.to(dtype), dtype)
    assert codes.dtype == torch.int8 and int(codes.abs().max()) <= 127 and scale.shape == (3, 4, 7, 1)
    back = codes.float() * scale.float()
    assert bool(((back - x.to(dtype).float()).abs() <= scale.float() / 2 * (1 + 1e-6) + 1e-30).all())
    assert float(scale[0, 0, 0]) == 0.0 and bool((codes[0, 0, 0] == 0).all())


def test_the_cache_is_about_half_the_bytes_and_the_option_is_checked(embedded):
    model, _, plain = embedded
    c, d = model.config, model.config.head_dim
    small, full = model.allocate_cache(2, 40), plain.allocate_cache(2, 40)
    per_entry = 2 * (d + small.key_scales.element_size())  # int8 codes + one scale, keys and values
    assert small.int8 and not full.int8 and small.nbytes == c.n_layer * 2 * c.n_kv_head * 40 * per_entry
    assert small.nbytes < 0.3 * full.nbytes  # float64 here: 8 bytes an entry before (bf16: 2)
    with pytest.raises(ConfigError, match="kv_cache"):
        replace(model.config, kv_cache="int4")


def runs(model, drafter, condition, sampling, seed: int) -> dict[str, torch.Tensor]:
    def gens():
        return make_generators(seed, condition.batch, "cpu")

    jacobi = {"sjd": JacobiConfig(window=8), "sjd_coupled": JacobiConfig(window=8, coupled=True),
              "continuation": JacobiConfig(window=8, continuation=True),
              "proactive": JacobiConfig(window=8, coupled=True, proactive=3, proactive_depth=2),
              "lossless_2d": JacobiConfig(window=7, coupled=True, rows=2, row_window=8, row_offset=-1)}
    trees = {"static_tree": SpeculativeConfig(tree="static", static_tree=NAIVE_EXTEND_57),
             "eagle2": SpeculativeConfig(tree="dynamic")}
    out = {"ar": generate(model, condition, sampling, gens()).tokens}
    out.update({n: jacobi_generate(model, condition, sampling, c, gens()).tokens for n, c in jacobi.items()})
    out.update({n: speculative_generate(model, drafter, condition, sampling, c, gens()).tokens
                for n, c in trees.items()})
    return out


def test_every_exact_mode_equals_ar_greedily_with_an_int8_cache(embedded):
    model, drafter, plain = embedded
    condition = Condition.classes([0, 3, 5])
    with torch.no_grad():
        tokens = runs(model, drafter, condition, GREEDY, 0)
        base = tokens["ar"]
        for name, t in tokens.items():
            assert torch.equal(t, base), name
        single = generate(model, Condition.classes([3]), GREEDY, make_generators(0, 1, "cpu")).tokens
        assert torch.equal(single[0], base[1])  # a batch row = its single run
        full = generate(plain, condition, GREEDY, make_generators(0, 3, "cpu")).tokens
    agree = (full == base).float().mean()
    assert agree > 0.5, float(agree)  # close to the full-precision cache's choices, not another model


def test_trees_that_leave_the_scales_behind_are_caught(embedded, monkeypatch):
    """Compaction moves the accepted path's codes AND scales: with the scales left where the drafts were written,
    the accepted entries are read with the wrong scales and a greedy tree no longer equals AR."""
    model, drafter, _ = embedded
    condition = Condition.classes([0, 3, 5])
    spec = SpeculativeConfig(tree="static", static_tree=NAIVE_EXTEND_57)
    with torch.no_grad():
        base = generate(model, condition, GREEDY, make_generators(0, 3, "cpu")).tokens
        compact = KVCache.compact

        def codes_only(self, source_slots, dest_start):  # the scales stay where the drafts were written
            buffers = KVCache.buffers
            KVCache.buffers = lambda cache: (cache.keys, cache.values)
            try:
                compact(self, source_slots, dest_start)
            finally:
                KVCache.buffers = buffers

        monkeypatch.setattr(KVCache, "compact", codes_only)
        wrong = speculative_generate(model, drafter, condition, GREEDY, spec, make_generators(0, 3, "cpu")).tokens
    assert not torch.equal(wrong, base)


def test_an_int8_step_stays_capturable(embedded):
    model, _, plain = embedded
    count = decode_counts.count_ar(model, SamplingConfig(cfg_scale=4.0, temperature=1.0), "int8", torch.device("cpu"))
    baseline = decode_counts.count_ar(plain, SamplingConfig(cfg_scale=4.0, temperature=1.0), "auto",
                                      torch.device("cpu"))
    assert count.host_reads_in_step == 0 and count.host_reads_per_iteration == 0
    assert not count.stray_factories and count.rng_kernels == 0
    # eagerly, quantizing and dequantizing keys and values: 32 kernels a layer more when set (Inductor fuses them)
    assert 0 < count.per_layer - baseline.per_layer <= 34, (count.parts, baseline.parts)


@torch.no_grad()
def cached_ar_law(model, label: int, sampling: SamplingConfig):
    """The law of whole images under AR with the model's own (8-bit) cache: every image of the tiny grid teacher-
    forced one token a step through a cache, as AR writes and reads it (prefix, then one slot per token), the
    conditional and null-class rows side by side; CFG mix, temperature, product of the chosen tokens' laws."""
    import itertools

    from lantern_core.decoding.sampling import NodeDistributions
    from lantern_core.models.gpt import ForwardStep
    from whole_image_law import ImageLaw

    config = model.config
    V, N = config.vocab_size, config.num_image_tokens
    images = torch.tensor(list(itertools.product(range(V), repeat=N)))  # (V**N, N)
    labels = torch.cat([torch.full((len(images),), label), torch.full((len(images),), config.num_classes)])
    tokens = torch.cat([images, images])
    cache = model.allocate_cache(len(tokens), config.max_seq_len)
    dist = NodeDistributions(sampling, True, model.constrain_logits)
    h = model.embed_condition(labels)  # (rows, 1, dim): the class prefix, slot 0
    log_p = torch.zeros(len(images), dtype=torch.float64)
    for t in range(N):
        slot = config.cls_token_num - 1 + t
        hidden = model(h, ForwardStep(torch.tensor([slot]), cache, kv_len=slot + 1))
        step = dist.log_probs(model.logits(hidden), torch.tensor([t]))[:, 0]  # (V**N, V)
        log_p += step[torch.arange(len(images)), images[:, t]].double()
        h = model.embed_tokens(tokens[:, t:t + 1])
    return ImageLaw(images, log_p.exp(), V)


@pytest.mark.parametrize("mode", ["sjd_coupled", "static_tree"])
def test_exact_modes_sample_the_law_of_ar_with_the_8_bit_cache(mode):
    """A tiny float64 target (2 x 2 codes from 5: 625 images) with the 8-bit cache: coupled SJD and a static tree
    sample whole images by the law of AR with that cache (pooled chi-square)."""
    from lantern_core.config import DrafterConfig, GPTConfig
    from lantern_core.models.drafter import EagleDrafter
    from lantern_core.models.gpt import LlamaGenGPT
    from whole_image_law import pooled_pvalue

    config = GPTConfig(dim=32, n_layer=2, n_head=2, vocab_size=5, model_type="c2i", num_classes=4, cls_token_num=1,
                       grid_size=2, kv_cache="int8")
    model = LlamaGenGPT(config)
    model.init_weights(torch.Generator().manual_seed(0), std=0.3)
    with torch.no_grad():
        model.output.weight.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(1))
    model = model.double().eval()
    drafter = EagleDrafter(DrafterConfig.for_target(config, ffn_dim=48))
    drafter.init_from_target(model, torch.Generator().manual_seed(2), std=0.3)
    drafter = drafter.double().eval()
    sampling = SamplingConfig(cfg_scale=2.0, temperature=1.0)
    law = cached_ar_law(model, 2, sampling)
    assert abs(float(law.probs.sum()) - 1.0) < 1e-5  # the laws are taken in float32, as the decoders take them
    from whole_image_law import image_law

    model.set_kv_cache("auto")  # the law builder is right: with a full-precision cache it is the uncached law
    full = cached_ar_law(model, 2, sampling).probs
    assert torch.allclose(full, image_law(model, 2, sampling).probs, rtol=0, atol=1e-12)
    assert float((full - law.probs).abs().sum()) / 2 > 1e-3  # and the 8-bit cache moves the law (TV 0.009)
    model.set_kv_cache("int8")
    condition, images = Condition.classes([2] * 2500), 2500
    with torch.no_grad():
        if mode == "sjd_coupled":
            tokens = jacobi_generate(model, condition, sampling, JacobiConfig(window=3, coupled=True),
                                     make_generators(7, images, "cpu")).tokens
        else:
            tokens = speculative_generate(model, drafter, condition, sampling,
                                          SpeculativeConfig(tree="static", static_tree=NAIVE_EXTEND_57),
                                          make_generators(7, images, "cpu")).tokens
    p = pooled_pvalue(law, tokens)
    assert p > 1e-3, p
