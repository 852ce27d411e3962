"""Sampling: LlamaGen's filter order, inverse-CDF sampling that matches the distribution (and a
deliberately broken sampler that the same test rejects), per-sample generators."""
import pytest
import torch

from lantern_core.config import SamplingConfig
from lantern_core.errors import ConfigError
from lantern_core.decoding.sampling import (draw_uniforms, filter_logits, make_generators, pick_tokens,
                                   probs_from_logits, sample_from_probs)

CHI2_CRIT_DF5_P001 = 20.515  # chi-square critical value, 5 degrees of freedom, alpha = 0.001


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = counts.sum()
    keep = probs > 0
    expected = probs[keep] * n
    return float(((counts[keep] - expected) ** 2 / expected).sum())


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0, 0.5]])
    out = filter_logits(logits, 1.0, top_k=2)
    assert torch.isfinite(out).tolist() == [[False, True, False, True, False]]
    assert torch.equal(logits, torch.tensor([[0.1, 3.0, -1.0, 2.0, 0.5]]))  # input untouched


def test_top_p_keeps_the_first_token_crossing_the_threshold():
    probs = torch.tensor([[0.05, 0.5, 0.25, 0.2]])
    out = filter_logits(probs.log(), 1.0, top_p=0.6)  # sorted: 0.5, 0.25 (cum 0.75 crosses 0.6) -> keep both
    assert torch.isfinite(out).tolist() == [[False, True, True, False]]
    out = filter_logits(probs.log(), 1.0, top_p=0.45)  # 0.5 alone crosses 0.45 -> keep just it
    assert torch.isfinite(out).tolist() == [[False, True, False, False]]


def test_order_is_temperature_then_top_k_then_top_p():
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    # top-k 2 renormalises to (0.571, 0.429); top-p 0.5 then keeps only the first. The other order keeps two.
    out = filter_logits(probs.log(), 1.0, top_k=2, top_p=0.5)
    assert torch.isfinite(out).sum() == 1
    hot = filter_logits(probs.log(), 2.0)
    assert torch.allclose(hot, probs.log() / 2.0)


def test_sampler_matches_the_distribution_and_a_broken_one_fails():
    probs = torch.tensor([0.3, 0.0, 0.25, 0.05, 0.15, 0.0, 0.25])
    n = 20000
    g = torch.Generator().manual_seed(1234)
    uniforms = torch.rand(n, generator=g)
    tokens = sample_from_probs(probs.expand(n, -1), uniforms)
    counts = torch.bincount(tokens, minlength=7).float()
    assert counts[1] == 0 and counts[5] == 0  # zero-probability tokens are never drawn
    assert chi_square(counts, probs) < CHI2_CRIT_DF5_P001
    broken = torch.bincount(torch.multinomial(probs.sqrt(), n, replacement=True, generator=g), minlength=7).float()
    assert chi_square(broken, probs) > CHI2_CRIT_DF5_P001  # the test has power against a wrong rule


def test_pick_tokens_greedy_is_argmax_and_ignores_generators():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(pick_tokens(logits, SamplingConfig(temperature=0.0), None), logits.argmax(-1))


def test_per_row_generators_reproduce_single_streams():
    gens = make_generators(5, 3)
    u = draw_uniforms(gens, 3, torch.device("cpu"))
    for i in range(3):
        assert u[i] == torch.rand(1, generator=torch.Generator().manual_seed(5 + i))[0]
    top = make_generators(2**64 - 1, 2)  # ComfyUI seeds go up to 2**64 - 1; the next sample wraps to 0
    assert torch.rand(1, generator=top[1]) == torch.rand(1, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="one per sample"):
        draw_uniforms(make_generators(0, 2), 3, torch.device("cpu"))


def test_probs_sum_to_one_and_respect_filters():
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(3))
    probs = probs_from_logits(logits, SamplingConfig(temperature=0.8, top_k=10, top_p=0.9))
    assert torch.allclose(probs.sum(-1), torch.ones(4))
    assert ((probs > 0).sum(-1) <= 10).all()


@pytest.mark.parametrize("kwargs,name", [({"temperature": -1.0}, "temperature"), ({"top_k": -3}, "top_k"),
                                         ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
                                         ({"cfg_scale": float("nan")}, "cfg_scale")])
def test_bad_sampling_parameters_name_the_parameter(kwargs, name):
    with pytest.raises(ConfigError, match=f"Invalid {name}: expected"):
        SamplingConfig(**kwargs)


def test_cfg_interval_follows_llamagen():
    s = SamplingConfig(cfg_scale=4.0, cfg_interval=2)
    assert [s.cfg_active(i) for i in range(6)] == [True, True, True, True, False, False]
    assert not SamplingConfig(cfg_scale=1.0).cfg_active(0)


@pytest.mark.cuda
def test_the_same_seed_gives_the_same_image_on_cuda_run_after_run():
    """The float64 inverse CDF: CUDA's scan may round differently run to run, which must not change a draw."""
    from lantern_core.conditioning import Condition
    from lantern_core.decoding.generate import generate
    from lantern_core.decoding.sampling import make_generators
    from lantern_core.loading.embedded import load_embedded

    model = load_embedded("cuda", torch.bfloat16).gpt.model
    config = SamplingConfig(cfg_scale=3.0, temperature=1.0)
    runs = [generate(model, Condition.classes([0, 3], device="cuda"), config, make_generators(7, 2, "cuda"),
                     compile=compile).tokens for compile in ("off", "off", "auto", "auto")]
    assert all(torch.equal(runs[0], r) for r in runs[1:])
