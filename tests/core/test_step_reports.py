"""Every run says how its decode steps ran (`GenerationStats.steps`, a `StepExecution`), so a fallback cannot pass
for a measurement: eager by choice on the CPU ("off"); every iteration counted across the eager runners a batch
loop switches to as images finish; a capture that failed (stood in for on the CPU: the capture raises nothing,
it records nothing) reported by AR, tree and Jacobi runs, by the node's payload and text and by `summary()`;
and the benchmark rows' fields made from it."""
from __future__ import annotations

import logging
import math

import pytest
import torch

from lantern_core.benchmarks import iteration_cost
from lantern_core.benchmarks.report_writer import merged_steps, step_cells, step_fields
from lantern_core.conditioning import Condition
from lantern_core.config import GPTConfig, SamplingConfig
from lantern_core.decoding import step_graphs
from lantern_core.decoding.generate import generate
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.report import fallback_text, stats_payload, stats_text
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.step_graphs import StepExecution
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.specs import NAIVE_EXTEND_57
from lantern_core.decoding.trees.driver import speculative_generate
from tiny_models import TINY_C2I, random_drafter, random_gpt

C2I = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=48, model_type="c2i", num_classes=5, cls_token_num=1,
                grid_size=6)
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)


@pytest.fixture(scope="module")
def models():
    model = random_gpt(C2I, seed=4)
    return model, random_drafter(model, seed=3)


def decode(model, drafter, labels, mode: str, compile: str = "off"):
    condition, generators = Condition.classes(labels), make_generators(40, len(labels))
    with torch.no_grad():
        if mode == "ar":
            return generate(model, condition, SAMPLED, generators[0] if len(labels) == 1 else generators,
                            compile=compile)
        if mode == "sjd":
            return jacobi_generate(model, condition, SAMPLED, JacobiConfig(window=6), generators, compile=compile)
        return speculative_generate(model, drafter, condition, SAMPLED, SpeculativeConfig(static_tree=NAIVE_EXTEND_57),
                                    generators, compile=compile)


def test_an_eager_run_reports_its_steps_as_off_and_says_nothing_more():
    model = random_gpt(TINY_C2I, seed=0)
    stats = decode(model, None, [0], "ar").stats
    assert stats.steps == StepExecution(requested=False, replayed=0, eager=TINY_C2I.num_image_tokens - 1)
    assert stats.to_dict()["steps"] == {"graphs": "off", "replayed": 0, "eager": 15, "compile": "off",
                                        "fell_back": False, "capture_error": ""}
    payload = stats_payload(decode(model, None, [0], "ar"), "ar", "-", "none", ["0"])
    assert payload["steps"]["graphs"] == "off" and not payload["steps"]["fell_back"]
    assert "fell back" not in stats_text(payload) and "FELL BACK" not in stats.summary()


@pytest.mark.parametrize("mode", ["static_tree", "sjd"])
def test_a_batch_counts_every_iteration_across_the_runners_it_switches_to(models, mode):
    """On the CPU images that are done leave the batch and the loop steps through a new, smaller eager runner:
    the run's steps are every iteration of every runner (one per target forward after the prefill)."""
    model, drafter = models
    stats = decode(model, drafter, [0, 3, 3, 1], mode).stats
    iterations = [p["iterations"] for p in stats.per_image]
    assert len(set(iterations)) > 1, iterations  # images finished apart: the loop switched runners
    assert stats.steps == StepExecution(eager=stats.batch_forwards - 1)
    assert stats.steps.graphs == "off" and not stats.steps.fell_back


@pytest.fixture
def failing_capture(monkeypatch):
    """Graphs asked for on the CPU ("auto" captures), and every capture failing as on a GPU that asserts: the
    runner keeps no graph and its error, and steps eagerly."""
    def capture_variants(runner, variants, reset, device):
        runner.capture_error = "RuntimeError: use_count > 0 INTERNAL ASSERT FAILED (stand-in)"
        reset(None)

    monkeypatch.setattr(step_graphs, "uses_graphs", lambda choice, device: choice in ("auto", "graphs"))
    monkeypatch.setattr(step_graphs, "capture_variants", capture_variants)


