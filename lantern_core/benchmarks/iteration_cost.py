"""What one iteration of every decoding mode costs next to one AR step, on a model's shapes (`make bench`,
`make bench-cuda`): random target and drafter weights of the given size, a fixed number of iterations
per mode after as many warm-up ones, ms per iteration (verification forward + drafter levels + tree walk, or one Jacobi window)
and its ratio to the same run's AR ms/step. A mode's end-to-end speed-up is its mean accepted length
divided by that ratio; accepted lengths come from the trained embedded model (`trees/driver.py`), since
random weights accept at random. Each mode is timed under compile "graphs" (captured), "off" (eager) and
"auto" (Inductor + graphs), as `--compile` picks, and every row says how its steps really ran (`graphs`,
`compiled`, `fell_back`). Timings are never asserted.

    python -m lantern_core.benchmarks.iteration_cost --device cuda --dtype bfloat16 --model GPT-XL
    python -m lantern_core.benchmarks.iteration_cost --device cuda --dtype bfloat16 --model GPT-XL --compile graphs auto
"""
from __future__ import annotations

import argparse
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..conditioning import Condition
from ..config import DrafterConfig, GPTConfig, SamplingConfig, gpt_preset
from ..decoding.trees.drafting import DynamicShape
from ..decoding.generate import generate, synchronize
from ..decoding.jacobi.config import JacobiConfig
from ..decoding.jacobi.driver import jacobi_generate
from ..decoding.acceptance.neighbors import build_neighbors
from ..decoding.acceptance.relaxation import Relaxation
from ..decoding.sampling import make_generators
from ..decoding.trees.config import SpeculativeConfig
from ..decoding.trees.driver import speculative_generate
from ..decoding.step_graphs import StepExecution, runners_of, uses_graphs
from ..decoding.trees.specs import NAIVE_EXTEND_57
from ..models.drafter import EagleDrafter
from .ar import TINY_SHAPE, machine_info, random_model
from .report_writer import Report, merged_steps, step_cells, step_fields

log = logging.getLogger("lantern_core.benchmarks.iteration_cost")
MODELS = {"GPT-B": ("GPT-B c2i 256px", gpt_preset("GPT-B", "c2i", 256)),
          "GPT-L": ("GPT-L c2i 256px", gpt_preset("GPT-L", "c2i", 256)),
          "GPT-XL": ("GPT-XL c2i 384px", gpt_preset("GPT-XL", "c2i", 384)),
          "tiny": ("tiny c2i 8x8 (64 wide, 2 layers)", TINY_SHAPE)}  # the code paths only (smoke runs)
COMPILES = ("graphs", "off", "auto")  # the columns a row can time: graphs (the main one), eager, Inductor + graphs


@dataclass
class CostRow:
    mode: str
    what: str  # the tree or window an iteration verifies
    iterations: int
    ms_per_iteration: float  # compile graphs: captured, not compiled (eager where nothing captures)
    vs_ar_step: float
    error: str = ""
    eager_ms_per_iteration: float = float("nan")  # compile off (on CUDA; the same as ms_per_iteration elsewhere)
    eager_vs_ar_step: float = float("nan")  # against the eager AR step
    auto_ms_per_iteration: float = float("nan")  # compile auto: Inductor + graphs on CUDA (eager elsewhere)
    auto_vs_ar_step: float = float("nan")  # against the auto AR step
    auto_warmup_s: float = float("nan")  # auto's first (warm-up) run: its compile and captures included
    graphs: str = "off"  # how the graphs and auto runs' steps ran (`report_writer.step_fields`)
    compiled: str = "off"
    fell_back: bool = False


@dataclass(frozen=True)
class CostPlan:
    """What `run` times: `iterations` per mode (0: whole images), the modes whose names start with one of `only`
    (all when empty; AR always) and the `compiles` columns (of `COMPILES`)."""

    iterations: int = 32
    only: tuple[str, ...] = ()
    compiles: tuple[str, ...] = COMPILES


@dataclass(frozen=True)
class Timing:
    """One mode under one compile choice: ms per iteration of the timed run, seconds of the warm-up run before it
    (captures and compiles included) and how the timed run's steps ran."""

    ms: float
    warmup_s: float
    steps: StepExecution


