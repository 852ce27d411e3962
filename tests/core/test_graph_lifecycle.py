"""The captured steps' lifecycle over a whole session: the sequences a ComfyUI user runs on one loaded model
(modes alternated, drafters joined and unloaded, weights moved, models switched and freed, a capture that
fails), each checked twice: on the CPU against `CudaStandIn` (PyTorch's graph-pool, stream and cuBLAS-workspace
rules, enforced) and, marked `cuda`, on a real GPU. Every sequence must capture every runner it asks for (no
fallback), replay the eager tokens and give memory back; on the code before this lifecycle (one pool per
model, shared default capture stream, registry values holding their keys) each of them failed.
"""
from __future__ import annotations

import gc
import logging
import weakref

import pytest
import torch

from cuda_stand_in import CudaStandIn, USE_COUNT_ASSERT
from lantern_core.conditioning import Condition
from lantern_core.config import GPTConfig, SamplingConfig
from lantern_core.decoding import step_graphs
from lantern_core.decoding.capture import graph_capture
from lantern_core.decoding.generate import generate
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.step_graphs import StepRunner
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.specs import NAIVE_EXTEND_57
from lantern_core.decoding.trees.driver import speculative_generate
from tiny_models import random_drafter, random_gpt

C2I = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=48, model_type="c2i", num_classes=5, cls_token_num=1,
                grid_size=6)  # 36 tokens
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)
TREE = SpeculativeConfig(static_tree=NAIVE_EXTEND_57)
SJD = JacobiConfig(window=6)


class Session:
    """One backend for the sequences: the stand-in on the CPU, or the real GPU."""

    def __init__(self, kind: str, monkeypatch, caplog, devices: int = 1, clear_workspaces_at_reset: bool = False):
        self.kind, self.caplog = kind, caplog
        self.cuda = None
        if kind == "stand_in":
            self.cuda = CudaStandIn(monkeypatch, devices=devices, clear_workspaces_at_reset=clear_workspaces_at_reset)
            self.cuda.__enter__()
            monkeypatch.setattr(step_graphs, "uses_graphs", lambda choice, device: choice in ("auto", "graphs"))
            monkeypatch.setattr(step_graphs, "uses_inductor", lambda choice, device: False)
            self.static = step_graphs.static_only()  # CPU tensors: no early-exit host reads, as on a GPU
            self.static.__enter__()
        monkeypatch.setattr(graph_capture, "_STREAMS", {})
        self.device = "cpu" if kind == "stand_in" else "cuda"
        caplog.set_level(logging.INFO, logger="lantern_core.step_graphs")

    def close(self) -> None:
        if self.cuda is not None:
            self.static.__exit__(None, None, None)
            self.cuda.__exit__(None, None, None)

    def model(self, seed: int = 4):
        return random_gpt(C2I, seed=seed).to(self.device)

    def drafter(self, model, seed: int = 3):
        return random_drafter(model, seed=seed).to(self.device)

    def compile(self) -> str:
        return "graphs"

    def fallbacks(self) -> list[str]:
        return [r.getMessage() for r in self.caplog.records if "FALLBACK" in r.getMessage()
                or "capture failed" in r.getMessage()]

    def assert_clean(self) -> None:
        assert self.fallbacks() == []
        if self.cuda is not None:
            assert self.cuda.failures == [], self.cuda.failures

    def reserved(self) -> int:
        return torch.cuda.memory_reserved(0)


@pytest.fixture(params=["stand_in", pytest.param("cuda", marks=pytest.mark.cuda)])
def session(request, monkeypatch, caplog):
    made = Session(request.param, monkeypatch, caplog)
    yield made
    made.close()


def _ar(session, model, seed=0, batch=1, compile=None):
    labels = [(seed + i) % 5 for i in range(batch)]
    return generate(model, Condition.classes(labels, device=session.device), SAMPLED,
                    make_generators(seed, batch, session.device), compile=compile or session.compile())


def _tree(session, model, drafter, seed=0, compile=None):
    return speculative_generate(model, drafter, Condition.classes([seed % 5], device=session.device), SAMPLED, TREE,
                                make_generators(seed, 1, session.device), compile=compile or session.compile())


