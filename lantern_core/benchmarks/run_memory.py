"""What a decoding run allocates against what the sampler reserves for it (`make bench`), and what the
released 7B models' runs will need on a GPU.

1. For AR and every mode of `decode_counts` (sampled settings), at batch 1 and 4 on the embedded model (cfg 3,
   so twice the rows): the peak of live bytes the run allocates (`memory_track.track_allocations`: every op's
   new storage while a tensor holds it; weights are not counted, they are placed before the run) next to
   `decoding/reservation.py::plan_run_memory`, the dry run on the meta device whose peak the sampler node
   passes to ComfyUI's model management. A ratio above 1 is memory the host was not told about.
2. Planned only (no run, no weights: meta models): the reservation of Lumina-mGPT-7B-768, Janus-Pro-7B and a
   7B LlamaGen shape on CUDA (bf16, compile auto) per mode at batch 1 and 4, beside their resident weights in
   bf16 and int8 / fp8: which settings fit a 12 GB or 16 GB card.

    python -m lantern_core.benchmarks.run_memory --out bench/results
    python -m lantern_core.benchmarks.run_memory --batches 1 --only sjd --out /tmp/m      # quick look
"""
from __future__ import annotations

from dataclasses import replace

import argparse
import logging
import time
from pathlib import Path

import torch

from ..conditioning import Condition
from ..config import SamplingConfig
from ..decoding.generate import generate
from ..decoding.jacobi.config import JacobiConfig
from ..decoding.jacobi.driver import jacobi_generate
from ..decoding.acceptance.neighbors import build_neighbors
from ..decoding.sampling import make_generators
from ..decoding.reservation import PlannedRun, mib, plan_run_memory
from ..decoding.trees.driver import speculative_generate
from ..loading.embedded import EMBEDDED_NAME, load_embedded
from ..config import DrafterConfig, GPTConfig
from ..models.drafter import EagleDrafter
from ..models.gpt import LlamaGenGPT
from ..models.prompted import PromptedImageLM
from ..models.quantized import block_linears, quantizable_bytes, resident_bytes
from .ar import SEVEN_B, machine_info
from .report_writer import write_report
from .families import family_config
from .decode_counts import jacobi_modes, tree_modes
from ..memory_track import track_allocations

log = logging.getLogger("lantern_core.benchmarks.run_memory")


def modes(k: int) -> list[tuple[str, object]]:
    """(name, None for AR | SpeculativeConfig | JacobiConfig) for every sampled mode."""
    return [("ar", None), *((n, s) for n, s, greedy in tree_modes(k) + jacobi_modes(k) if not greedy)]


def run_decoder(model, drafter, condition: Condition, sampling: SamplingConfig, spec, neighbors,
                compile: str = "off") -> None:
    """One run of `spec` (None: AR; a JacobiConfig; else a tree decoder with `drafter`) for `condition`."""
    generators = make_generators(0, condition.batch, model.tok_embeddings.weight.device)
    if spec is None:
        generate(model, condition, sampling, generators, compile=compile)
    elif isinstance(spec, JacobiConfig):
        jacobi_generate(model, condition, sampling, spec, generators, neighbors, compile=compile)
    else:
        speculative_generate(model, drafter, condition, sampling, spec, generators, neighbors, compile=compile)


def measure(pipe, neighbors, spec, batch: int, sampling: SamplingConfig) -> int:
    """Peak bytes allocated by one run of `spec` for `batch` images (eager: what a step allocates)."""
    condition = Condition.classes([i % 8 for i in range(batch)])
    with torch.no_grad(), track_allocations() as tally:
        run_decoder(pipe.gpt.model, pipe.drafter.model, condition, sampling, spec, neighbors)
    return tally.peak


def run(batches: tuple[int, ...], only: str, sampling: SamplingConfig) -> list[dict]:
    pipe = load_embedded("cpu", torch.float32, drafter=True)
    neighbors = build_neighbors(pipe.vq.model.quantize.embedding.weight, 10)
    rows = []
    for name, spec in modes(10):
        if only and not name.startswith(only):
            continue
        for batch in batches:
            start = time.perf_counter()
            peak = measure(pipe, neighbors, spec, batch, sampling)
            tree = spec is not None and not isinstance(spec, JacobiConfig)
            plan = plan_run_memory(PlannedRun(pipe.gpt.model, Condition.classes([i % 8 for i in range(batch)]),
                                              sampling, spec, pipe.drafter.model if tree else None,
                                              neighbors if spec is not None else None, compile="off"))
            rows.append({"mode": name, "batch": batch, "measured_peak_bytes": peak, "reserved_bytes": plan.peak,
                         "reserved_state_bytes": plan.state, "reserved_over_measured": plan.peak / peak})
            log.info("%s batch %d: %.2f MiB measured, %.2f MiB reserved (%.1f s)", name, batch, peak / 2**20,
                     plan.peak / 2**20, time.perf_counter() - start)
    return rows


def released_shapes() -> dict[str, GPTConfig]:
    return {"Lumina-mGPT-7B-768": family_config("lumina", "7b"), "Janus-Pro-7B": family_config("janus", "7b"),
            "Lumina-mGPT-2.0 shape (768 px)": family_config("lumina2", "7b"),
            "Lumina-mGPT-2.0 shape (768 px), int8 KV cache": replace(family_config("lumina2", "7b"), kv_cache="int8"),
            "Emu3-Gen (720 px)": family_config("emu3", "8b"),
            "LlamaGen 7B shape (c2i, 384 px)": SEVEN_B}


