"""(Coupled) speculative Jacobi decoding is lossless, with uniform, sampled and copied initial drafts: 20,000 whole images (a 2x2 token grid, so every
token of every image counts) from a tiny 8-token model, through the real decoding loop, match the
model's autoregressive joint law by chi-square, under the AR-identical rule (the default) and the residual rule;
the same test rejects a deliberately wrong residual, and a judge that races every position with one noise."""
import pytest
import torch
from scipy.stats import chi2

import lantern_core.decoding.jacobi.judge as jacobi_judge
from lantern_core.conditioning import Condition
from lantern_core.config import GPTConfig, SamplingConfig
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.sampling import NodeDistributions
from tests.tiny_models import random_gpt

SMALL = GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=8, model_type="c2i", num_classes=3, cls_token_num=1,
                  grid_size=2)
SAMPLES, LABEL = 20_000, 1
SAMPLING = SamplingConfig(cfg_scale=2.0, temperature=1.0, top_k=6)


@pytest.fixture(scope="module")
def model():
    return random_gpt(SMALL, seed=3, std=0.25)


def ar_joint(model) -> torch.Tensor:
    """p(x0, x1, x2) (V^3,) under the sampler's CFG and filters, from teacher-forced logits."""
    V = SMALL.vocab_size
    dist = NodeDistributions(SAMPLING, True)
    seqs = torch.cartesian_prod(torch.arange(V), torch.arange(V), torch.arange(V))  # (V^3, 3)
    labels = torch.cat([torch.full((seqs.shape[0],), LABEL), torch.full((seqs.shape[0],), SMALL.num_classes)])
    padded = torch.cat([seqs, torch.zeros(seqs.shape[0], 1, dtype=torch.long)], 1)
    logits = model.training_logits(labels, torch.cat([padded, padded]))  # (2 V^3, 4, V)
    probs = [dist(logits[:, k:k + 1], torch.tensor([k]))[:, 0] for k in range(3)]  # each (V^3, V)
    return probs[0][:, :][torch.arange(seqs.shape[0]), seqs[:, 0]] * probs[1][torch.arange(seqs.shape[0]), seqs[:, 1]] \
        * probs[2][torch.arange(seqs.shape[0]), seqs[:, 2]]


def pvalue(model, config: JacobiConfig, seed: int, samples: int = SAMPLES) -> tuple[float, float]:
    V = SMALL.vocab_size
    with torch.no_grad():
        out = jacobi_generate(model, Condition.classes([LABEL] * samples), SAMPLING, config,
                              torch.Generator().manual_seed(seed))
        expected = ar_joint(model).double() * samples
    x = out.tokens
    counts = torch.bincount((x[:, 0] * V + x[:, 1]) * V + x[:, 2], minlength=V ** 3).double()
    assert (counts[expected == 0] == 0).all(), "a sequence the model cannot produce was emitted"
    small = (expected > 0) & (expected < 5)  # pool sparse cells so the chi-square approximation holds
    big = expected >= 5
    stat = float(((counts[big] - expected[big]) ** 2 / expected[big]).sum())
    pooled_e, pooled_c = float(expected[small].sum()), float(counts[small].sum())
    cells = int(big.sum())
    if pooled_e > 0:
        stat += (pooled_c - pooled_e) ** 2 / pooled_e
        cells += 1
    multi = sum(k * c for k, c in enumerate(out.stats.accepted_histogram)) / max(1, out.stats.iterations)
    return float(chi2.sf(stat, cells - 1)), multi


LOSSLESS = {"sjd": JacobiConfig(window=3), "coupled": JacobiConfig(window=3, coupled=True),
            "sjd repeat_above": JacobiConfig(window=3, init="repeat_above"),
            "coupled sample_left": JacobiConfig(window=3, coupled=True, init="sample_left"),
            # the residual rule (min(1, p/q), a residual draw at the first rejection), kept as an option
            "sjd residual": JacobiConfig(window=3, exact_rule="residual"),
            "coupled residual": JacobiConfig(window=3, coupled=True, exact_rule="residual"),
            "sjd repeat_above residual": JacobiConfig(window=3, init="repeat_above", exact_rule="residual")}


@pytest.mark.parametrize("name", list(LOSSLESS))
def test_jacobi_samples_the_autoregressive_law(model, name):
    p, accepted_per_step = pvalue(model, LOSSLESS[name], seed=5)
    assert accepted_per_step > 0.3, "drafts are rarely accepted: the test would not exercise acceptance"
    assert p > 1e-3, p


@pytest.mark.parametrize("name", ["sjd residual", "coupled residual", "sjd repeat_above residual"])
def test_the_same_test_rejects_a_residual_that_ignores_the_draft(model, name, monkeypatch):
    monkeypatch.setattr(jacobi_judge, "residual_distribution", lambda p, q: p)  # resample from p: biased
    p, _ = pvalue(model, LOSSLESS[name], seed=5, samples=5_000)  # a quarter of the samples already suffices
    assert p < 1e-6, p


def test_the_same_test_rejects_a_judge_that_races_every_position_with_one_noise(model, monkeypatch):
    """The AR-identical judge draws AR's token at each window position with that position's noise; reading the
    noise of the window's first position everywhere (a plausible indexing slip) is not AR's law."""
    import lantern_core.decoding.jacobi.iteration as jacobi_iteration
    real = jacobi_iteration.position_noise
    monkeypatch.setattr(jacobi_iteration, "position_noise",
                        lambda state, positions: real(state, positions[:, :1].expand_as(positions)))
    p, _ = pvalue(model, LOSSLESS["coupled"], seed=5, samples=5_000)
    assert p < 1e-6, p