@pytest.mark.parametrize("mode", ["ar", "static_tree", "sjd"])
def test_a_failed_capture_is_reported_as_a_fallback(models, failing_capture, caplog, mode):
    model, drafter = models
    with caplog.at_level(logging.WARNING, logger="lantern_core.step_graphs"):
        result = decode(model, drafter, [2], mode, compile="auto")
    step_graphs.release(model)
    steps = result.stats.steps
    # every step after the prefill (a captured batch loop runs one spare iteration after the last image is done)
    forwards = getattr(result.stats, "batch_forwards", result.stats.forward_passes) - 1
    assert steps == StepExecution(requested=True, replayed=0, eager=forwards, compile="off",
                                  capture_error="RuntimeError: use_count > 0 INTERNAL ASSERT FAILED (stand-in)")
    assert steps.graphs == "none" and steps.fell_back
    assert sum("CAPTURE FALLBACK" in r.getMessage() for r in caplog.records) == 1  # said once, not per step
    assert "FELL BACK to eager" in result.stats.summary()
    payload = stats_payload(result, mode, "-", "d", ["2"])
    assert payload["steps"] == {"graphs": "none", "replayed": 0, "eager": forwards, "compile": "off",
                                "fell_back": True, "capture_error": steps.capture_error}
    text = stats_text(payload)
    assert text.startswith(f"{mode}: 1 x 36 tokens")
    assert f"; fell back to eager for {forwards} of {forwards} steps (not replayed from a CUDA graph)" in text
    assert "capture failed: RuntimeError: use_count > 0" in text and text.endswith("same tokens, slower")


def test_fallback_words_for_a_partial_replay_and_a_failed_compile():
    partial = StepExecution(requested=True, replayed=250, eager=5, compile="inductor")
    assert fallback_text(partial.to_dict()).startswith("; fell back to eager for 5 of 255 steps")
    compile_failed = StepExecution(requested=True, replayed=255, compile="failed")
    assert compile_failed.graphs == "all" and compile_failed.fell_back
    words = fallback_text(compile_failed.to_dict())
    assert "fell back to uncompiled steps (the Inductor compile failed)" in words and "eager for" not in words
    assert fallback_text(StepExecution(requested=True, replayed=255).to_dict()) == ""
    assert fallback_text({}) == ""  # a payload from before the steps were reported


def test_benchmark_row_fields():
    replayed = StepExecution(requested=True, replayed=10, compile="inductor")
    assert step_fields(replayed) == {"graphs": "all", "compiled": "inductor", "fell_back": False}
    both = merged_steps([replayed, StepExecution(requested=True, replayed=3, eager=2)])
    assert step_fields(both) == {"graphs": "partial", "compiled": "inductor", "fell_back": True}
    assert step_fields(merged_steps([])) == {"graphs": "off", "compiled": "off", "fell_back": False}
    assert step_cells(step_fields(both)) == "partial (FELL BACK) | inductor"
    assert step_cells({}) == " | "


