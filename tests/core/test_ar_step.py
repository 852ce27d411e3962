"""The static-shape AR step (`decoding/ar_step.py`) and its runners (`decoding/step_graphs.py`): the same
tokens as a step-by-step reference, graph-safe randomness, a step that traces with
`torch.compile(fullgraph=True)` and never recompiles after warm-up, and the capture registry's rules
(reuse, re-capture when weights move, release, eager fallback). CUDA-only checks are marked `cuda`."""
from __future__ import annotations

import logging

import pytest
import torch

import lantern_core.decoding.generate as generate_module
from lantern_core.conditioning import Condition
from lantern_core.config import GPTConfig, SamplingConfig
from lantern_core.decoding import step_graphs
from lantern_core.decoding.ar_step import (SLOT_BUCKET, ARShape, ar_step,
                                           window_for, windows)
from lantern_core.decoding.generate import eager_ar_runner, generate, reset_for_warmup
from lantern_core.decoding.acceptance.position_noise import key_tensor
from lantern_core.decoding.sampling import combine_cfg, make_generators, pick_tokens
from lantern_core.errors import ConfigError
from lantern_core.models.gpt import ForwardStep
from stand_in_graphs import use_stand_in_graphs
from tiny_models import TINY_C2I, random_gpt

# 12 x 12 = 144 tokens: three attention windows (64, 128, 145 slots)
WIDE_C2I = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=48, model_type="c2i", num_classes=5,
                     cls_token_num=1, grid_size=12)
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20, top_p=0.95)


@torch.no_grad()
def reference_tokens(model, labels: list[int], sampling: SamplingConfig, seed: int) -> torch.Tensor:
    """The pre-step decoder's loop, kept as the oracle: a cache sliced to the slots written so far, one
    `pick_tokens` draw per step keyed by the per-sample generators' seeds and the position."""
    generators = make_generators(seed, len(labels))
    condition = Condition.classes(labels)
    prefix = model.embed_condition(torch.cat([condition.labels, torch.full_like(condition.labels, 5)]))
    rows, T = prefix.shape[0], prefix.shape[1]
    n = model.config.num_image_tokens
    cache = model.allocate_cache(rows, T + n)
    positions = torch.arange(T)
    hidden = model(prefix, ForwardStep(positions, cache, kv_len=T, mask=None))
    tokens = []
    for i in range(n):
        if i:
            fed = torch.cat([tokens[-1], tokens[-1]])[:, None]
            pos = T + i - 1
            hidden = model(model.embed_tokens(fed), ForwardStep(positions.new_tensor([pos]), cache, kv_len=pos + 1))
        logits = combine_cfg(model.logits(hidden[:, -1]), sampling.cfg_scale)
        tokens.append(pick_tokens(logits, sampling, generators, position=i))
    return torch.stack(tokens, dim=1)


@pytest.mark.parametrize("sampling", [SAMPLED, SamplingConfig(cfg_scale=3.0, temperature=0.0)],
                         ids=["sampled", "greedy"])
def test_step_loop_matches_the_step_by_step_reference(sampling):
    model = random_gpt(WIDE_C2I, seed=3)
    for seed in range(4):
        labels = [seed % 5, (seed + 2) % 5]
        expected = reference_tokens(model, labels, sampling, seed)
        got = generate(model, Condition.classes(labels), sampling, make_generators(seed, 2), compile="off").tokens
        assert torch.equal(got, expected), seed


def test_keys_come_from_seeds_not_stream_state():
    """Image i's key is its generator's seed: a used generator gives the same key, a shared generator gives
    seed + i, and a per-image list of the wrong length is refused."""
    gens = make_generators(7, 3)
    before = key_tensor(gens, 3, "cpu")
    for g in gens:
        torch.rand(5, generator=g)  # advancing the stream changes nothing
    assert torch.equal(key_tensor(gens, 3, "cpu"), before)
    assert torch.equal(key_tensor(torch.Generator().manual_seed(7), 3, "cpu"), before)
    assert len(set(before.tolist())) == 3
    with pytest.raises(ValueError, match="one per sample"):
        key_tensor(make_generators(0, 2), 3, "cpu")


