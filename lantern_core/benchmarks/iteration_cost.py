"""What one iteration of every decoding mode costs next to one AR step, on a model's shapes (`make bench`,
`make bench-cuda`): random target and drafter weights of the given size, a fixed number of iterations
per mode after as many warm-up ones, ms per iteration (verification forward + drafter levels + tree walk, or one Jacobi window)
and its ratio to the same run's AR ms/step. A mode's end-to-end speed-up is its mean accepted length
divided by that ratio; accepted lengths come from the trained embedded model (`trees/driver.py`), since
random weights accept at random. Timings are never asserted.

    python -m lantern_core.benchmarks.iteration_cost --device cuda --dtype bfloat16 --model GPT-XL
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
from ..decoding.step_graphs import uses_graphs
from ..decoding.trees.specs import NAIVE_EXTEND_57
from ..models.drafter import EagleDrafter
from .ar import TINY_SHAPE, machine_info, random_model
from .report_writer import Report

log = logging.getLogger("lantern_core.benchmarks.iteration_cost")
MODELS = {"GPT-B": ("GPT-B c2i 256px", gpt_preset("GPT-B", "c2i", 256)),
          "GPT-L": ("GPT-L c2i 256px", gpt_preset("GPT-L", "c2i", 256)),
          "GPT-XL": ("GPT-XL c2i 384px", gpt_preset("GPT-XL", "c2i", 384)),
          "tiny": ("tiny c2i 8x8 (64 wide, 2 layers)", TINY_SHAPE)}  # the code paths only (smoke runs)


@dataclass
class CostRow:
    mode: str
    what: str  # the tree or window an iteration verifies
    iterations: int
    ms_per_iteration: float
    vs_ar_step: float
    error: str = ""
    eager_ms_per_iteration: float = float("nan")  # compile off (on CUDA; the same as ms_per_iteration elsewhere)
    eager_vs_ar_step: float = float("nan")  # against the eager AR step


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
            compile: str = "graphs") -> float:
    """Milliseconds per iteration (from the step callback, which every decoder calls once per iteration) over
    `iterations` iterations after as many warm-up ones, the run stopping there; or, with `iterations` 0, over
    whole images after a whole warm-up image, so every attention band and the loop's last iterations count.
    `compile` "graphs" by default: captured, not compiled (an Inductor compile per mode would outlast the check)."""
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

    timed(1)
    return timed(2)


def run(config: GPTConfig, label: str, device: torch.device, dtype: torch.dtype, k: int,
        iterations: int = 32, only: tuple[str, ...] = (), report: Report | None = None) -> dict:
    """Time AR and the modes whose names start with one of `only` (all when empty), each row added to `report`
    (written after every row) as it is measured."""
    report = report or Report(None, "iteration_cost", markdown)
    model = random_model(config, device, dtype)
    drafter = EagleDrafter(DrafterConfig.for_target(config)).to(device)
    drafter.init_from_target(model, torch.Generator(device=device).manual_seed(1))
    drafter = drafter.to(dtype=dtype).eval()
    neighbors = build_neighbors(torch.randn(config.vocab_size, 8, generator=torch.Generator().manual_seed(2)), k)
    neighbors = neighbors.to(device)
    sampling = SamplingConfig(cfg_scale=4.0, temperature=1.0)
    captured = uses_graphs("graphs", device)  # on CUDA each mode is also timed eagerly (compile off)

    def both(spec) -> tuple[float, float]:
        ms = measure(model, drafter, neighbors, sampling, spec, device, iterations)  # as users get it
        return ms, (measure(model, drafter, neighbors, sampling, spec, device, iterations, "off") if captured else ms)

    report.update(model=f"{label} (random weights)", tokens=config.num_image_tokens, rows=[])
    ar_ms, ar_eager = both(None)
    rows = [CostRow("ar (one step)", "1 token", iterations, round(ar_ms, 3), 1.0, "", round(ar_eager, 3), 1.0)]
    report.add("rows", asdict(rows[0]))
    for name, spec in modes(k, config.row_stride):
        if only and not name.startswith(only):
            continue
        try:
            ms, eager = both(spec)
            rows.append(CostRow(name, name.split("(")[-1].rstrip(")"), iterations, round(ms, 3), round(ms / ar_ms, 3),
                                "", round(eager, 3), round(eager / ar_eager, 3)))
        except Exception as error:  # one mode failing must not lose the others
            log.exception("%s failed", name)
            rows.append(CostRow(name, "", 0, float("nan"), float("nan"), f"{type(error).__name__}: {error}"[:300]))
        log.info("%s", rows[-1])
        report.add("rows", asdict(rows[-1]))
    return report.data


def markdown(report: dict) -> str:
    lines = [f"# Cost of one iteration per decoding mode ({report['device']}, {report['dtype']})", "",
             f"{report['model']}, {report['tokens']} tokens, batch 1, cfg 4; {report['machine']}; "
             f"torch {report['torch']}; {report['date']}", "",
             "| mode | iterations timed | ms / iteration | vs one AR step | ms / iteration (compile off) | "
             "vs one AR step (both off) |", "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        if r["error"]:
            lines.append(f"| {r['mode']} | failed: {r['error']} | | | | |")
        else:
            lines.append(f"| {r['mode']} | {r['iterations'] or 'whole images'} | {r['ms_per_iteration']:.2f} | {r['vs_ar_step']:.2f}x | "
                         f"{r['eager_ms_per_iteration']:.2f} | {r['eager_vs_ar_step']:.2f}x |")
    lines += ["", "An iteration verifies a drafted tree (verification forward + drafter levels + tree walk + "
                  "cache compaction) or a Jacobi window. Speed-up = mean accepted length / (ms per iteration / AR "
                  "ms per step); LANTERN's goal on GPUs is a 57-node static-tree iteration within 1.5 AR steps. "
                  "With compile graphs on CUDA, AR steps and whole iterations are replayed CUDA graphs; elsewhere both "
                  "columns are the same eager run."]
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    label, config = MODELS[args.model]
    report = Report(args.out, f"iteration_cost_{device.type}_{args.dtype}", markdown, **machine_info(device),
                    dtype=args.dtype)
    run(config, label, device, dtype, args.lantern_k, args.iterations, tuple(args.only), report)
    return report.finish()


if __name__ == "__main__":
    main()