def test_iteration_cost_times_each_compile_choice_that_runs_differently():
    """Where nothing captures (CPU) graphs, off and auto are one eager run, measured once; on CUDA each is timed.
    A row's `graphs` covers its graphs and auto runs, never its eager one."""
    def fake(choice, steps):
        return iteration_cost.Timing({"graphs": 2.0, "off": 4.0, "auto": 1.0}[choice], 0.5, steps)

    seen = []
    cpu = iteration_cost.timings(lambda c: seen.append(c) or fake(c, StepExecution()), iteration_cost.COMPILES,
                                 torch.device("cpu"))
    assert seen == ["off"] and {c: t.ms for c, t in cpu.items()} == {"graphs": 4.0, "off": 4.0, "auto": 4.0}
    seen.clear()
    ran = {"graphs": StepExecution(requested=True, replayed=9), "off": StepExecution(eager=9),
           "auto": StepExecution(requested=True, replayed=4, eager=5, compile="failed")}
    cuda = iteration_cost.timings(lambda c: seen.append(c) or fake(c, ran[c]), iteration_cost.COMPILES,
                                  torch.device("cuda"))
    assert seen == ["graphs", "off", "auto"]
    ar = {c: iteration_cost.Timing(1.0, 0.1, ran[c]) for c in ran}
    row = iteration_cost.cost_row("m", "w", 8, cuda, ar)
    assert (row.ms_per_iteration, row.eager_ms_per_iteration, row.auto_ms_per_iteration) == (2.0, 4.0, 1.0)
    assert (row.vs_ar_step, row.auto_vs_ar_step, row.auto_warmup_s) == (2.0, 1.0, 0.5)
    assert (row.graphs, row.compiled, row.fell_back) == ("partial", "failed", True)
    only_graphs = iteration_cost.cost_row("m", "w", 8, {"graphs": cuda["graphs"]}, ar)
    assert (only_graphs.graphs, only_graphs.compiled, only_graphs.fell_back) == ("all", "off", False)
    assert math.isnan(only_graphs.auto_ms_per_iteration) and math.isnan(only_graphs.eager_vs_ar_step)


def test_the_stats_say_when_a_mode_gives_ar_s_image_for_the_seed():
    from lantern_core.config import SamplingConfig
    from lantern_core.decoding.acceptance.relaxation import Relaxation
    from lantern_core.decoding.jacobi.config import JacobiConfig
    from lantern_core.decoding.report import same_image_as_ar, stats_text
    from lantern_core.decoding.trees.config import SpeculativeConfig
    sampled, greedy = SamplingConfig(), SamplingConfig(temperature=0.0)
    assert same_image_as_ar(SpeculativeConfig(), sampled)
    assert same_image_as_ar(SpeculativeConfig(relaxation=Relaxation(k=4, lam=1.0)), sampled)
    assert not same_image_as_ar(SpeculativeConfig(exact_rule="residual"), sampled)
    assert not same_image_as_ar(SpeculativeConfig(relaxation=Relaxation(k=4, delta=0.1)), sampled)
    assert same_image_as_ar(SpeculativeConfig(exact_rule="residual"), greedy)
    assert same_image_as_ar(JacobiConfig(8), sampled) and same_image_as_ar(JacobiConfig(8), greedy)
    assert not same_image_as_ar(JacobiConfig(8, exact_rule="residual"), sampled)
    assert same_image_as_ar(JacobiConfig(8, continuation=True), sampled)  # its drafts are AR's race
    assert same_image_as_ar(JacobiConfig(8, coupled=True, proactive=4), sampled)
    assert not same_image_as_ar(JacobiConfig(8, continuation=True, exact_rule="residual"), sampled)
    assert not same_image_as_ar(JacobiConfig(8, proactive=4, exact_rule="residual"), sampled)
    assert same_image_as_ar(JacobiConfig(8, continuation=True, exact_rule="residual"), greedy)
    assert not same_image_as_ar(JacobiConfig(8, rows=2, row_commit=True), sampled)  # relaxed 2-D: lossy
    assert not same_image_as_ar(SpeculativeConfig(), sampled, torch.bfloat16)  # half precision rounds otherwise
    model = random_gpt(TINY_C2I)
    result = decode(model, random_drafter(model), [0], "static_tree")
    assert "same image as ar" in stats_text(stats_payload(result, "static_tree", "-", "d", ["0"], same_as_ar=True))
    assert "same image as ar" not in stats_text(stats_payload(result, "static_tree", "-", "d", ["0"]))