def _sjd(session, model, seed=0, compile=None):
    return jacobi_generate(model, Condition.classes([seed % 5], device=session.device), SAMPLED, SJD,
                           make_generators(seed, 1, session.device), compile=compile or session.compile())


def _same_as_eager(session, run, *args, seed=0, **kwargs):
    captured = run(session, *args, seed=seed, **kwargs)
    eager = run(session, *args, seed=seed, compile="off", **kwargs)
    assert torch.equal(captured.tokens, eager.tokens)
    return captured


def _runner(model, kind: str) -> StepRunner:
    (found,) = [r for key, r in ((k, r) for k, r in _items(model)) if key[0][0] == kind]
    return found


def _items(model):
    return list(step_graphs.runners_by_key(model).items())


def _all_captured(model) -> bool:
    runners = step_graphs.runners_of(model)
    return bool(runners) and all(r.captured and not r.capture_error for r in runners)


def test_ar_tree_ar_sjd_tree_on_one_model_stays_captured(session):
    """A user's evening: AR, then LANTERN++-style trees with a drafter, AR again, SJD, trees again."""
    _evening(session)


def test_the_evening_also_holds_where_a_graph_reset_clears_the_workspaces(monkeypatch, caplog):
    session = Session("stand_in", monkeypatch, caplog, clear_workspaces_at_reset=True)
    try:
        _evening(session)
    finally:
        session.close()


def _evening(session) -> None:
    model = session.model()
    drafter = session.drafter(model)
    _same_as_eager(session, _ar, model)
    ar = _runner(model, "ar")
    _same_as_eager(session, _tree, model, drafter)
    tree = _runner(model, "tree")
    _same_as_eager(session, _ar, model, seed=1)
    assert _runner(model, "ar") is ar  # a drafter joining never released the AR runner
    _same_as_eager(session, _sjd, model)
    _same_as_eager(session, _tree, model, drafter, seed=2)
    assert _runner(model, "tree") is tree and _runner(model, "ar") is ar  # alternated modes stay captured
    assert _all_captured(model) and step_graphs.cached_runners(model) == 3
    session.assert_clean()
    assert step_graphs.release(model) == 3


def test_an_eviction_while_another_runner_lives_then_a_replay(session, monkeypatch):
    model = session.model()
    _ar(session, model, batch=1)
    one = step_graphs.runners_of(model)[0]
    monkeypatch.setattr(step_graphs, "BUDGET_BYTES", raising=False, value=int(1.5 * one.held_bytes))  # room for one runner
    before = session.reserved()
    _same_as_eager(session, _ar, model, batch=2)  # evicts the batch-1 runner
    (two,) = step_graphs.runners_of(model)
    assert two is not one and not one.captured and two.captured
    if session.cuda is not None:  # the evicted runner's pool was erased, the live one's kept
        assert len(session.cuda.live_pools()) == 1
        assert session.reserved() <= before
    _same_as_eager(session, _ar, model, batch=2, seed=3)  # the survivor replays
    assert step_graphs.runners_of(model) == [two] and sum(g.replays for g in two.graphs.values()) > 0 \
        if session.cuda is not None else step_graphs.runners_of(model) == [two]
    session.assert_clean()
    step_graphs.release(model)


def test_the_budget_keeps_alternated_modes_and_evicts_least_recently_used(session, monkeypatch):
    model = session.model()
    drafter = session.drafter(model)
    _ar(session, model)
    _tree(session, model, drafter)
    budget = step_graphs.held_bytes(model) + 1  # room for AR and the tree, not for a third runner as well
    monkeypatch.setattr(step_graphs, "BUDGET_BYTES", raising=False, value=budget)
    _ar(session, model, seed=1)  # AR is now the most recent, the tree the least
    ar = _runner(model, "ar")
    _sjd(session, model)  # over budget: the tree goes first; AR stays if it fits beside the new Jacobi runner
    jacobi = _runner(model, "jacobi")
    kinds = sorted(key[0][0] for key, _ in _items(model))
    assert "tree" not in kinds and "jacobi" in kinds
    assert ("ar" in kinds) == (ar.held_bytes + jacobi.held_bytes <= budget)
    assert step_graphs.held_bytes(model) <= budget or kinds == ["jacobi"]
    session.assert_clean()
    step_graphs.release(model)


