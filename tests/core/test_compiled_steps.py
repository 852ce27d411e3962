"""compile = "auto" on CUDA fuses each step with Inductor inside our own graph capture. The
compiled layout (one variant attending over the whole cache, the step wrapped by `compiled_step`) is run here
on the CPU with Inductor's C++ back end: the same greedy tokens as eager, one compile reused by a second image,
and a step that fails to compile falls back with one warning instead of failing the image."""
from __future__ import annotations

import logging

import pytest
import torch

from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.decoding import step_graphs
from lantern_core.decoding.generate import generate
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.step_graphs import COMPILE_CHOICES, RunLayout, check_compile, compiled_step, layout_for
from lantern_core.errors import ConfigError
from test_tree_step import WIDE_C2I
from tiny_models import TINY_C2I, random_gpt

GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)


@pytest.fixture
def compiled_everywhere(monkeypatch):
    """The CUDA layout of compile "auto" on this CPU: graphs (their capture fails here: one warning, then the
    runner steps eagerly on the same buffers) with every step compiled by Inductor."""
    monkeypatch.setattr(step_graphs, "uses_graphs", lambda choice, device: choice in ("auto", "graphs"))
    monkeypatch.setattr(step_graphs, "uses_inductor", lambda choice, device: choice == "auto")


def test_compile_choices_and_layouts():
    assert COMPILE_CHOICES == ("auto", "graphs", "off")
    with pytest.raises(ConfigError, match="compile"):
        check_compile("inductor")
    cpu = torch.device("cpu")
    assert layout_for("auto", cpu) == layout_for("graphs", cpu) == layout_for("off", cpu) == RunLayout(False, True, False)


def test_an_inductor_compiled_ar_step_gives_the_eager_tokens_and_is_compiled_once(compiled_everywhere, caplog):
    torch._dynamo.reset()
    model = random_gpt(TINY_C2I, seed=3)
    eager = generate(model, Condition.classes([1, 4]), GREEDY, make_generators(0, 2), compile="off").tokens
    with caplog.at_level(logging.INFO, logger="lantern_core.step_graphs"):
        first = generate(model, Condition.classes([1, 4]), GREEDY, make_generators(0, 2), compile="auto").tokens
        second = generate(model, Condition.classes([2, 0]), GREEDY, make_generators(5, 2), compile="auto").tokens
    assert torch.equal(first, eager)
    assert torch.equal(second, generate(model, Condition.classes([2, 0]), GREEDY, make_generators(5, 2),
                                        compile="off").tokens)
    compiles = [r for r in caplog.records if "compiling the ar step" in r.getMessage()]
    assert len(compiles) == 1  # the runner (and its compiled step) is reused by the second image
    assert not [r for r in caplog.records if "could not compile" in r.getMessage()]  # Inductor really ran
    assert step_graphs.cached_runners(model) == 1
    step_graphs.release(model)
    torch._dynamo.reset()


def test_the_first_compile_is_announced_to_the_listener_and_a_failing_listener_is_harmless():
    seen = []
    run = compiled_step(lambda variant: variant + 1, "probe")
    with step_graphs.reporting(seen.append):
        assert run(1) == 2 and run(1) == 2
    assert len(seen) == 1 and "compiling the probe step" in seen[0]
    with step_graphs.reporting(lambda text: 1 / 0):
        assert compiled_step(lambda variant: variant * 2, "probe")(3) == 6
    torch._dynamo.reset()


def test_a_step_that_fails_to_compile_runs_as_it_is_with_one_warning(caplog):
    calls = []

    def step(variant):
        calls.append(variant)
        if torch.compiler.is_compiling():
            raise RuntimeError("not compilable")  # stands in for an Inductor failure
        return variant

    run = compiled_step(step, "test")
    with caplog.at_level(logging.WARNING, logger="lantern_core.step_graphs"):
        assert run(3) == 3 and run(4) == 4
    warnings = [r for r in caplog.records if "could not compile" in r.getMessage()]
    assert len(warnings) == 1 and calls[-2:] == [3, 4]
    torch._dynamo.reset()