def modes(k: int, stride: int = 24) -> list[tuple[str, object]]:
    """Every mode's iteration; the 2-D ones keep the frontier's window inside a row of `stride` tokens."""
    static = SpeculativeConfig(tree="static", static_tree=NAIVE_EXTEND_57)
    two_d = min(15, stride - 1)
    return [
        ("static_tree (naive_extend_57)", static),
        ("lantern_pp lambda 5 (naive_extend_57)", SpeculativeConfig(tree="static", relaxation=Relaxation(k=k, lam=5.0))),
        ("eagle2 (d5 k10 n58)", SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(5, 10, 58))),
        ("lantern delta 0.1 (eagle2 d5 k10 n58)",
         SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(5, 10, 58), relaxation=Relaxation(k=k, delta=0.1))),
        ("sjd (window 16)", JacobiConfig(16, coupled=False)),
        ("sjd_coupled (window 16)", JacobiConfig(16, coupled=True)),
        ("sjd continuation (window 16)", JacobiConfig(16, init="sample_left", continuation=True)),
        ("sjd_coupled proactive 4 x depth 3 (window 16)", JacobiConfig(16, coupled=True, proactive=4)),
        ("sjd_coupled 2-D (window <= 15 + next row w16)", JacobiConfig(two_d, coupled=True, rows=2, row_window=16,
                                                                       row_offset=-1)),
        ("sjd_2d_relaxed (window <= 15 + 6 rows x w6)", JacobiConfig(two_d, coupled=True, rows=6, row_window=6,
                                                                     row_commit=True, row_lead=0)),
    ]


class _Enough(Exception):
    """Raised from the step callback once enough iterations were timed."""


@torch.no_grad()
def measure(model, drafter, neighbors, sampling: SamplingConfig, spec, device, iterations: int,
            compile: str = "graphs") -> Timing:
    """Milliseconds per iteration (from the step callback, which every decoder calls once per iteration) over
    `iterations` iterations after as many warm-up ones, the run stopping there; or, with `iterations` 0, over
    whole images after a whole warm-up image, so every attention band and the loop's last iterations count.
    `compile` "graphs" by default: captured, not compiled."""
    def timed(seed: int) -> float:
        calls, start = [0], [0.0]

        def on_step(done: int, total: int, tokens: torch.Tensor) -> None:
            calls[0] += 1
            if calls[0] == 1:  # the clock starts after the prefill and first iteration
                synchronize(device)
                start[0] = time.perf_counter()
            elif iterations and calls[0] > iterations:
                synchronize(device)
                raise _Enough

        gens = make_generators(seed, 1, device)
        cond = Condition.classes([seed % model.config.num_classes], device=device)
        try:
            if spec is None:
                generate(model, cond, sampling, gens, on_step, compile=compile)
            elif isinstance(spec, JacobiConfig):
                jacobi_generate(model, cond, sampling, spec, gens, neighbors, on_step, compile=compile)
            else:
                speculative_generate(model, drafter, cond, sampling, spec, gens, neighbors, on_step, compile=compile)
            synchronize(device)
        except _Enough:
            pass
        return 1000.0 * (time.perf_counter() - start[0]) / max(calls[0] - 1, 1)

    began = time.perf_counter()
    timed(1)
    warmup_s = time.perf_counter() - began
    return Timing(timed(2), warmup_s, last_steps(model, compile, device))


def last_steps(model, compile: str, device) -> StepExecution:
    """How the last run's steps ran, from the runner it stepped through (the most recently used one the model
    holds: a run stopped by `_Enough` returns no stats); nothing captured where `compile` captures nothing."""
    if not uses_graphs(compile, device):
        return StepExecution()
    runners = runners_of(model)
    return runners[-1].execution() if runners else StepExecution(requested=True)


def timings(measure_one, compiles: tuple[str, ...], device) -> dict[str, Timing]:
    """`measure_one(compile)` for each of `compiles`; where a choice captures nothing on `device` it is the eager
    run, measured once for all such choices."""
    out, done = {}, {}
    for choice in compiles:
        runs = choice if uses_graphs(choice, device) else "off"
        if runs not in done:
            done[runs] = measure_one(runs)
        out[choice] = done[runs]
    return out


def cost_row(name: str, what: str, iterations: int, timed: dict[str, Timing], ar: dict[str, Timing]) -> CostRow:
    """A mode's row: ms per iteration and its ratio to the AR step under the same compile choice, per column."""
    def ms(choice: str) -> float:
        return round(timed[choice].ms, 3) if choice in timed else float("nan")

    def ratio(choice: str) -> float:
        return round(timed[choice].ms / ar[choice].ms, 3) if choice in timed else float("nan")

    captured = merged_steps(timed[c].steps for c in ("graphs", "auto") if c in timed)
    return CostRow(name, what, iterations, ms("graphs"), ratio("graphs"), eager_ms_per_iteration=ms("off"),
                   eager_vs_ar_step=ratio("off"), auto_ms_per_iteration=ms("auto"), auto_vs_ar_step=ratio("auto"),
                   auto_warmup_s=round(timed["auto"].warmup_s, 2) if "auto" in timed else float("nan"),
                   **step_fields(captured))


