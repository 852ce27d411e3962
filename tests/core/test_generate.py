"""AR generation: the cached loop equals a from-scratch recompute, seeds, CFG, batching, t2i masks."""
import copy

import pytest
import torch

from tiny_models import TINY_C2I, TINY_GQA, random_gpt
from tolerances import assert_close_to_reference, float64_copy, model_tolerance
from lantern_core.conditioning import Condition, build_prefix
from lantern_core.config import SamplingConfig
from lantern_core.decoding.generate import generate
from lantern_core.models.gpt import ForwardStep
from lantern_core.models.kv_cache import attention_mask
from lantern_core.decoding.sampling import combine_cfg, make_generators, pick_tokens


def recompute_tokens(model, condition, sampling, generators):
    """Reference AR sampler: no KV cache, the whole sequence re-run for every token."""
    guided = sampling.uses_cfg
    prefix = build_prefix(model, condition, guided)
    rows, T = prefix.key_valid.shape
    tokens = torch.empty(condition.batch, 0, dtype=torch.long)
    for i in range(model.config.num_image_tokens):
        fed = torch.cat([tokens, tokens]) if guided else tokens
        h = torch.cat([prefix.embeddings, model.embed_tokens(fed)], dim=1)
        S = h.shape[1]
        key_valid = torch.ones(rows, S, dtype=torch.bool)
        key_valid[:, :T] = prefix.key_valid
        positions = torch.arange(S)
        with torch.no_grad():
            logits = model.logits(model(h, ForwardStep(positions, mask=attention_mask(key_valid, positions, S)))[:, -1])
        if guided:
            logits = combine_cfg(logits, sampling.cfg_scale) if sampling.cfg_active(i) else logits.chunk(2)[0]
        tokens = torch.cat([tokens, pick_tokens(logits, sampling, generators, position=i)[:, None]], dim=1)
    return tokens


SETTINGS = [
    SamplingConfig(cfg_scale=1.0, temperature=1.0),
    SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=10),
    SamplingConfig(cfg_scale=2.0, temperature=0.7, top_p=0.8),
    SamplingConfig(cfg_scale=4.0, temperature=0.0),
    SamplingConfig(cfg_scale=4.0, cfg_interval=2, temperature=1.0),
]


@pytest.mark.parametrize("sampling", SETTINGS, ids=lambda s: f"cfg{s.cfg_scale}-T{s.temperature}-k{s.top_k}-p{s.top_p}-i{s.cfg_interval}")
@pytest.mark.parametrize("config", [TINY_C2I, TINY_GQA], ids=["mha", "gqa"])
def test_kv_cached_generation_equals_full_recompute(config, sampling):
    model = random_gpt(config)
    condition = Condition.classes([0, 3])
    fast = generate(model, condition, sampling, make_generators(7, 2)).tokens
    slow = recompute_tokens(model, condition, sampling, make_generators(7, 2))
    assert torch.equal(fast, slow)
    assert fast.shape == (2, config.num_image_tokens)


def test_t2i_with_left_padded_captions_equals_recompute(t2i_model):
    g = torch.Generator().manual_seed(0)
    caption = torch.randn(2, 6, 24, generator=g)
    mask = torch.tensor([[False, False, True, True, True, True], [False] * 5 + [True]])
    caption = caption * mask[:, :, None]
    condition = Condition(caption=caption, caption_mask=mask)
    sampling = SamplingConfig(cfg_scale=3.0, temperature=1.0)
    fast = generate(t2i_model, condition, sampling, make_generators(3, 2)).tokens
    slow = recompute_tokens(t2i_model, condition, sampling, make_generators(3, 2))
    assert torch.equal(fast, slow)


