"""Benchmark reports written whole after every row: `out/<stem>.json` (the data) and `out/<stem>.md` (the table
people read), rewritten from the rows so far, so a run that is stopped (a timeout, a crash) keeps what it
measured. `complete` is false in the files until the benchmark finishes. Every row that times decode steps says
how they ran (`step_fields`: replayed CUDA graphs or eager, compiled or not), so a fallback cannot pass for a
measurement."""
from __future__ import annotations

import json
import logging
import os
from functools import reduce
from pathlib import Path
from typing import Callable, Iterable

from ..decoding.step_graphs import StepExecution

log = logging.getLogger("lantern_core.benchmarks.report_writer")


def write_report(out: Path, stem: str, report: dict, text: str) -> None:
    """`out/stem.json` and `out/stem.md`, each replaced in one rename (a kill never leaves half a file)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for path, content in ((out / f"{stem}.json", json.dumps(report, indent=2)), (out / f"{stem}.md", text)):
        partial = path.with_name(path.name + ".partial")
        partial.write_text(content)
        os.replace(partial, path)
    log.debug("wrote %s", out / f"{stem}.md")


class Report:
    """A report's data, rendered by `render(data)` and written again after every change; `out` None keeps it in
    memory only (a benchmark called from a test)."""

    def __init__(self, out: Path | None, stem: str, render: Callable[[dict], str], **fields):
        self.out, self.stem, self.render = out, stem, render
        self.data: dict = {**fields, "complete": False}

    def update(self, **fields) -> dict:
        """Set top-level fields and rewrite the files."""
        self.data.update(fields)
        self.save()
        return self.data

    def add(self, key: str, row: dict) -> None:
        """Append `row` to the list `key` and rewrite the files."""
        self.data.setdefault(key, []).append(row)
        self.save()

    def finish(self, **fields) -> dict:
        """The last write: `complete` becomes true."""
        self.update(**fields, complete=True)
        if self.out is not None:
            log.info("wrote %s", Path(self.out) / f"{self.stem}.md")
        return self.data

    def save(self) -> None:
        if self.out is not None:
            write_report(self.out, self.stem, self.data, self.render(self.data))


def merged_steps(executions: Iterable[StepExecution]) -> StepExecution:
    """The runs' `StepExecution`s together (the runs of one row, all under the same compile choice)."""
    return reduce(StepExecution.merged, executions, StepExecution())


def step_fields(execution: StepExecution) -> dict:
    """A row's columns for how its timed steps ran: `graphs` ("all", "partial", "none", or "off" where nothing was
    to be captured), `compiled` ("inductor", "failed" or "off") and `fell_back`."""
    return {"graphs": execution.graphs, "compiled": execution.compile, "fell_back": execution.fell_back}


def step_cells(row: dict) -> str:
    """The markdown cells `graphs | compiled` of a row (blank for a row without them), a fallback in capitals."""
    if "graphs" not in row:
        return " | "
    return f"{row['graphs']}{' (FELL BACK)' if row.get('fell_back') else ''} | {row['compiled']}"