def run(config: GPTConfig, label: str, device: torch.device, dtype: torch.dtype, k: int,
        plan: CostPlan = CostPlan(), report: Report | None = None) -> dict:
    """Time AR and the modes `plan` names under each of its compile choices, each row added to `report`
    (written after every row) as it is measured."""
    report = report or Report(None, "iteration_cost", markdown)
    model = random_model(config, device, dtype)
    drafter = EagleDrafter(DrafterConfig.for_target(config)).to(device)
    drafter.init_from_target(model, torch.Generator(device=device).manual_seed(1))
    drafter = drafter.to(dtype=dtype).eval()
    neighbors = build_neighbors(torch.randn(config.vocab_size, 8, generator=torch.Generator().manual_seed(2)), k)
    neighbors = neighbors.to(device)
    sampling = SamplingConfig(cfg_scale=4.0, temperature=1.0)

    def timed(spec) -> dict[str, Timing]:
        return timings(lambda compile: measure(model, drafter, neighbors, sampling, spec, device, plan.iterations,
                                               compile), plan.compiles, device)

    report.update(model=f"{label} (random weights)", tokens=config.num_image_tokens, compiles=list(plan.compiles),
                  rows=[])
    ar = timed(None)
    report.add("rows", asdict(cost_row("ar (one step)", "1 token", plan.iterations, ar, ar)))
    for name, spec in modes(k, config.row_stride):
        if plan.only and not name.startswith(plan.only):
            continue
        try:
            row = cost_row(name, name.split("(")[-1].rstrip(")"), plan.iterations, timed(spec), ar)
        except Exception as error:  # one mode failing must not lose the others
            log.exception("%s failed", name)
            row = CostRow(name, "", 0, float("nan"), float("nan"), f"{type(error).__name__}: {error}"[:300])
        log.info("%s", row)
        report.add("rows", asdict(row))
    return report.data


def cell(value: float, suffix: str = "") -> str:
    """A number to two decimals, blank when not measured (NaN)."""
    return "" if value != value else f"{value:.2f}{suffix}"


def markdown(report: dict) -> str:
    lines = [f"# Cost of one iteration per decoding mode ({report['device']}, {report['dtype']})", "",
             f"{report['model']}, {report['tokens']} tokens, batch 1, cfg 4; {report['machine']}; "
             f"torch {report['torch']}; {report['date']}", "",
             "| mode | iterations timed | ms / iteration (compile graphs) | vs one AR step | "
             "ms / iteration (compile off) | vs one AR step (both off) | ms / iteration (compile auto) | "
             "vs one AR step (both auto) | auto warm-up s | graphs | compiled |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        if r["error"]:
            lines.append(f"| {r['mode']} | failed: {r['error']} | | | | | | | | | |")
            continue
        lines.append(f"| {r['mode']} | {r['iterations'] or 'whole images'} | {cell(r['ms_per_iteration'])} | "
                     f"{cell(r['vs_ar_step'], 'x')} | {cell(r['eager_ms_per_iteration'])} | "
                     f"{cell(r['eager_vs_ar_step'], 'x')} | {cell(r.get('auto_ms_per_iteration', float('nan')))} | "
                     f"{cell(r.get('auto_vs_ar_step', float('nan')), 'x')} | "
                     f"{cell(r.get('auto_warmup_s', float('nan')))} | {step_cells(r)} |")
    lines += ["", "An iteration verifies a drafted tree (verification forward + drafter levels + tree walk + "
                  "cache compaction) or a Jacobi window. Speed-up = mean accepted length / (ms per iteration / AR "
                  "ms per step); LANTERN's goal on GPUs is a 57-node static-tree iteration within 1.5 AR steps. "
                  "With compile graphs on CUDA, AR steps and whole iterations are replayed CUDA graphs; compile auto "
                  "fuses each step with Inductor before capturing it (its warm-up run includes the compile); "
                  "elsewhere every column is the same eager run. Each ratio is against the AR step under the same "
                  "compile choice. `graphs`: how the graphs and auto runs' steps ran (all replayed, partial or "
                  "none: a fallback; off: nothing captured on this device); `compiled`: Inductor's outcome for the "
                  "auto run (off: not compiled here)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="per-iteration cost of every decoding mode vs one AR step")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--model", default="GPT-B", choices=sorted(MODELS))
    parser.add_argument("--lantern-k", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=32,
                        help="iterations timed per mode (after as many warm-up); 0: whole images (every attention band)")
    parser.add_argument("--only", nargs="*", default=[], help="mode-name prefixes to time (AR always runs)")
    parser.add_argument("--compile", nargs="+", default=list(COMPILES), choices=COMPILES,
                        help="columns to time: graphs (captured), off (eager), auto (Inductor + graphs; a compile "
                             "per mode); where nothing captures (CPU) all three are the one eager run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    label, config = MODELS[args.model]
    report = Report(args.out, f"iteration_cost_{device.type}_{args.dtype}", markdown, **machine_info(device),
                    dtype=args.dtype)
    run(config, label, device, dtype, args.lantern_k, CostPlan(args.iterations, tuple(args.only), tuple(args.compile)),
        report)
    return report.finish()


if __name__ == "__main__":
    main()