def test_release_then_recapture_returns_memory(session):
    model = session.model()
    _ar(session, model, compile="off")  # the default stream's own cuBLAS workspace, kept by cuBLAS
    baseline = session.reserved()
    _ar(session, model)
    assert session.reserved() > baseline
    assert step_graphs.release(model) == 1 and step_graphs.cached_runners(model) == 0
    if session.cuda is not None:
        assert session.cuda.live_pools() == [] and session.reserved() == baseline
    _same_as_eager(session, _ar, model, seed=1)
    assert _all_captured(model)
    session.assert_clean()
    step_graphs.release(model)


def _move(module: torch.nn.Module) -> None:
    """ComfyUI's unload and reload: the same module, its weights at new addresses."""
    for p in module.parameters():
        p.data = p.data.clone()


def test_weights_moved_recaptures_against_the_new_addresses(session):
    model = session.model()
    _ar(session, model)
    old = _runner(model, "ar")
    _move(model)
    _same_as_eager(session, _ar, model, seed=1)
    assert _runner(model, "ar") is not old and not old.captured and _all_captured(model)
    session.assert_clean()
    step_graphs.release(model)


def test_only_the_drafter_unloaded_keeps_the_ar_runner(session):
    model = session.model()
    drafter = session.drafter(model)
    _ar(session, model)
    _tree(session, model, drafter)
    ar, tree = _runner(model, "ar"), _runner(model, "tree")
    _move(drafter)
    _same_as_eager(session, _ar, model, seed=1)
    assert _runner(model, "ar") is ar and tree.captured  # nothing the AR graphs read moved
    _same_as_eager(session, _tree, model, drafter, seed=1)
    assert _runner(model, "tree") is not tree and not tree.captured
    assert step_graphs.release(drafter) == 1  # ComfyUI unloads the drafter: its trees go, AR stays
    assert step_graphs.runners_of(model) == [ar] and ar.captured
    session.assert_clean()
    step_graphs.release(model)


def test_two_models_release_one_replay_the_other(session):
    first, second = session.model(seed=4), session.model(seed=5)
    _ar(session, first)
    _ar(session, second)
    kept = _runner(second, "ar")
    assert step_graphs.release(first) == 1
    if session.cuda is not None:  # the first model's pool went back to the device, the second's stayed
        assert len(session.cuda.live_pools()) == 1
    _same_as_eager(session, _ar, second, seed=2)
    assert _runner(second, "ar") is kept and kept.captured
    session.assert_clean()
    step_graphs.release(second)


def _failing_runner(session, fail: dict) -> StepRunner:
    weight = torch.randn(8, 8, device=session.device)
    buffers = torch.zeros(2, 8, device=session.device)

    def step(variant):
        buffers.copy_(torch.tanh(buffers @ weight + 1))
        if fail.get(variant):
            buffers.sum().item()  # a host read: refused by capture

    return StepRunner(step, buffers)


def test_a_failure_mid_capture_restores_stream_and_allocator(session):
    model = session.model()
    fail = {2: True}
    device = torch.device("cuda" if session.kind == "cuda" else "cpu")
    broken = step_graphs.runner_for(model, "broken", lambda: _failing_runner(session, fail), [1, 2, 3],
                                    lambda r, v: None, device)
    assert not broken.captured and "Error" in broken.capture_error and session.fallbacks()
    assert broken.execution().graphs == "off" or broken.requested
    broken.run(1)  # eager on the same buffers, and said
    assert broken.execution().fell_back and broken.execution().graphs == "none"
    assert torch.cuda.current_stream(device) == torch.cuda.default_stream(device) if session.kind == "cuda" \
        else session.cuda.current_stream(0).default and session.cuda.capture is None
    session.caplog.clear()
    if session.cuda is not None:
        session.cuda.failures.clear()
    _same_as_eager(session, _ar, model)  # later captures still work
    assert _runner(model, "ar").captured
    session.assert_clean()
    step_graphs.release(model)
    if session.cuda is not None:
        assert session.cuda.live_pools() == []


