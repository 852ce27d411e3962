"""Relaxed 2-D Jacobi (`JacobiConfig.row_commit`): lower rows commit their own accepted drafts
at their own fronts before the frontier arrives. It is lossy by design; what stays exact is tested here.

- Every token the frontier judges is an exact draw given the tokens before it: the frontier's queries see
  the committed prefix and its own window only. Row 0 is all frontier, so its marginal is AR's; the last
  column of every row is always the frontier's (a lower row may commit column c only once the row above
  holds c + row_lead, and a finished row moves the frontier down), so its law given everything before it
  is AR's conditional. A mask that lets the frontier see the rows below fails the same test.
- With a lead no row can meet, nothing is committed early and whole images follow the AR law exactly
  (the raster-slot forward, row-confined frontier and idle lanes change nothing); with lead 0 the same
  chi-square sees the loss, which is why the mode is labelled lossy.
- The row fronts keep their staircase after every iteration; a batch equals single runs with seed + i;
  LANTERN's delta bounds the mass a lower row's relaxed acceptance spends.
"""
from __future__ import annotations

import pytest
import torch

import lantern_core.decoding.jacobi.rows as jacobi_rows
import lantern_core.decoding.jacobi.iteration as jacobi_step
from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.jacobi.rows import row_fronts
from lantern_core.decoding.acceptance.relaxation import Relaxation
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.sampling import NodeDistributions
from lantern_core.errors import ConfigError
from tests.core.test_exactness_whole_images import CFG2, FAIL, LABEL, PASS, law_for, models_for  # noqa: F401
from tests.whole_image_law import ImageLaw, pooled_pvalue
from tests.core.test_jacobi_step import WIDE_C2I
from tiny_models import random_gpt

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread

TOPK2 = SamplingConfig(cfg_scale=2.0, temperature=1.0, top_k=2)
RELAXED = JacobiConfig(1, coupled=True, init="sample_left", rows=2, row_window=2, row_commit=True, row_lead=0)
ROW_CAUSAL = JacobiConfig(1, init="sample_left", rows=3, row_window=2, row_commit=True, row_lead=0, row_causal=True)


@torch.no_grad()
def decode(config: JacobiConfig, sampling: SamplingConfig, images: int, seed: int = 321, weights: str = "C",
           labels: list[int] | None = None) -> torch.Tensor:
    model = models_for(weights)[0]
    labels = labels or [LABEL] * images
    return jacobi_generate(model, Condition.classes(labels), sampling, config, make_generators(seed, len(labels)),
                           compile="off").tokens


def prefix_law(law: ImageLaw, length: int) -> ImageLaw:
    """The law of the first `length` tokens (codes are base-V with position 0 most significant)."""
    V, N = law.vocab, law.images.shape[1]
    return ImageLaw(law.images[:: V ** (N - length), :length], law.probs.view(V ** length, -1).sum(1), V)


@torch.no_grad()
def conditional_table(weights: str, sampling: SamplingConfig, position: int) -> torch.Tensor:
    """(V ** position, V) the sampler's law of token `position` after every context (base-V code), from
    teacher-forced forwards of the model (contexts AR itself would never produce included)."""
    model = models_for(weights)[0]
    V, N = model.config.vocab_size, model.config.num_image_tokens
    law = law_for(weights, sampling)
    contexts = law.images[:: V ** (N - position)]  # (V**position, N): each context, zeros after it
    labels = torch.full((len(contexts),), LABEL)
    tokens = contexts
    if sampling.uses_cfg:
        labels = torch.cat([labels, torch.full_like(labels, model.config.num_classes)])
        tokens = torch.cat([contexts, contexts])
    logits = model.training_logits(labels, tokens)
    dist = NodeDistributions(sampling, sampling.uses_cfg)
    return dist.log_probs(logits[:, position:position + 1], torch.tensor([position]))[:, 0].double().exp()


def conditional_pvalue(weights: str, sampling: SamplingConfig, tokens: torch.Tensor, position: int) -> float:
    """Chi-square of token `position` given the tokens before it: expected counts are each sampled context's
    count times the sampler's conditional there (the contexts' own frequencies are taken as they came)."""
    table = conditional_table(weights, sampling, position)
    V = table.shape[1]
    before = (tokens[:, :position].long() * V ** torch.arange(position - 1, -1, -1)).sum(1)
    frequency = torch.bincount(before, minlength=table.shape[0]).double() / tokens.shape[0]
    law = ImageLaw(torch.empty(0), (frequency[:, None] * table).reshape(-1), V)
    return pooled_pvalue(law, tokens[:, :position + 1])


