"""Proactive drafting (`jacobi/proactive.py`) is lossless: K candidates at each of the frontier's
first D positions, a leaf taken only where it is AR's own draw (the AR-identical rule, the default) or judged
by recursive rejection sampling (the residual rule), with a passing leaf's key moved into the chain.

Whole images of the tiny enumerable models (2x2 grid with 5 codes, 3x3 grid with 3 codes) decoded through
`jacobi_generate` match the autoregressive law by a pooled chi-square: uncoupled, coupled and continued drafts,
random / sample-left / repeat-above initialisations, CFG on and off, top-k and top-p, 1-D and lossless 2-D
windows, and a batch that mixes classes, under both rules. Three wrong variants of the residual rule fail the
same test: leaves judged against p
instead of the residual the earlier candidates left, a leaf's key left in its scratch slot, and the token
after a leaf drawn from the chain's prediction. The leaves' own law (Gumbel-top-k without candidate 0) is
checked against the enumerated without-replacement law; greedy proactive decoding gives greedy AR's image;
leaves are accepted in real runs; a batch equals single runs with seed + i.
"""
from __future__ import annotations

import pytest
import torch

import lantern_core.decoding.jacobi.proactive as jacobi_proactive
import lantern_core.decoding.jacobi.iteration as jacobi_step
from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.decoding.generate import generate
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.jacobi.shape import JacobiShape
from lantern_core.decoding.acceptance.relaxation import Relaxation
from lantern_core.decoding.sampling import make_generators
from lantern_core.errors import ConfigError
from tests.core.test_jacobi_2d import NOCFG_TOPP, TOPK2, Case, decode  # the 2-D suite's cases and decoder
from tests.core.test_exactness_whole_images import CFG2, FAIL, LABEL, PASS, law_for, models_for  # noqa: F401
from tests.tiny_models import TINY_C2I, random_gpt
from tests.whole_image_law import pooled_pvalue

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread


