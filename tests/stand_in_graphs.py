"""CUDA graphs stood in for on the CPU: `capture` records the step and `replay()` calls it, so the capture
registry's control flow (keys, signatures, reset, replay per variant, release) runs without a GPU."""
from __future__ import annotations


class StandInGraph:
    def __init__(self, step):
        self.step = step
        self.replays = 0

    def replay(self):
        self.replays += 1
        self.step()


def stand_in_capture(step_graphs):
    def capture(step, device, pool=None, prepare=lambda: None):
        for _ in range(step_graphs.WARMUP_STEPS):  # the real warm-up: real steps from a prepared state
            prepare()
            step()
        prepare()
        return StandInGraph(step)
    return capture


def use_stand_in_graphs(monkeypatch, step_graphs) -> None:
    """Patch a `step_graphs` module (the core's, or the pack's copy) to record stand-in graphs."""
    monkeypatch.setattr(step_graphs, "capture", stand_in_capture(step_graphs))
    monkeypatch.setattr(step_graphs, "reserved_bytes", lambda device: 0)
    monkeypatch.setattr(step_graphs.torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(step_graphs, "return_memory", lambda devices: None)


def assert_capture_matches_eager(step_graphs, model, decode, seeds=(0, 1)) -> object:
    """`decode(seed, compile)` -> GenerationResult. With compile "auto" (captured, or stood in for) every seed
    gives the eager run's tokens, heat map and acceptance histogram; the images share one cached runner,
    which is returned (still registered)."""
    import torch

    for seed in seeds:
        eager, replayed = decode(seed, "off"), decode(seed, "auto")
        assert torch.equal(replayed.tokens, eager.tokens), seed
        assert torch.equal(replayed.accepted_per_cell, eager.accepted_per_cell), seed
        assert replayed.stats.accepted_histogram == eager.stats.accepted_histogram, seed
    assert step_graphs.cached_runners(model) == 1
    (runner,) = step_graphs.runners_of(model)
    assert runner.captured
    return runner
