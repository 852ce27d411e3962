"""ComfyUI unloading a model (or "Free model and node cache") releases the model's captured decoding steps:
the pack registers a ModelPatcher ON_DETACH callback that empties lantern_core's step-graph registry."""
from __future__ import annotations

from stand_in_graphs import use_stand_in_graphs
from tiny_models import TINY_C2I, random_gpt


def test_detaching_the_patcher_releases_captured_steps(pack, monkeypatch):
    import importlib

    graphs = importlib.import_module("lantern_pack.lantern_core.decoding.step_graphs")
    ar = importlib.import_module("lantern_pack.lantern_core.decoding.ar_step")
    generate = importlib.import_module("lantern_pack.lantern_core.decoding.generate")
    runtime = importlib.import_module("lantern_pack.nodes.runtime")
    config = importlib.import_module("lantern_pack.lantern_core.config")
    use_stand_in_graphs(monkeypatch, graphs)
    model = random_gpt(TINY_C2I)
    patcher = runtime._patcher(model)
    shape = ar.ARShape(1, 17, 16, config.SamplingConfig())
    runner = graphs.runner_for(model, ("ar", shape), lambda: generate.eager_ar_runner(model, shape), [17],
                               generate.reset_for_warmup, "cpu")
    assert graphs.cached_runners(model) == 1 and runner.captured
    patcher.detach()
    assert graphs.cached_runners(model) == 0
    assert runner.buffers.cache.keys.numel() == 0  # the static KV cache is gone with the graphs
