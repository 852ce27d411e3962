"""2-D Jacobi drafting is lossless: besides the frontier's window, windows on the image rows
below draft ahead in the same forward, and only the frontier accepts, with the exact rule on the law each
draft was drawn from.

Whole images of the tiny enumerable models of `test_exactness_whole_images.py` (2x2 grid with 5 codes, 3x3 grid
with 3 codes) decoded through `jacobi_generate` match the autoregressive law by a pooled chi-square: coupled
and uncoupled drafts, random / sample-left / repeat-above initialisations, row-causal and raster masks, CFG
on and off, top-k and top-p, several row geometries, and a batch that mixes classes. A control accepts a lower
window's draft at the end of a fully accepted frontier run (before the frontier has tested it), and the same
test rejects it. One row (`rows=1`) gives 1-D Jacobi's tokens exactly, and the geometry is checked.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import lantern_core.decoding.jacobi.iteration as jacobi_step
from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.sampling import make_generators
from lantern_core.errors import ConfigError
from tests.core.test_exactness_whole_images import CFG2, FAIL, LABEL, PASS, law_for, models_for  # noqa: F401
from tests.whole_image_law import pooled_pvalue

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread


@dataclass(frozen=True)
class Case:
    weights: str  # "A"/"B": 2x2 grid, 5 codes; "C": 3x3 grid, 3 codes
    config: JacobiConfig
    sampling: SamplingConfig
    images: int


TOPK2 = SamplingConfig(cfg_scale=2.0, temperature=1.0, top_k=2)
NOCFG_TOPP = SamplingConfig(cfg_scale=1.0, temperature=1.0, top_p=0.9)
CASES = {
    # 2x2: the frontier drafts 1, the next row's window starts right after it (raster offset 1)
    "coupled_2x2_cfg_raster": Case("A", JacobiConfig(1, coupled=True, init="sample_left", rows=2, row_window=1,
                                                     row_offset=-1), CFG2, 3000),
    "sjd_2x2_cfg_row_causal_below": Case("B", JacobiConfig(1, rows=2, row_window=2, row_offset=0, row_causal=True),
                                         SamplingConfig(cfg_scale=3.0, temperature=1.0), 2500),
    # 3x3: two lower rows, a window behind and one below the frontier's column
    "coupled_3x3_topk2_three_rows": Case("C", JacobiConfig(1, coupled=True, init="sample_left", rows=3,
                                                           row_window=2, row_offset=-1), TOPK2, 2500),
    "sjd_3x3_nocfg_topp_repeat_above_row_causal": Case("C", JacobiConfig(2, init="repeat_above", rows=2,
                                                                         row_window=2, row_offset=-1,
                                                                         row_causal=True), NOCFG_TOPP, 2500),
    "coupled_3x3_cfg_random_init": Case("C", JacobiConfig(2, coupled=True, rows=2, row_window=3, row_offset=0),
                                        CFG2, 2000),
    # continuation (SJD-PAC's adaptive continuation as a maximal coupling), 1-D and 2-D, under the residual rule:
    # under the AR-identical rule every draft is already AR's race, so continuation is the sjd cases above
    "continuation_2x2_cfg_1d": Case("A", JacobiConfig(2, continuation=True, init="sample_left", exact_rule="residual"),
                                    CFG2, 3000),
    "continuation_3x3_topk2_2d": Case("C", JacobiConfig(1, continuation=True, init="sample_left", rows=3,
                                                        row_window=2, row_offset=-1, exact_rule="residual"),
                                      TOPK2, 2500),
    "continuation_3x3_nocfg_topp_repeat_above_2d": Case("C", JacobiConfig(2, continuation=True, init="repeat_above",
                                                                          rows=2, row_window=2, row_offset=-1,
                                                                          exact_rule="residual"),
                                                        NOCFG_TOPP, 2500),
}


@torch.no_grad()
def decode(case: Case, labels: list[int] | None = None, seed: int = 321) -> torch.Tensor:
    model = models_for(case.weights)[0]
    labels = labels or [LABEL] * case.images
    return jacobi_generate(model, Condition.classes(labels), case.sampling, case.config,
                           make_generators(seed, len(labels)), compile="off").tokens


@pytest.mark.parametrize("name", sorted(CASES))
def test_2d_jacobi_samples_the_ar_law_over_whole_images(name):
    case = CASES[name]
    p = pooled_pvalue(law_for(case.weights, case.sampling), decode(case))
    assert p > PASS, f"{name}: whole-image chi-square p = {p:.3g}"


def test_a_batch_mixing_classes_keeps_each_class_law():
    """Images of two classes interleaved in one batch, each with its own row fronts: each class's images
    follow that class's law."""
    import tests.core.test_exactness_whole_images as whole

    case = CASES["coupled_3x3_topk2_three_rows"]
    other = 0
    labels = [LABEL, other] * 1500
    tokens = decode(case, labels, seed=77)
    assert pooled_pvalue(law_for(case.weights, case.sampling), tokens[0::2]) > PASS
    law_other = whole.image_law(models_for(case.weights)[0], other, case.sampling)
    assert pooled_pvalue(law_other, tokens[1::2]) > PASS