def planned_7b(batches: tuple[int, ...], sampling: SamplingConfig) -> list[dict]:
    """Dry runs of the released 7B shapes on CUDA (meta models: nothing is allocated anywhere)."""
    rows = []
    for label, config in released_shapes().items():
        with torch.device("meta"):
            model = (PromptedImageLM(config) if config.model_type == "prompt" else LlamaGenGPT(config)).to(torch.bfloat16)
            drafter = EagleDrafter(DrafterConfig.for_target(config)).to(torch.bfloat16)
        weights = resident_bytes(model)
        quantized = weights - quantizable_bytes(model) // 2 + scale_bytes(model)
        neighbors = torch.zeros(config.vocab_size - int(config.row_end), 10, dtype=torch.long, device="meta")
        for name, spec in planned_modes():
            for batch in batches:
                condition = condition_for(config, batch)
                tree = spec is not None and not isinstance(spec, JacobiConfig)
                plan = plan_run_memory(PlannedRun(model, condition, sampling, spec, drafter if tree else None,
                                                  neighbors if spec is not None else None, compile="auto",
                                                  device="cuda"))
                rows.append({"model": label, "mode": name, "batch": batch, "reserved_bytes": plan.peak,
                             "state_bytes": plan.state, "weights_bf16_bytes": weights,
                             "weights_int8_bytes": quantized,
                             "drafter_bytes": resident_bytes(drafter) if tree else 0})
    return rows


def planned_modes() -> list[tuple[str, object]]:
    picked = ("static_tree naive_extend_57", "lantern delta 0.1 (eagle2 d5 k10 n58)", "sjd_coupled w16",
              "sjd_coupled 2-D w15 + next row w16")
    return [("ar", None)] + [(n, s) for n, s in modes(10) if n in picked]


def condition_for(config: GPTConfig, batch: int) -> Condition:
    """Class labels, or a 64-token prompt and an 8-token unconditional prompt (a typical caption's length)."""
    if config.model_type != "prompt":
        return Condition.classes([0] * batch)
    ids = torch.ones(batch, 64, dtype=torch.long)
    u_ids = torch.ones(batch, 8, dtype=torch.long)
    return Condition(prompt_ids=ids, prompt_mask=ids.bool(), uncond_ids=u_ids, uncond_mask=u_ids.bool())


def scale_bytes(model: torch.nn.Module) -> int:
    """The per-output-channel scales int8 / fp8 weights add (one per row of each block linear, compute dtype)."""
    return sum(getattr(parent, name).weight.shape[0] * getattr(parent, name).weight.element_size()
               for _, parent, name in block_linears(model))


def markdown(report: dict) -> str:
    lines = [f"# Run memory: allocated vs reserved ({report['device']}, float32)", "",
             f"{report['model']}; {report['machine']}; torch {report['torch']}; cfg {report['cfg']}; {report['date']}",
             "", "| mode | batch | measured peak (MiB) | reserved by the sampler (MiB) | reserved / measured |",
             "|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['mode']} | {r['batch']} | {r['measured_peak_bytes'] / 2**20:.2f} | "
                     f"{r['reserved_bytes'] / 2**20:.2f} | {r['reserved_over_measured']:.3f} |")
    ratios = [r["reserved_over_measured"] for r in report["rows"]]
    if ratios:
        lines += ["", f"Reserved / measured: {min(ratios):.3f} to {max(ratios):.3f} (goal: within 15 %)."]
    lines += ["", "Measured: peak of live bytes of every storage the run's ops allocate (eager, the CPU; weights "
              "excluded). Reserved: `plan_run_memory`, a dry run of the same decoder on meta twins of the model "
              "and drafter (state, prefill, the widest iteration, the in-place shrink when images leave a batch), what the "
              "sampler node tells ComfyUI's model management and checks against the free memory before a run."]
    if report.get("planned_7b"):
        lines += ["", "## Planned on CUDA for the released 7B shapes (bf16, compile auto, cfg on; dry run only)", "",
                  "| model | mode | batch | run (MiB) | of which caches and tables | weights bf16 / int8 (MiB) | "
                  "drafter (MiB) | total with int8 weights |", "|---|---|---|---|---|---|---|---|"]
        for r in report["planned_7b"]:
            total = r["weights_int8_bytes"] + r["drafter_bytes"] + r["reserved_bytes"]
            lines.append(f"| {r['model']} | {r['mode']} | {r['batch']} | {r['reserved_bytes'] / 2**20:,.0f} | "
                         f"{r['state_bytes'] / 2**20:,.0f} | {r['weights_bf16_bytes'] / 2**20:,.0f} / "
                         f"{r['weights_int8_bytes'] / 2**20:,.0f} | {r['drafter_bytes'] / 2**20:,.0f} | "
                         f"{mib(total)} |")
        lines += ["", "Prompted models: a 64-token prompt and an 8-token unconditional prompt. Not counted: the "
                  "allocator's rounding, cuBLAS workspaces, Inductor's buffers beyond one iteration's activations, "
                  "and the VQ decoder (placed separately when previews or decoding run)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="run memory: allocated vs reserved (embedded model, CPU)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--only", default="", help="modes whose name starts with this")
    parser.add_argument("--cfg", type=float, default=3.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sampling = SamplingConfig(cfg_scale=args.cfg, temperature=1.0)
    report = {**machine_info(torch.device("cpu")), "model": EMBEDDED_NAME, "cfg": args.cfg,
              "rows": run(tuple(args.batches), args.only, sampling),
              "planned_7b": [] if args.only else planned_7b(tuple(args.batches), sampling)}
    write_report(args.out, "run_memory_cpu", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
