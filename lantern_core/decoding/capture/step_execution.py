"""How one run's decode steps ran (replayed from CUDA graphs or eager, fused by Inductor or not), as every
run's stats, the node's text and every benchmark row report it. It counts nothing itself: `StepRunner`
(`step_graphs.py`) does."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepExecution:
    """How one run's steps ran, for its stats and every benchmark row: `replayed` steps came from a captured CUDA
    graph, `eager` ones ran as Python; `requested` says whether the run's layout asked for graphs (compile "auto"
    or "graphs" on CUDA); `compile` is "inductor" (fused), "failed" (Inductor fell back to the plain step) or
    "off"; `capture_error` is the first capture failure's text. A fallback is a failure, never a measurement:
    `fell_back` is true whenever a requested graph or compile did not run."""

    requested: bool = False
    replayed: int = 0
    eager: int = 0
    compile: str = "off"
    capture_error: str = ""

    def __post_init__(self) -> None:
        if self.compile not in ("inductor", "failed", "off"):
            raise ValueError(f"compile must be 'inductor', 'failed' or 'off', got {self.compile!r}")

    @property
    def graphs(self) -> str:
        """'all' (every step replayed), 'partial', 'none' (graphs asked for, none replayed) or 'off' (eager by
        choice: compile "off", or a device that never captures)."""
        if not self.requested:
            return "off"
        if self.replayed and not self.eager:
            return "all"
        return "partial" if self.replayed else "none"

    @property
    def fell_back(self) -> bool:
        return (self.requested and self.eager > 0) or self.compile == "failed"

    def merged(self, other: "StepExecution") -> "StepExecution":
        """Both runs' steps together (a batch loop that switched runners, several batches of one request)."""
        compile = "failed" if "failed" in (self.compile, other.compile) else (
            "inductor" if "inductor" in (self.compile, other.compile) else "off")
        return StepExecution(self.requested or other.requested, self.replayed + other.replayed,
                             self.eager + other.eager, compile, self.capture_error or other.capture_error)

    def describe(self) -> str:
        """A few words for a person: 'CUDA graphs: all 255 steps replayed', 'eager (no graphs)', or the fallback."""
        if not self.requested:
            return "eager (no graphs)" + (", Inductor failed" if self.compile == "failed" else "")
        total = self.replayed + self.eager
        text = {"all": f"CUDA graphs: all {total} steps replayed",
                "partial": f"FELL BACK to eager for {self.eager} of {total} steps",
                "none": f"FELL BACK to eager: no step of {total} replayed"}[self.graphs]
        if self.compile == "inductor":
            text += ", Inductor-fused"
        elif self.compile == "failed":
            text += ", Inductor compile FAILED (uncompiled steps)"
        if self.capture_error:
            text += f" ({self.capture_error[:120]})"
        return text

    def to_dict(self) -> dict:
        return {"graphs": self.graphs, "replayed": self.replayed, "eager": self.eager, "compile": self.compile,
                "fell_back": self.fell_back, "capture_error": self.capture_error}