@pytest.mark.parametrize("config, sampling", [(RELAXED, CFG2), (ROW_CAUSAL, TOPK2)], ids=["raster", "row_causal"])
def test_every_token_the_frontier_judges_is_exact_given_what_precedes_it(config, sampling):
    tokens = decode(config, sampling, 3000)
    law = law_for("C", sampling)
    assert pooled_pvalue(prefix_law(law, 3), tokens[:, :3]) > PASS  # row 0
    for last_column in (5, 8):
        p = conditional_pvalue("C", sampling, tokens, last_column)
        assert p > PASS, f"position {last_column}: p = {p:.3g}"


def test_a_frontier_that_sees_the_rows_below_is_rejected(monkeypatch):
    """The wrong mask: every query sees every key this forward holds, later raster slots included."""
    real_mask = jacobi_rows.raster_mask

    def seeing_below(key_valid, ahead_ok, prefix_end, query_slots, written, blocks, window, row_causal):
        wide = torch.full_like(query_slots, window - 1)
        return real_mask(key_valid, ahead_ok, prefix_end, wide, written, blocks, window, row_causal)

    monkeypatch.setattr(jacobi_step, "raster_mask", seeing_below)
    tokens = decode(RELAXED, CFG2, 3000)
    assert conditional_pvalue("C", CFG2, tokens, 8) < FAIL


def test_without_early_commits_whole_images_follow_the_ar_law_and_with_them_they_do_not():
    never = JacobiConfig(1, coupled=True, init="sample_left", rows=3, row_window=2, row_commit=True, row_lead=64)
    assert pooled_pvalue(law_for("C", CFG2), decode(never, CFG2, 2500)) > PASS
    assert pooled_pvalue(law_for("C", CFG2), decode(RELAXED, CFG2, 2500)) < FAIL


def test_row_fronts_keep_their_staircase_after_every_iteration(monkeypatch):
    lead = 1
    config = JacobiConfig(2, coupled=True, init="sample_left", rows=4, row_window=3, row_commit=True, row_lead=lead)
    real = jacobi_step._row_front_iteration
    seen: list[torch.Tensor] = []

    def watched(ctx, state, window):
        real(ctx, state, window)
        seen.append(state.rows.fixed.clone())

    monkeypatch.setattr(jacobi_step, "_row_front_iteration", watched)
    model = random_gpt(WIDE_C2I, seed=7, std=0.2)  # 10 x 10 tokens
    jacobi_generate(model, Condition.classes([0, 1]), CFG2, config, make_generators(5, 2), compile="off")
    S, N = model.config.row_stride, model.config.num_image_tokens
    early = 0
    for fixed in seen:
        grid = fixed[:, :N].view(fixed.shape[0], -1, S)  # images retire as they finish
        counts = row_fronts(fixed, N, S)
        assert torch.equal(grid.sum(2), counts), "a row committed a cell past its front"
        below, above = counts[:, 1:], counts[:, :-1]
        assert bool(((below == 0) | (below + lead <= above) | (above == S)).all())
        early = max(early, int((below > 0).sum(1).max()))
    assert early >= 2, "lower rows never committed ahead of the frontier"


def test_a_batch_equals_single_runs_and_lanterns_delta_bounds_every_lower_row_acceptance():
    model = models_for("C")[0]
    labels = [LABEL, 0, 1]
    batch = jacobi_generate(model, Condition.classes(labels), TOPK2, ROW_CAUSAL, make_generators(9, 3), compile="off")
    for i, label in enumerate(labels):
        single = jacobi_generate(model, Condition.classes([label]), TOPK2, ROW_CAUSAL, make_generators(9 + i, 1),
                                 compile="off")
        assert torch.equal(batch.tokens[i], single.tokens[0]), i
    delta = 0.2
    model, _, neighbors = models_for("C")
    relaxed = JacobiConfig(2, init="sample_left", rows=3, row_window=2, row_commit=True, row_lead=0,
                           relaxation=Relaxation(k=2, delta=delta))
    result = jacobi_generate(model, Condition.classes([LABEL] * 64), CFG2, relaxed, make_generators(3, 64),
                             neighbors, compile="off")
    assert 0 < result.stats.relaxed_tokens and result.stats.max_absorbed <= delta + 1e-6


