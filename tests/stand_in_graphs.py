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


def use_stand_in_graphs(monkeypatch, step_graphs) -> None:
    """Patch a `step_graphs` module (the core's, or the pack's copy) to record stand-in graphs."""
    monkeypatch.setattr(step_graphs, "capture", lambda step, device, pool=None: StandInGraph(step))
    monkeypatch.setattr(step_graphs, "_pool", lambda model: None)