def test_attention_windows_cover_every_slot_in_few_shapes():
    slots = 1 + 144
    assert windows(slots) == [64, 128, 145]
    for slot in range(slots):
        w = window_for(slot, slots)
        assert slot < w <= slots and (w % SLOT_BUCKET == 0 or w == slots)


def test_batch_image_i_equals_a_single_run_with_seed_plus_i():
    model = random_gpt(WIDE_C2I, seed=1)
    batch = generate(model, Condition.classes([0, 1, 2]), SAMPLED, make_generators(10, 3)).tokens
    for i in range(3):
        single = generate(model, Condition.classes([i]), SAMPLED, make_generators(10 + i, 1)).tokens
        assert torch.equal(batch[i], single[0]), i


def test_step_compiles_fullgraph_and_an_image_decodes_without_recompiling(monkeypatch):
    """torch.compile(fullgraph=True) raises on any graph break, so this proves nothing in the step blocks
    capture; `error_on_recompile` after a warm-up image proves the shapes and guards are static."""
    import torch._dynamo

    torch._dynamo.reset()
    model = random_gpt(WIDE_C2I, seed=2)
    compiled = torch.compile(ar_step, fullgraph=True, backend="aot_eager", dynamic=False)
    # the windowed steps a capturing device runs (a CPU run slices the cache exactly, one shape per token)
    monkeypatch.setattr(step_graphs, "uses_graphs", lambda choice, device: choice == "auto")
    eager = [generate(model, Condition.classes([c]), SAMPLED, make_generators(c, 1), compile="off").tokens
             for c in (1, 4)]
    monkeypatch.setattr(generate_module, "ar_step", compiled)
    warm = generate(model, Condition.classes([1]), SAMPLED, make_generators(1, 1), compile="off").tokens
    assert torch.equal(warm, eager[0])
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = generate(model, Condition.classes([4]), SAMPLED, make_generators(4, 1), compile="off").tokens
    assert torch.equal(again, eager[1])
    torch._dynamo.reset()


def test_compile_choice_is_validated():
    model = random_gpt(TINY_C2I)
    with pytest.raises(ConfigError, match="compile"):
        generate(model, Condition.classes([0]), SAMPLED, make_generators(0, 1), compile="max")


def test_registry_reuses_a_runner_and_captures_again_when_weights_move(monkeypatch):
    use_stand_in_graphs(monkeypatch, step_graphs)
    model = random_gpt(TINY_C2I)
    shape = ARShape(1, 17, 16, SAMPLED)
    first = step_graphs.runner_for(model, ("ar", shape), lambda: eager_ar_runner(model, shape), windows(17), reset_for_warmup, "cpu")
    assert first.captured and first.shared and list(first.graphs) == [17]
    assert step_graphs.runner_for(model, ("ar", shape), lambda: eager_ar_runner(model, shape), [17], reset_for_warmup, "cpu") is first
    assert step_graphs.cached_runners(model) == 1
    model.double()  # new storage: every address the graphs replay is stale
    second = step_graphs.runner_for(model, ("ar", shape), lambda: eager_ar_runner(model, shape), [17], reset_for_warmup, "cpu")
    assert second is not first and first.buffers.cache.keys.numel() == 0  # the stale runner was released
    assert step_graphs.release(model) == 1 and step_graphs.cached_runners(model) == 0
    assert second.buffers.cache.keys.numel() == 0


