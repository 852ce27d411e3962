"""Fusing a step function with Inductor (`torch.compile(fullgraph=True, dynamic=False)`) before it is captured:
eager's rounding kept, one code object per runner so shapes never share a recompile limit, and a failed compile
said and reported, never hidden. It captures nothing and chooses no device (`decoding/step_graphs.py` decides when)."""
from __future__ import annotations

import itertools
import logging
from typing import Callable, Hashable

import torch

log = logging.getLogger("lantern_core.step_graphs")


def inductor_options() -> dict:
    """Inductor's options for our steps: `emulate_precision_casts` rounds every fused intermediate to the
    model dtype where eager rounds it (bf16 after each op), so a compiled step gives eager's tokens; without
    it a bf16 step diverged from eager within a few tokens. Options a torch version lacks are left out."""
    from torch._inductor import config as inductor_config

    wanted = {"emulate_precision_casts": True}
    return {name: value for name, value in wanted.items() if hasattr(inductor_config, name)}


_STEP_CODES = itertools.count()


def _own_code(step: Callable[[Hashable], None]) -> Callable[[Hashable], None]:
    """`step` behind a function with a code object of its own. Dynamo keeps its compiled graphs per code object,
    and every runner's step is a lambda from one source line, so without this every shape of a session would
    count against one code object's recompile limit (8): past it `fullgraph=True` raises and the step would
    fall back to uncompiled. With its own code object each runner shape compiles once, on its own."""
    def forward(variant: Hashable) -> None:
        return step(variant)

    forward.__code__ = forward.__code__.replace(co_name=f"lantern_step_{next(_STEP_CODES)}")
    return forward


class CompiledStep:
    """`step` fused by Inductor (`fullgraph=True, dynamic=False`, eager's rounding: `inductor_options`), compiled at
    its first call (a capture's warm-up, so before any graph is recorded) and reused for every later image of the
    shape; with torch's on-disk cache, across restarts too. A step that fails to compile runs as it is (eager, or
    captured as it is): said in the log and to the `reporting` listener, and `status` becomes "failed", which
    every run's `StepExecution` reports. `status`: "pending" (not called yet), "inductor" or "failed"."""

    def __init__(self, step: Callable[[Hashable], None], what: str, backend: str = "inductor",
                 announce: Callable[[str], None] = log.info) -> None:
        options = inductor_options() if backend == "inductor" else None
        self.step, self.what, self.status, self.announce = step, what, "pending", announce
        self.compiled = torch.compile(_own_code(step), backend=backend, fullgraph=True, dynamic=False,
                                      options=options)

    def __call__(self, variant: Hashable) -> None:
        if self.status == "failed":
            return self.step(variant)
        if self.status == "pending":
            self.announce(f"compiling the {self.what} step with Inductor (once per model and shape; a minute or more for "
                     "large models, then every image reuses it)")
        try:
            out = self.compiled(variant)
        except Exception as error:  # the compiler must never fail an image
            self.status = "failed"
            log.warning("COMPILE FALLBACK: Inductor could not compile the %s step (%s: %s)", self.what,
                        type(error).__name__, str(error)[:300])
            self.announce(f"Inductor could not compile the {self.what} step; running it uncompiled (slower, same tokens)")
            return self.step(variant)
        self.status = "inductor"
        return out