def test_row_commit_is_checked_and_described():
    with pytest.raises(ConfigError, match="row_commit"):
        JacobiConfig(4, row_commit=True)
    for bad in (-1, 65, 1.5, True):
        with pytest.raises(ConfigError, match="row_lead"):
            JacobiConfig(4, rows=2, row_commit=True, row_lead=bad)
    text = JacobiConfig(4, rows=3, row_window=5, row_commit=True).describe()
    assert "relaxed 2-D (lossy): 3 rows x w5 lead 1" in text
    assert JacobiConfig(40, rows=3, row_commit=True).largest_window(16) == 15  # the frontier stays in its row


def test_the_auto_geometry_follows_the_cost_curve_and_is_reused():
    from lantern_core.decoding.jacobi.auto import choose_rows
    from lantern_core.decoding.cost_curve import CostCurve

    measured = {(4, 2): 3.0, (6, 6): 5.0, (8, 4): 4.5}
    flat = CostCurve(((1, 1.0), (64, 1.0)), 0.0)  # a GPU: width is free, the most tokens per forward wins
    steep = CostCurve(((1, 1.0), (64, 64.0)), 0.0)  # every token a full step: the narrowest forward wins
    assert (choose_rows(measured, flat, 8).rows, choose_rows(measured, flat, 8).row_window) == (6, 6)
    choice = choose_rows(measured, steep, 8)
    assert (choice.rows, choice.row_window) == (4, 2) and "geometry 4 rows x w2" in choice.note
    model = models_for("C")[0]
    for config in (JacobiConfig("auto", coupled=True, init="sample_left", rows=2, row_commit=True, auto_rows=True),
                   JacobiConfig("auto", coupled=True, init="sample_left", auto_rows=True)):  # lossless: 1-D or 2-D
        runs = [jacobi_generate(model, Condition.classes([LABEL]), CFG2, config, make_generators(6, 1),
                                compile="off") for _ in range(2)]
        assert torch.equal(runs[0].tokens, runs[1].tokens) and runs[0].stats.tree == runs[1].stats.tree
        assert "(auto geometry)" in runs[0].stats.tree and "(auto; geometry " in runs[0].stats.tree
        assert ("relaxed 2-D" in runs[0].stats.tree) == config.row_commit


def test_the_auto_search_decodes_exactly_the_candidates_the_planner_reserves_for(monkeypatch):
    """One rule lists the geometries an auto run may decode with (`candidate_geometries`): the search decodes
    each of them, in order, once (relaxed rows and lossless 2-D alike), and the memory planner reserves for the
    same list (`reservation._dry_jacobi` takes it from there)."""
    import lantern_core.decoding.jacobi.auto as jacobi_auto
    import lantern_core.decoding.reservation as reservation
    from lantern_core.decoding import auto_store
    from lantern_core.decoding.jacobi.config import candidate_geometries

    assert reservation.candidate_geometries is candidate_geometries
    model = models_for("C")[0]
    decoded, real = [], jacobi_auto.decode_batch
    monkeypatch.setattr(jacobi_auto, "decode_batch", lambda m, config, *a: decoded.append(config) or real(m, config, *a))
    monkeypatch.setattr(jacobi_auto, "_WINDOWS", {})  # measured again, not remembered from another test
    monkeypatch.setitem(auto_store._STATE, "path", None)
    for config in (JacobiConfig("auto", coupled=True, init="sample_left", rows=2, row_commit=True, auto_rows=True),
                   JacobiConfig("auto", coupled=True, init="sample_left", auto_rows=True)):
        decoded.clear()
        choice = jacobi_auto.auto_window(model, Condition.classes([LABEL]), CFG2, config, None)
        candidates = candidate_geometries(config, model.config.row_stride)
        assert decoded == candidates and len(candidates) > 1
        assert (choice.rows, choice.row_window) in {(c.rows, c.row_window) for c in candidates}