def test_two_devices_capture_on_each_devices_own_stream(monkeypatch, caplog):
    session = Session("stand_in", monkeypatch, caplog, devices=2)
    try:
        first = session.model(seed=4)
        _ar(session, first)
        session.cuda.tensor_device = 1  # the second model lives on the second GPU
        second = session.model(seed=5)
        _same_as_eager(session, _ar, second)
        assert _all_captured(first) and _all_captured(second)
        assert {p.device for p in session.cuda.live_pools()} == {0, 1}
        session.assert_clean()
        step_graphs.release(second)
        session.cuda.tensor_device = 0
        step_graphs.release(first)
        assert session.cuda.live_pools() == []
    finally:
        session.close()


def test_a_freed_model_takes_its_runners_with_it(session):
    model = session.model()
    drafter = session.drafter(model)
    _ar(session, model)
    _tree(session, model, drafter)
    _sjd(session, model)
    assert step_graphs.cached_runners(model) == 3
    refs = weakref.ref(model), weakref.ref(drafter)
    del model, drafter
    gc.collect()
    assert [r() for r in refs] == [None, None]  # no runner kept its model (or drafter) alive
    if session.cuda is not None:
        session.cuda.empty_cache()
        assert session.cuda.live_pools() == []  # and their graphs' pools went with them
    session.assert_clean()


def test_the_stand_in_catches_a_reused_pool_handle(monkeypatch):
    """The rule behind the first GPU run's failures, shown on the stand-in itself: a capture into a handle whose
    pool holds a cuBLAS workspace after its graphs were reset hits the real assert."""
    with CudaStandIn(monkeypatch) as cuda:
        weight = torch.randn(4, 4)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        for attempt in range(2):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                if attempt == 0:
                    graph.capture_begin(pool=pool)
                    weight @ weight  # the stream's first matmul: its workspace lands in the pool
                    graph.capture_end()
                    graph.reset()
                    torch.cuda.empty_cache()  # the workspace keeps the pool alive at use count 0
                else:
                    with pytest.raises(RuntimeError, match="use_count > 0 INTERNAL ASSERT"):
                        graph.capture_begin(pool=pool)
        assert cuda.failures == [USE_COUNT_ASSERT]
        cuda.clear_workspaces()
        cuda.empty_cache()
        assert cuda.live_pools() == []  # once the workspace is cleared, the pool is erased


def test_the_stand_in_replays_what_it_recorded(monkeypatch):
    with CudaStandIn(monkeypatch):
        x = torch.ones(3)
        stream = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            graph.capture_begin()
            y = x * 2
            x.add_(y)
            graph.capture_end()
        assert x.tolist() == [3.0] * 3
        graph.replay()  # recorded: y = 2x, x += y
        assert x.tolist() == [9.0] * 3 and y.tolist() == [6.0] * 3


def test_no_garbage_collection_during_a_recording(monkeypatch):
    """Runners live in a cycle with their model, so a collection may reset a freed model's graphs: never while
    another step records (warm-up may collect; the recording may not; the collector is back afterwards)."""
    monkeypatch.setattr(graph_capture, "_STREAMS", {})
    with CudaStandIn(monkeypatch):
        weight, seen = torch.randn(4, 4), []

        def step():
            seen.append(gc.isenabled())
            weight @ weight

        assert gc.isenabled()
        graph_capture.capture(step, torch.device("cuda:0"))
        assert seen == [True] * step_graphs.WARMUP_STEPS + [False] and gc.isenabled()


@pytest.mark.parametrize("mode", ["ar", "static_tree", "sjd"])
def test_captured_tokens_equal_eager_tokens(session, mode):
    """The three kinds of captured step (AR, a tree iteration, a Jacobi iteration), two seeds each and AR at
    batch 2: replayed graphs give eager's tokens, every step replayed (no fallback)."""
    model = session.model()
    drafter = session.drafter(model)
    for seed in (0, 1):
        if mode == "ar":
            result = _same_as_eager(session, _ar, model, seed=seed, batch=2)
        elif mode == "static_tree":
            result = _same_as_eager(session, _tree, model, drafter, seed=seed)
        else:
            result = _same_as_eager(session, _sjd, model, seed=seed)
        assert result.stats.steps.graphs == "all", result.stats.steps
    assert _all_captured(model) and step_graphs.cached_runners(model) == 1
    session.assert_clean()
    step_graphs.release(model)