def test_registry_keeps_what_fits_its_byte_budget_least_recently_used_out(monkeypatch):
    use_stand_in_graphs(monkeypatch, step_graphs)
    model = random_gpt(TINY_C2I)
    made = {}
    for batch in range(1, 5):
        shape = ARShape(batch, 17, 16, SAMPLED)
        made[batch] = step_graphs.runner_for(model, ("ar", shape), lambda: eager_ar_runner(model, shape), [17],
                                             reset_for_warmup, "cpu")
        if batch == 2:  # room for the two largest so far, and no more
            monkeypatch.setattr(step_graphs, "BUDGET_BYTES", made[1].held_bytes + made[2].held_bytes)
    kept = step_graphs.runners_of(model)
    assert kept == [made[4]] and not made[1].captured  # batch 3 and 4 each outgrew room for an older shape
    assert step_graphs.held_bytes(model) == made[4].held_bytes  # the newest stays, even alone over budget
    again = step_graphs.runner_for(model, ("ar", ARShape(1, 17, 16, SAMPLED)), lambda: eager_ar_runner(model, ARShape(1, 17, 16, SAMPLED)),
                                   [17], reset_for_warmup, "cpu")
    assert again is not made[1] and step_graphs.runners_of(model) == [again]  # LRU: batch 4 went for it
    step_graphs.release(model)


def test_capture_failure_falls_back_to_eager_with_one_warning(monkeypatch, caplog):
    def broken(step, device, pool=None):
        raise RuntimeError("operation not permitted when stream is capturing")

    use_stand_in_graphs(monkeypatch, step_graphs)
    monkeypatch.setattr(step_graphs, "capture", broken)
    model = random_gpt(TINY_C2I)
    shape = ARShape(1, 17, 16, SAMPLED)
    with caplog.at_level(logging.WARNING, logger="lantern_core.step_graphs"):
        runner = step_graphs.runner_for(model, ("ar", shape), lambda: eager_ar_runner(model, shape), [17], reset_for_warmup, "cpu")
    assert not runner.captured
    assert [r.message for r in caplog.records if "capture failed" in r.message] and len(caplog.records) == 1
    before = runner.buffers.index.item()
    runner.run(17)  # eager on the same buffers
    assert runner.buffers.index.item() == before + 1
    step_graphs.release(model)


def test_generate_through_a_replaying_runner_gives_the_eager_tokens(monkeypatch):
    """The captured path's control flow (registry, reset, replay per window) on the CPU, with stand-in graphs:
    the same tokens as eager, and the runner is reused for a second image."""
    use_stand_in_graphs(monkeypatch, step_graphs)
    monkeypatch.setattr(step_graphs, "uses_graphs", lambda choice, device: choice == "auto")
    model = random_gpt(WIDE_C2I, seed=5)
    for seed in (0, 1):
        labels = [seed, 3]
        eager = generate(model, Condition.classes(labels), SAMPLED, make_generators(seed, 2), compile="off").tokens
        replayed = generate(model, Condition.classes(labels), SAMPLED, make_generators(seed, 2), compile="auto")
        assert torch.equal(replayed.tokens, eager), seed
    assert step_graphs.cached_runners(model) == 1
    (runner,) = step_graphs.runners_of(model)
    assert sorted(runner.graphs) == [64, 128, 192] and sum(g.replays for g in runner.graphs.values()) > 0
    step_graphs.release(model)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_tokens_equal_eager_and_capture_is_reused(dtype):
    model = random_gpt(WIDE_C2I, seed=4).to("cuda", dtype)
    for seed in range(3):
        labels = [seed, 4]
        gens = lambda: make_generators(seed, 2, "cuda")  # noqa: E731
        eager = generate(model, Condition.classes(labels, device="cuda"), SAMPLED, gens(), compile="off").tokens
        graph = generate(model, Condition.classes(labels, device="cuda"), SAMPLED, gens(), compile="auto").tokens
        assert torch.equal(graph, eager), seed
    assert step_graphs.cached_runners(model) == 1
    (runner,) = step_graphs.runners_of(model)
    assert runner.captured
    assert step_graphs.release(model) == 1