CASES = {
    "sjd_2x2_cfg_random_k3_d2": Case("A", JacobiConfig(2, proactive=3, proactive_depth=2), CFG2, 3000),
    "coupled_2x2_cfg_k4_d3": Case("B", JacobiConfig(3, coupled=True, init="sample_left", proactive=4,
                                                    proactive_depth=3), CFG2, 3000),
    "coupled_3x3_topk2_k3_d1": Case("C", JacobiConfig(1, coupled=True, init="sample_left", proactive=3,
                                                      proactive_depth=1), TOPK2, 2500),
    "sjd_3x3_nocfg_topp_repeat_above_k2_d2": Case("C", JacobiConfig(2, init="repeat_above", proactive=2,
                                                                    proactive_depth=2), NOCFG_TOPP, 2500),
    "continuation_2x2_cfg_k3_d2": Case("A", JacobiConfig(2, continuation=True, init="sample_left", proactive=3,
                                                         proactive_depth=2), CFG2, 3000),
    "coupled_3x3_2d_row_causal_k3_d2": Case("C", JacobiConfig(2, coupled=True, init="sample_left", rows=2,
                                                              row_window=2, row_offset=-1, row_causal=True,
                                                              proactive=3, proactive_depth=2), CFG2, 2500),
    # the residual rule (recursive rejection sampling among the candidates), kept as an option
    "residual_coupled_2x2_cfg_k4_d3": Case("B", JacobiConfig(3, coupled=True, init="sample_left", proactive=4,
                                                             proactive_depth=3, exact_rule="residual"), CFG2, 3000),
    "residual_continuation_2x2_cfg_k3_d2": Case("A", JacobiConfig(2, continuation=True, init="sample_left",
                                                                  proactive=3, proactive_depth=2,
                                                                  exact_rule="residual"), CFG2, 3000),
    "residual_sjd_3x3_nocfg_topp_repeat_above_k2_d2": Case("C", JacobiConfig(2, init="repeat_above", proactive=2,
                                                                             proactive_depth=2, exact_rule="residual"),
                                                           NOCFG_TOPP, 2500),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_proactive_drafting_samples_the_ar_law_over_whole_images(name):
    case = CASES[name]
    p = pooled_pvalue(law_for(case.weights, case.sampling), decode(case))
    assert p > PASS, f"{name}: whole-image chi-square p = {p:.3g}"


def test_a_batch_mixing_classes_keeps_each_class_law():
    import tests.core.test_exactness_whole_images as whole

    case = CASES["coupled_3x3_topk2_k3_d1"]
    labels = [LABEL, 0] * 1500
    tokens = decode(case, labels, seed=77)
    assert pooled_pvalue(law_for(case.weights, case.sampling), tokens[0::2]) > PASS
    assert pooled_pvalue(whole.image_law(models_for(case.weights)[0], 0, case.sampling), tokens[1::2]) > PASS


def _judged_against_p(real):
    def wrong(p, log_q, children, uniforms, valid=None, *args, **kwargs):
        """Every candidate tested against p itself (not the residual the earlier ones left), law q."""
        verdict = real(p, log_q, children, uniforms, valid, *args, **kwargs)
        ok = (uniforms * log_q.exp().gather(1, children) < p.gather(1, children)) & valid
        verdict.accepted = torch.where(ok.any(-1), ok.float().argmax(-1), torch.full_like(verdict.accepted, -1))
        return verdict
    return wrong


def _key_left_in_scratch(real):
    return lambda cache, length, verdict, chain_queries: None


def _token_from_the_chain(real):
    def wrong(p, p_leaves, *args, **kwargs):
        """The token after an accepted leaf drawn from the chain's prediction at that depth + 1 (which saw
        candidate 0, not the leaf)."""
        D = args[2].shape[1]  # leaves (G, D, K-1)
        chain = p[:, 1:D + 1].repeat_interleave(p_leaves.shape[1] // D, 1)  # (G, S, V) by leaf
        return real(p, chain, *args, **kwargs)
    return wrong


@pytest.mark.parametrize("wrong", [("accept_siblings", _judged_against_p), ("move_leaf_key", _key_left_in_scratch),
                                   ("judge_with_leaves", _token_from_the_chain)], ids=lambda w: w[0])
def test_the_same_test_rejects_a_wrong_leaf_rule(monkeypatch, wrong):
    """Wrong variants of the residual rule's leaf judge (the AR-identical judge's control, a leaf taken without
    being AR's draw, is in tests/core/test_same_as_ar.py)."""
    name, make = wrong
    module = jacobi_proactive if name == "accept_siblings" else jacobi_step
    monkeypatch.setattr(module, name, make(getattr(module, name)))
    case = Case("A", JacobiConfig(2, coupled=True, init="sample_left", proactive=4, proactive_depth=2,
                                  exact_rule="residual"), CFG2, 3000)
    assert pooled_pvalue(law_for(case.weights, case.sampling), decode(case)) < FAIL


def test_leaves_follow_the_without_replacement_law():
    """Candidate 0 drawn from q, then `draw_leaves` with fresh Gumbel noise: the ordered triple (x0, x1, x2)
    has probability q(x0) q(x1) / (1 - q(x0)) q(x2) / (1 - q(x0) - q(x1)), over every ordered triple."""
    from scipy.stats import chisquare

    g = torch.Generator().manual_seed(3)
    q = torch.tensor([0.45, 0.25, 0.15, 0.1, 0.05])
    n, V = 60000, q.numel()
    shape = JacobiShape(1, 64, 16, CFG2, JacobiConfig(2, proactive=3, proactive_depth=1))
    x0 = torch.multinomial(q, n, replacement=True, generator=g)
    u = torch.rand(n, 1, V, generator=g).clamp(1e-20, 1 - 1e-7)
    leaves = jacobi_proactive.draw_leaves(shape, q.expand(n, 1, V), x0[:, None], -(-u.log()).log())
    assert (leaves != x0[:, None]).all() and (leaves[:, 0] != leaves[:, 1]).all()
    code = (x0 * V + leaves[:, 0]) * V + leaves[:, 1]
    observed = torch.bincount(code, minlength=V ** 3).double()
    a, b, c = torch.meshgrid(torch.arange(V), torch.arange(V), torch.arange(V), indexing="ij")
    qd = q.double()
    law = qd[a] * qd[b] / (1 - qd[a]) * qd[c] / (1 - qd[a] - qd[b])
    law = torch.where((a != b) & (b != c) & (a != c), law, torch.zeros_like(law)).reshape(-1)
    keep = law > 0
    assert observed[~keep].sum() == 0
    assert chisquare(observed[keep], law[keep] / law[keep].sum() * n).pvalue > PASS
    greedy = jacobi_proactive.draw_leaves(shape, q.expand(1, 1, V), torch.tensor([[0]]), None)
    assert greedy.tolist() == [[1, 2]]  # greedy: the next most likely tokens


@pytest.mark.parametrize("init", ["random", "repeat_above"])
def test_greedy_proactive_decoding_equals_greedy_ar(init):
    model = random_gpt(TINY_C2I, seed=5)
    cond = Condition.classes([2, 4])
    sampling = SamplingConfig(cfg_scale=3.0, cfg_interval=5, temperature=0.0)
    ar = generate(model, cond, sampling)
    for coupled in (False, True):
        config = JacobiConfig(3, coupled, init, proactive=3, proactive_depth=2)
        assert torch.equal(jacobi_generate(model, cond, sampling, config, make_generators(1, 2)).tokens, ar.tokens)


@pytest.mark.parametrize("rule,judge", [("same_as_ar", "judge_leaves_same_as_ar"), ("residual", "judge_with_leaves")])
def test_leaves_are_accepted_and_a_batch_equals_single_runs(monkeypatch, rule, judge):
    taken = []
    real = getattr(jacobi_step, judge)

    def spy(*args, **kwargs):
        verdict = real(*args, **kwargs)
        taken.append(int((verdict.leaf >= 0).sum()))
        return verdict

    monkeypatch.setattr(jacobi_step, judge, spy)
    model = models_for("C")[0]
    config = JacobiConfig(2, coupled=True, init="sample_left", proactive=3, proactive_depth=2, exact_rule=rule)
    labels = [LABEL, 0, 1, LABEL]
    batch = jacobi_generate(model, Condition.classes(labels), TOPK2, config, make_generators(9, 4), compile="off")
    for i, label in enumerate(labels):
        single = jacobi_generate(model, Condition.classes([label]), TOPK2, config, make_generators(9 + i, 1),
                                 compile="off")
        assert torch.equal(batch.tokens[i], single.tokens[0]), i
    many = jacobi_generate(model, Condition.classes([LABEL] * 200), CFG2, config, make_generators(1, 200), compile="off")
    assert sum(taken) > 0 and many.stats.forward_passes > 0


def test_proactive_settings_are_checked_and_described():
    config = JacobiConfig(8, proactive=4, proactive_depth=3)
    assert config.leaves(8) == 9 and config.leaves(2) == 6 and JacobiConfig(8).leaves(8) == 0
    assert "proactive 4 x depth 3" in config.describe()
    for bad in (dict(proactive=0), dict(proactive=9), dict(proactive_depth=0), dict(proactive=True),
                dict(proactive=3, relaxation=Relaxation(k=4, lam=2.0)),
                dict(proactive=3, rows=2, row_commit=True)):
        with pytest.raises(ConfigError, match="proactive"):
            JacobiConfig(4, **bad)