def test_t2i_padded_positions_are_invisible(t2i_model):
    mask = torch.tensor([[False, False, False, True, True, True]])
    caption = torch.randn(1, 6, 24, generator=torch.Generator().manual_seed(1))
    noisy = caption.clone()
    noisy[:, :3] = 100.0  # garbage under the padding must not change anything
    sampling = SamplingConfig(cfg_scale=2.0, temperature=0.0)
    a = generate(t2i_model, Condition(caption=caption, caption_mask=mask), sampling).tokens
    b = generate(t2i_model, Condition(caption=noisy, caption_mask=mask), sampling).tokens
    assert torch.equal(a, b)
    unmasked = generate(t2i_model, Condition(caption=noisy, caption_mask=torch.ones_like(mask)), sampling).tokens
    assert not torch.equal(a, unmasked)  # the check above can fail: without the mask the garbage is seen


def test_training_logits_follow_the_caption_mask(t2i_model):
    """Teacher forcing over a left-padded caption with its mask gives the logits of cached decoding (prefill,
    then one token per step) at every image position; without the mask the padded keys leak in."""
    from lantern_core.decoding.generate import prefill

    mask = torch.tensor([[False, False, True, True, True, True], [False] * 5 + [True], [True] * 6])
    caption = torch.randn(3, 6, 24, generator=torch.Generator().manual_seed(4)) * 3
    tokens = torch.randint(0, t2i_model.config.vocab_size, (3, t2i_model.config.num_image_tokens),
                           generator=torch.Generator().manual_seed(5))
    exact = float64_copy(t2i_model)  # cached decoding in float64 is the reference: no CPU's BLAS in the check
    prefix = build_prefix(exact, Condition(caption=caption.double(), caption_mask=mask), guided=False)
    N, T = tokens.shape[1], prefix.key_valid.shape[1]
    cache = exact.allocate_cache(3, T + N)
    key_valid = torch.ones(3, T + N, dtype=torch.bool)
    key_valid[:, :T] = prefix.key_valid
    with torch.no_grad():
        cached = [exact.logits(prefill(exact, prefix, cache, key_valid)[:, -1])]
        for i in range(N - 1):
            slot = torch.tensor([T + i])
            step = ForwardStep(slot, cache, kv_len=T + i + 1, mask=attention_mask(key_valid, slot, T + i + 1))
            cached.append(exact.logits(exact(exact.embed_tokens(tokens[:, i:i + 1]), step))[:, -1])
        cached = torch.stack(cached, 1)  # (3, N, V) float64
        masked = t2i_model.training_logits(caption, tokens, caption_mask=mask)
        unmasked = t2i_model.training_logits(caption, tokens)
    tol = model_tolerance(masked.dtype, t2i_model.config, extra=3)  # outside the layers: caption MLP, head
    assert_close_to_reference(masked, cached, tol)
    leak = (unmasked[:2].double() - cached[:2]).abs().max()
    assert leak > 100 * tol * cached.abs().max()  # the padded rows differ without it, far beyond the tolerance
    assert_close_to_reference(unmasked[2], cached[2], tol)  # an unpadded caption needs no mask


def test_t2i_unconditional_rows_use_uncond_embedding(t2i_model):
    t2i_model = copy.deepcopy(t2i_model)  # changed below: the session fixture is read-only
    caption = torch.randn(1, 6, 24, generator=torch.Generator().manual_seed(2))
    condition = Condition(caption=caption)
    guided, plain = SamplingConfig(cfg_scale=5.0, temperature=0.0), SamplingConfig(cfg_scale=1.0, temperature=0.0)
    before_guided = generate(t2i_model, condition, guided).tokens
    before_plain = generate(t2i_model, condition, plain).tokens
    with torch.no_grad():
        t2i_model.cls_embedding.uncond_embedding.mul_(-3.0)
    assert not torch.equal(generate(t2i_model, condition, guided).tokens, before_guided)
    assert torch.equal(generate(t2i_model, condition, plain).tokens, before_plain)


def test_same_seed_same_tokens_and_different_seed_differs(c2i_model):
    sampling = SamplingConfig(cfg_scale=2.0)
    cond = Condition.classes([1])
    a = generate(c2i_model, cond, sampling, make_generators(11, 1)).tokens
    b = generate(c2i_model, cond, sampling, make_generators(11, 1)).tokens
    c = generate(c2i_model, cond, sampling, make_generators(12, 1)).tokens
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_batch_of_n_equals_n_single_runs(c2i_model):
    sampling = SamplingConfig(cfg_scale=3.0, top_k=20)
    labels = [0, 4, 2, 2]
    batch = generate(c2i_model, Condition.classes(labels), sampling, make_generators(100, 4)).tokens
    for i, label in enumerate(labels):
        single = generate(c2i_model, Condition.classes([label]), sampling, make_generators(100 + i, 1)).tokens
        assert torch.equal(batch[i], single[0]), i


