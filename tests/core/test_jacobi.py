"""Speculative Jacobi decoding (groundwork for issue 5): greedy SJD reproduces greedy AR token for token
(c2i and left-padded t2i, windows 1..16, CFG interval); a seed reproduces its image; a batch equals single
runs with seed + i; coupled drafts raise acceptance; bad windows name the parameter."""
import pytest
import torch

from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.errors import ConfigError
from lantern_core.generate import generate
from lantern_core.jacobi import JacobiConfig, jacobi_generate
from lantern_core.sampling import make_generators
from tests.tiny_models import TINY_C2I, TINY_T2I, random_gpt


def conditions(kind):
    if kind == "c2i":
        return random_gpt(TINY_C2I, seed=5), Condition.classes([2, 4])
    g = torch.Generator().manual_seed(9)
    mask = torch.tensor([[False, False, True, True, True, True], [True] * 6])
    return random_gpt(TINY_T2I, seed=5), Condition(caption=torch.randn(2, 6, 24, generator=g), caption_mask=mask)


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
@pytest.mark.parametrize("window", [1, 3, 16])
def test_greedy_jacobi_equals_greedy_ar(kind, window):
    model, cond = conditions(kind)
    sampling = SamplingConfig(cfg_scale=3.0, cfg_interval=5, temperature=0.0)
    ar = generate(model, cond, sampling)
    for coupled in (False, True):
        out = jacobi_generate(model, cond, sampling, JacobiConfig(window, coupled))
        assert torch.equal(out.tokens, ar.tokens)
        assert out.stats.forward_passes <= ar.stats.forward_passes * cond.batch


def test_same_seed_same_tokens_and_batch_equals_single_runs():
    model, cond = conditions("c2i")
    sampling = SamplingConfig(cfg_scale=2.0, temperature=1.0)
    config = JacobiConfig(6, coupled=True)
    a = jacobi_generate(model, cond, sampling, config, make_generators(7, 2))
    b = jacobi_generate(model, cond, sampling, config, make_generators(7, 2))
    assert torch.equal(a.tokens, b.tokens)
    single = jacobi_generate(model, Condition.classes([4]), sampling, config, make_generators(8, 1))
    assert torch.equal(single.tokens[0], a.tokens[1])
    assert sum(a.stats.accepted_histogram) == a.stats.iterations == a.stats.forward_passes - 2


def test_bad_window_names_the_parameter():
    with pytest.raises(ConfigError, match="jacobi window"):
        JacobiConfig(window=0)
