"""ComfyUI unloading a model (or "Free model and node cache") releases the model's captured decoding steps:
the pack registers a ModelPatcher ON_DETACH callback that empties lantern_core's step-graph registry."""
from __future__ import annotations

from tiny_models import TINY_C2I, random_gpt


class FakeGraph:
    def __init__(self, step):
        self.step = step

    def replay(self):
        self.step()


def test_detaching_the_patcher_releases_captured_steps(pack, monkeypatch):
    import importlib

    graphs = importlib.import_module("lantern_pack.lantern_core.decoding.step_graphs")
    ar = importlib.import_module("lantern_pack.lantern_core.decoding.ar_step")
    runtime = importlib.import_module("lantern_pack.nodes.runtime")
    config = importlib.import_module("lantern_pack.lantern_core.config")
    monkeypatch.setattr(graphs, "capture", lambda step, device, pool=None: FakeGraph(step))
    monkeypatch.setattr(graphs, "_pool", lambda model: None)
    model = random_gpt(TINY_C2I)
    patcher = runtime._patcher(model)
    shape = ar.ARShape(1, 17, 16, config.SamplingConfig())

    def build():
        buffers = ar.ARBuffers.allocate(model, shape)
        return graphs.StepRunner(lambda window: ar.ar_step(model, shape, buffers, window), buffers)

    def reset(runner):
        runner.buffers.index.fill_(1)
        runner.buffers.prefix_len.fill_(1)

    runner = graphs.runner_for(model, ("ar", shape), build, [17], reset, "cpu")
    assert graphs.cached_runners(model) == 1 and runner.captured
    patcher.detach()
    assert graphs.cached_runners(model) == 0
    assert runner.buffers.cache.keys.numel() == 0  # the static KV cache is gone with the graphs