def test_cfg_one_equals_conditional_only_model(c2i_model):
    """Guidance 1.0 must reproduce sampling from the conditional logits alone (no null-class influence)."""
    c2i_model = copy.deepcopy(c2i_model)  # changed below: the session fixture is read-only
    sampling = SamplingConfig(cfg_scale=1.0, temperature=1.0)
    cond = Condition.classes([2, 3])
    tokens = generate(c2i_model, cond, sampling, make_generators(5, 2)).tokens
    with torch.no_grad():  # the null class row changes: results must not
        c2i_model.cls_embedding.embedding_table.weight[-1].mul_(-5.0)
    assert torch.equal(generate(c2i_model, cond, sampling, make_generators(5, 2)).tokens, tokens)
    logits = torch.randn(4, 48)
    assert torch.allclose(combine_cfg(logits, 1.0), logits[:2], atol=1e-6)
    assert torch.allclose(combine_cfg(logits, 3.0), logits[2:] + 3.0 * (logits[:2] - logits[2:]))


def test_stats_count_forward_passes_and_time(c2i_model):
    result = generate(c2i_model, Condition.classes([0]), SamplingConfig(cfg_scale=2.0))
    stats = result.stats
    assert stats.forward_passes == TINY_C2I.num_image_tokens
    assert stats.image_tokens == 16 and stats.batch == 1
    assert stats.wall_time_s > 0 and stats.tokens_per_s > 0
    assert stats.mean_accepted_length == 1.0
    assert stats.kv_cache_bytes == 2 * 2 * 2 * 4 * (1 + 16) * 16 * 4  # K+V, layers, rows, heads, slots, dim, fp32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_generation_runs_and_stays_in_vocab(c2i_model, dtype):
    model = copy.deepcopy(c2i_model).to(dtype)  # .to changes a module in place
    result = generate(model, Condition.classes([0, 1]), SamplingConfig(cfg_scale=2.0), make_generators(0, 2))
    assert result.tokens.dtype == torch.long
    assert int(result.tokens.min()) >= 0 and int(result.tokens.max()) < TINY_C2I.vocab_size


def test_step_callback_reports_progress(c2i_model):
    seen = []
    def record(done, total, tokens):
        seen.append((done, total))
        assert (tokens[:, :done] >= 0).all()

    result = generate(c2i_model, Condition.classes([0]), SamplingConfig(), on_step=record)
    assert seen == [(i, 16) for i in range(1, 17)]
    assert result.tokens.shape == (1, 16)


def test_an_exception_in_the_callback_stops_generation(c2i_model):
    class Stop(Exception):
        pass

    def stop_at_five(done, total, tokens):
        if done == 5:
            raise Stop

    caches = []
    original = type(c2i_model).allocate_cache

    def spy(self, *args, **kwargs):
        caches.append(original(self, *args, **kwargs))
        return caches[-1]

    type(c2i_model).allocate_cache = spy
    try:
        with pytest.raises(Stop):
            generate(c2i_model, Condition.classes([0]), SamplingConfig(), on_step=stop_at_five)
    finally:
        type(c2i_model).allocate_cache = original
    assert len(caches) == 1 and caches[0].keys.numel() == 0  # the KV cache was released on the way out


def test_acceptance_grid_is_all_ones_for_ar(c2i_model):
    result = generate(c2i_model, Condition.classes([0, 1]), SamplingConfig())
    assert result.acceptance_grid(1) == [[1] * 4] * 4


def test_bad_class_label_is_a_clear_error(c2i_model):
    from lantern_core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"class label.*0\.\.4"):
        generate(c2i_model, Condition.classes([7]), SamplingConfig())