@pytest.mark.parametrize("rule", ["same_as_ar", "residual"])
def test_accepting_a_lower_window_draft_before_the_frontier_tests_it_is_rejected(monkeypatch, rule):
    """The wrong rule: when the frontier accepts its whole window, the token after the run is the next row's
    window's draft for that position (drafted ahead, never tested) instead of a draw from the target (under the
    AR-identical judge and the residual one)."""
    seen = {}
    real_refill = jacobi_step.refill
    judge_name = "judge_same_as_ar" if rule == "same_as_ar" else "judge_run"
    real_judge = getattr(jacobi_step, judge_name)

    def refill(ctx, state, uniforms):
        seen["state"] = state
        return real_refill(ctx, state, uniforms)

    def judge(*args, **kwargs):
        verdict = real_judge(*args, **kwargs)
        state = seen["state"]
        W = state.drafts.shape[1]
        ahead = state.canvas.gather(1, (state.done + W)[:, None])[:, 0]  # the lower window's draft at offset W
        verdict.token = torch.where(verdict.accepted == W, ahead, verdict.token)
        return verdict

    monkeypatch.setattr(jacobi_step, "refill", refill)
    monkeypatch.setattr(jacobi_step, judge_name, judge)
    case = CASES["sjd_2x2_cfg_row_causal_below"]
    wrong = Case(case.weights, JacobiConfig(1, rows=2, row_window=1, row_offset=-1, row_causal=True, exact_rule=rule),
                 case.sampling, 2500)
    assert pooled_pvalue(law_for(wrong.weights, wrong.sampling), decode(wrong)) < FAIL


def test_a_continuation_that_keeps_every_recorded_draft_is_rejected(monkeypatch):
    """The wrong rule: a draft whose law is recorded is kept as it is (no min(1, p/q) test, no residual), yet
    judged as a draw from the new prediction."""
    real_draw = jacobi_step._draw

    def keep_all(shape, state, probs, positions, uniforms, ring):  # the keep test's uniforms all 0: always kept
        half = uniforms.shape[1] // 2
        return real_draw(shape, state, probs, positions, torch.cat([uniforms[:, :half], 0 * uniforms[:, half:]], 1),
                         ring)

    monkeypatch.setattr(jacobi_step, "_draw", keep_all)
    case = CASES["continuation_2x2_cfg_1d"]
    wrong = Case(case.weights, case.config, case.sampling, 2500)
    assert pooled_pvalue(law_for(wrong.weights, wrong.sampling), decode(wrong)) < FAIL


def test_one_row_is_1d_jacobi_and_more_rows_change_the_forward_only():
    """rows=1 gives the 1-D decoder's tokens bit for bit (the same draws, the same forward); greedy 2-D gives
    greedy 1-D's image (the frontier decides every token; lower windows only propose)."""
    model = models_for("C")[0]
    labels = [LABEL, 0, 1]
    plain = JacobiConfig(2, coupled=True, init="sample_left")
    one_row = JacobiConfig(2, coupled=True, init="sample_left", rows=1, row_window=5)
    run = lambda config, sampling: jacobi_generate(model, Condition.classes(labels), sampling, config,  # noqa: E731
                                                   make_generators(4, 3), compile="off").tokens
    assert torch.equal(run(plain, CFG2), run(one_row, CFG2))
    greedy = SamplingConfig(cfg_scale=2.0, temperature=0.0)
    two_d = JacobiConfig(2, coupled=True, init="sample_left", rows=3, row_window=2, row_offset=-1)
    assert torch.equal(run(plain, greedy), run(two_d, greedy))


def test_row_geometry_is_checked_and_described():
    config = JacobiConfig(8, rows=2, row_window=4)
    assert config.column_offset == -5 and config.far_starts(8, 16) == (11,)
    assert JacobiConfig(4, rows=3, row_window=6, row_offset=-7).far_starts(4, 16) == (9, 18)
    with pytest.raises(ConfigError, match="row geometry"):
        config.far_starts(12, 16)  # the next row's window would start inside the frontier's
    with pytest.raises(ConfigError, match="row geometry"):
        JacobiConfig(2, rows=3, row_window=6, row_offset=-12).far_starts(2, 16)  # rows 1 and 2 would overlap
    for bad in (dict(rows=0), dict(rows=9), dict(row_window=0), dict(row_offset=1.5), dict(rows=True)):
        with pytest.raises(ConfigError):
            JacobiConfig(4, **bad)
    assert "2-D: 2 rows x w4 offset -5" in config.describe()
    assert JacobiConfig(8, rows=2).largest_window(16) == 11 and JacobiConfig(8).largest_window(16) == 32


def test_image_i_of_a_2d_batch_equals_a_single_run_with_seed_plus_i():
    model = models_for("C")[0]
    config = JacobiConfig(1, coupled=True, init="sample_left", rows=3, row_window=2, row_offset=-1)
    labels = [LABEL, 0, 1, LABEL]
    batch = jacobi_generate(model, Condition.classes(labels), TOPK2, config, make_generators(9, 4), compile="off")
    for i, label in enumerate(labels):
        single = jacobi_generate(model, Condition.classes([label]), TOPK2, config, make_generators(9 + i, 1),
                                 compile="off")
        assert torch.equal(batch.tokens[i], single.tokens[0]), i