def test_every_runner_shape_compiles_on_its_own_past_dynamos_recompile_limit(monkeypatch, caplog):
    """Every runner's step is a lambda from one source line; Dynamo keeps compiled graphs per code object, so
    without a code object per shape the ninth shape of a session would hit the recompile limit and run
    uncompiled. Twelve shapes here (the compiler back end swapped for Dynamo's cheapest: the guards and the
    limit are Dynamo's, whatever the back end)."""
    monkeypatch.setattr(step_graphs, "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    buffers = [torch.zeros(n + 1) for n in range(12)]
    steps = [compiled_step((lambda buf: lambda variant: buf.add_(variant))(buf), "probe") for buf in buffers]
    with caplog.at_level(logging.WARNING, logger="lantern_core.step_graphs"):
        for step in steps:
            step(1.0), step(2.0)
    assert not [r for r in caplog.records if "could not compile" in r.getMessage()]
    assert all(torch.equal(buf, torch.full_like(buf, 3.0)) for buf in buffers)
    torch._dynamo.reset()


def test_a_compiled_bfloat16_step_gives_the_eager_tokens(compiled_everywhere):
    """Inductor itself (not `aot_eager`, which keeps eager numerics), in bfloat16, sampling: every token of a
    100-token image equals eager's for two seeds. Inductor keeps fused intermediates in float32 unless told to
    round where eager rounds (`inductor_options`); without that the tokens part within a few steps."""
    torch._dynamo.reset()
    model = random_gpt(WIDE_C2I, seed=7).to(torch.bfloat16)
    sampling = SamplingConfig(cfg_scale=3.0, temperature=1.0)
    for seed in (0, 1):
        decode = lambda compile: generate(model, Condition.classes([1, 3]), sampling, make_generators(seed, 2),  # noqa: E731
                                          compile=compile).tokens
        assert torch.equal(decode("auto"), decode("off")), seed
    step_graphs.release(model)
    torch._dynamo.reset()


def test_held_bytes_count_what_cached_runners_keep(monkeypatch):
    """Captured runners keep their buffers between runs; `held_bytes` counts them (each storage once), and
    `release` gives them back (the sampler does so before refusing a run that would not fit otherwise)."""
    from stand_in_graphs import use_stand_in_graphs

    use_stand_in_graphs(monkeypatch, step_graphs)
    monkeypatch.setattr(step_graphs, "uses_graphs", lambda choice, device: choice in ("auto", "graphs"))
    model = random_gpt(TINY_C2I, seed=3)
    assert step_graphs.held_bytes(model) == 0
    generate(model, Condition.classes([1, 4]), GREEDY, make_generators(0, 2), compile="graphs")
    (runner,) = step_graphs.runners_of(model)
    cache = runner.buffers.cache
    held = step_graphs.held_bytes(model)
    assert cache.nbytes <= held < cache.nbytes + 64 * 1024  # the cache and a few small tables
    assert step_graphs.release(model) == 1 and step_graphs.held_bytes(model) == 0


def test_grid_views_reuse_their_captured_steps_and_go_with_the_model(monkeypatch):
    """A size other than the model's own decodes through a grid view (`with_grid`). The same size gives the
    same view, so its captured steps serve every later run of that size (a new view per run would capture
    again and keep the old runners alive, unseen); releasing the model releases its views' steps too."""
    from dataclasses import replace

    from stand_in_graphs import use_stand_in_graphs

    use_stand_in_graphs(monkeypatch, step_graphs)
    monkeypatch.setattr(step_graphs, "uses_graphs", lambda choice, device: choice in ("auto", "graphs"))
    model = random_gpt(replace(TINY_C2I, rope_dims=1), seed=3)
    view = model.with_grid(3, 5)
    assert model.with_grid(3, 5) is view and model.with_grid(5, 3) is not view and view.config.num_image_tokens == 15
    for seed in (0, 1):
        generate(model.with_grid(3, 5), Condition.classes([1]), GREEDY, make_generators(seed, 1), compile="graphs")
    assert step_graphs.cached_runners(view) == 1 and step_graphs.held_bytes(model) == step_graphs.held_bytes(view) > 0
    assert step_graphs.release(model) == 1 and step_graphs.cached_runners(view) == 0
