"""Benchmarks for AR generation (`make bench`): tokens/s and ms per step for the embedded model and
GPT-B-size random weights, the overhead of sampling/caching/bookkeeping over the bare model forward
(measured side by side in one run), and the cost curve of one forward that verifies n tokens at once,
which the speculative decoders plan with. Writes JSON + markdown. Timings are never asserted here.

    python -m lantern_core.benchmarks.ar --out bench/results                          # CPU, fp32
    python -m lantern_core.benchmarks.ar --device cuda --dtype bfloat16 --profile cuda  # GPU check, < 5 min
    python -m lantern_core.benchmarks.ar --only embedded --batches 1 --out /tmp/b     # one model, batch 1
    python -m lantern_core.benchmarks.ar --device cuda --dtype bfloat16 --skip GPT-XL:1 --tag _rest  # the others
"""
from __future__ import annotations

import argparse
import logging
import platform
import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..conditioning import Condition
from ..config import GPTConfig, SamplingConfig, gpt_preset
from ..loading.embedded import EMBEDDED_GPT, EMBEDDED_NAME
from ..decoding.generate import generate, synchronize
from ..decoding.ar_step import slots_for, window_for
from ..decoding.step_graphs import layout_for, uses_graphs, uses_inductor
from ..models.gpt import ForwardStep, LlamaGenGPT
from ..models.kv_cache import attention_mask
from ..decoding.sampling import make_generators
from ..decoding.cost_curve import verify_times
from .report_writer import Report, merged_steps, step_cells, step_fields

log = logging.getLogger("lantern_core.benchmarks.ar")
VERIFY_SIZES = (1, 4, 8, 16, 32, 64)


@dataclass
class ARRow:
    model: str
    batch: int
    rows: int  # batch x 2 with CFG
    tokens: int
    gen_ms_per_step: float  # generate as users get it: captured CUDA graphs on CUDA, eager elsewhere
    bare_ms_per_step: float
    overhead_pct: float
    tokens_per_s: float
    repeats: int
    eager_ms_per_step: float  # generate(compile="off"); equals gen_ms_per_step where nothing is captured
    capture_speedup: float  # eager / captured
    compiled_ms_per_step: float = float("nan")  # compile "auto": Inductor + graphs (CUDA with Triton, batch 1)
    graphs: str = "off"  # how the timed graphs and auto runs' steps ran (`report_writer.step_fields`)
    compiled: str = "off"
    fell_back: bool = False


@dataclass
class VerifyRow:
    model: str
    n_tokens: int
    context: int
    ms: float
    ms_per_token: float
    relative_to_n1: float


@torch.no_grad()
def bare_forward_ms(model: LlamaGenGPT, rows: int, n_tokens: int) -> float:
    """ms per step of the same forwards `generate` runs (prefill + decode, static cache), nothing else: on a device
    that captures, the same 64-slot attention windows and key mask as the captured step; elsewhere the exact
    slice without a mask, as there. Positions are sliced from one device tensor (no upload per step)."""
    device = model.tok_embeddings.weight.device
    c = model.config
    layout = layout_for("auto", device)
    labels = torch.zeros(rows, dtype=torch.long, device=device)
    synchronize(device)
    start = time.perf_counter()
    prefix = model.embed_condition(labels) if c.model_type == "c2i" else None
    assert prefix is not None, "bench uses class-conditional models"
    T = prefix.shape[1]
    slots = slots_for(T, n_tokens, layout.slot_bucket)
    cache = model.allocate_cache(rows, slots)
    positions = torch.arange(slots, device=device)
    key_valid = torch.ones(rows, cache.max_len, dtype=torch.bool, device=device)
    model.logits(model(prefix, ForwardStep(positions[:T], cache, T, attention_mask(key_valid, positions[:T], T)))[:, -1])
    fed = torch.zeros(rows, 1, dtype=torch.long, device=device)
    for i in range(1, n_tokens):
        pos = T + i - 1
        slot = positions[pos:pos + 1]  # (1,) a view: no host-to-device copy
        if layout.exact:
            step = ForwardStep(slot, cache, pos + 1)
        else:
            window = window_for(pos, slots)
            mask = (positions[:window] <= slot)[None, None, None, :].expand(rows, 1, 1, window)
            step = ForwardStep(slot, cache, window, mask)
        model.logits(model(model.embed_tokens(fed), step)[:, -1])
    synchronize(device)
    return 1000.0 * (time.perf_counter() - start) / n_tokens


def bench_ar(model: LlamaGenGPT, name: str, batch: int, cfg_scale: float, repeats: int) -> ARRow:
    device = model.tok_embeddings.weight.device
    n = model.config.num_image_tokens
    sampling = SamplingConfig(cfg_scale=cfg_scale, temperature=1.0, top_k=0)
    rows = batch * (2 if sampling.uses_cfg else 1)
    condition = Condition.classes([i % model.config.num_classes for i in range(batch)], device=device)
    captured = uses_graphs("graphs", device)
    # one Inductor compile per model, at batch 1, up to GPT-XL's width (a 7B compile would outlast the GPU check)
    compiled = batch == 1 and model.config.dim <= 1280 and uses_inductor("auto", device)
    generate(model, condition, sampling, make_generators(0, batch, device), compile="graphs")  # warm-up (capture)
    if captured:
        generate(model, condition, sampling, make_generators(0, batch, device), compile="off")
    if compiled:
        generate(model, condition, sampling, make_generators(0, batch, device), compile="auto")  # compiles
    bare_forward_ms(model, rows, n)
    gen, eager, fused, bare, steps = [], [], [], [], []
    for r in range(repeats):  # interleaved, so drift affects every column alike
        stats = generate(model, condition, sampling, make_generators(r, batch, device), compile="graphs").stats
        gen.append(stats.ms_per_step)
        steps.append(stats.steps)
        if captured:
            eager.append(generate(model, condition, sampling, make_generators(r, batch, device),
                                  compile="off").stats.ms_per_step)
        if compiled:
            stats = generate(model, condition, sampling, make_generators(r, batch, device), compile="auto").stats
            fused.append(stats.ms_per_step)
            steps.append(stats.steps)
        bare.append(bare_forward_ms(model, rows, n))
    g, b = statistics.median(gen), statistics.median(bare)
    e = statistics.median(eager) if eager else g
    return ARRow(name, batch, rows, n, round(g, 3), round(b, 3), round(100.0 * (g / b - 1.0), 2),
                 round(1000.0 * batch / g, 2), repeats, round(e, 3), round(e / g, 3),
                 round(statistics.median(fused), 3) if fused else float("nan"), **step_fields(merged_steps(steps)))


def bench_verify(model: LlamaGenGPT, name: str, rows: int, repeats: int) -> list[VerifyRow]:
    """The verify cost curve (`cost_curve.verify_times`) for windows that fit in the image."""
    c = model.config
    context = c.cls_token_num + c.num_image_tokens // 2
    sizes = tuple(n for n in VERIFY_SIZES if context + n <= c.max_seq_len)
    times = [(n, 1000.0 * s) for n, s in verify_times(model, rows, sizes, repeats)]
    return [VerifyRow(name, n, context, round(ms, 3), round(ms / n, 3), round(ms / times[0][1], 3))
            for n, ms in times]


def random_model(config: GPTConfig, device, dtype) -> LlamaGenGPT:
    with torch.device("meta"):
        model = LlamaGenGPT(config)
    model = model.to_empty(device=device)
    model.rope_table = model._build_rope().to(device)
    model.init_weights(torch.Generator(device=device).manual_seed(0))
    return model.to(dtype=dtype).eval()


# A 7B LlamaGen-architecture shape (Anole / Lumina-mGPT / Janus-Pro-7B trunks are this size) on a 24 x 24 grid.
SEVEN_B = GPTConfig(dim=4096, n_layer=32, n_head=32, ffn_dim=11008, vocab_size=16384, model_type="c2i",
                    num_classes=1000, cls_token_num=1, grid_size=24)
# The code paths only (the GPU check's CPU dry run, `--model tiny`): 2 layers, 64 wide, an 8 x 8 grid.
TINY_SHAPE = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=256, model_type="c2i", num_classes=8, cls_token_num=1,
                       grid_size=8)

PROFILES = {
    # name: list of (label, config or None for embedded, batches, AR repeats, verify repeats)
    "cpu": [("embedded", None, (1, 4), 3, 5), ("GPT-B c2i 256px (random)", gpt_preset("GPT-B", "c2i", 256), (1, 4), 1, 3)],
    "cuda": [("embedded", None, (1, 4), 3, 10), ("GPT-B c2i 256px (random)", gpt_preset("GPT-B", "c2i", 256), (1, 4), 3, 10),
             ("GPT-XL c2i 384px (random)", gpt_preset("GPT-XL", "c2i", 384), (1, 4), 2, 10),
             ("7B shape c2i 384px (random; dim 4096, 32 layers)", SEVEN_B, (1,), 1, 5)],
    "smoke": [("tiny c2i 8x8 (random; dim 64, 2 layers)", TINY_SHAPE, (1, 2), 1, 1)],  # the code paths only
}


def free_between_models() -> None:
    """Collect the dropped model (its captured steps go with it: the registry holds models weakly) and give
    cached CUDA blocks back before the next model."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def file_tag(tag: str) -> str:
    """A subset run's file-name part (`--tag`), in characters every file system keeps."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", tag)


def machine_info(device: torch.device) -> dict:
    """Where and when a benchmark ran (every report carries it)."""
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return {"device": str(device), "machine": machine, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M")}


def markdown(report: dict) -> str:
    lines = [f"# AR benchmark ({report['device']}, {report['dtype']})", "",
             f"{report['machine']}; torch {report['torch']}, {report['threads']} threads; "
             f"cfg {report['cfg_scale']}, temperature 1.0; {report['date']}", "",
             "## AR generation vs the bare model forward (same run, interleaved, medians)", "",
             "| model | batch | rows | tokens | ms/step (generate, compile graphs) | ms/step (eager, compile off) | "
             "capture speed-up | ms/step (compile auto: Inductor + graphs) | ms/step (bare eager forward) | "
             "overhead vs bare | tokens/s | graphs | compiled |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["ar"]:
        fused = r.get("compiled_ms_per_step", float("nan"))
        fused = "" if fused != fused else f"{fused:.3f}"  # NaN: not measured (CPU, or batch > 1)
        lines.append(f"| {r['model']} | {r['batch']} | {r['rows']} | {r['tokens']} | {r['gen_ms_per_step']:.3f} | "
                     f"{r['eager_ms_per_step']:.3f} | {r['capture_speedup']:.2f}x | {fused} | "
                     f"{r['bare_ms_per_step']:.3f} | {r['overhead_pct']:+.1f}% | {r['tokens_per_s']:.1f} | "
                     f"{step_cells(r)} |")
    lines += ["", "## One forward verifying n tokens (rows = 2 for CFG, mid-image context)", "",
              "| model | n | context | ms | ms/token | cost vs n=1 |", "|---|---|---|---|---|---|"]
    for r in report["verify"]:
        lines.append(f"| {r['model']} | {r['n_tokens']} | {r['context']} | {r['ms']:.2f} | {r['ms_per_token']:.3f} | "
                     f"{r['relative_to_n1']:.2f}x |")
    for e in report.get("errors", []):
        lines.append(f"\nFailed: {e}")
    if report["ar"]:
        worst = max(r["overhead_pct"] for r in report["ar"] if r["capture_speedup"] == 1.0) \
            if any(r["capture_speedup"] == 1.0 for r in report["ar"]) else None
        lines += ["", "`generate` replays captured CUDA graphs on CUDA (`compile=graphs`) and runs eagerly elsewhere; "
                      "`compile=auto` also fuses the step with Inductor first (CUDA with Triton, batch 1 rows); "
                      "the bare forward is the same model's eager forwards with nothing else (on CUDA the same "
                      "64-slot windows and mask as the captured step). `graphs`: how the timed graphs and auto "
                      "runs' steps ran (all replayed, partial, none: a fallback; off: nothing captured on this "
                      "device); `compiled`: whether Inductor fused the auto runs' step (off: not measured)."]
        if worst is not None:
            lines.append(f"Goal (eager): sampling, caching and bookkeeping add at most 10% to the bare forward. "
                         f"Worst overhead in this run: {worst:+.1f}% ({'met' if worst <= 10 else 'NOT met'}).")
    return "\n".join(lines) + "\n"


def profile_models(profile: str, only: tuple[str, ...] = (), batches: tuple[int, ...] = (),
                   skip: tuple[tuple[str, int], ...] = ()) -> list[tuple]:
    """The profile's (label, config, batches, AR repeats, verify repeats), kept to the labels starting with one of
    `only` (all when empty) and to the batch sizes in `batches` (each model's own when empty), without the
    (label prefix, batch) pairs in `skip` (measured by another run)."""
    chosen = []
    for label, config, own, ar_repeats, verify_repeats in PROFILES[profile]:
        if only and not label.startswith(only):
            continue
        kept = tuple(b for b in own if (not batches or b in batches)
                     and not any(label.startswith(prefix) and b == batch for prefix, batch in skip))
        chosen.append((label, config, kept, ar_repeats, verify_repeats))
    return chosen


def skip_pair(text: str) -> tuple[str, int]:
    """`--skip` 'LABEL-PREFIX:BATCH' -> (prefix, batch)."""
    prefix, _, batch = text.rpartition(":")
    if not prefix or not batch.isdigit():
        raise argparse.ArgumentTypeError(f"expected LABEL-PREFIX:BATCH, e.g. GPT-XL:1, got {text!r}")
    return prefix, int(batch)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="AR generation benchmark")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--profile", default=None, choices=sorted(PROFILES), help="default: by device type")
    parser.add_argument("--cfg", type=float, default=4.0)
    parser.add_argument("--only", nargs="*", default=[], help="model-label prefixes to run (default: all)")
    parser.add_argument("--batches", type=int, nargs="*", default=[],
                        help="batch sizes to keep (default: each model's own)")
    parser.add_argument("--skip", type=skip_pair, nargs="*", default=[],
                        help="LABEL-PREFIX:BATCH pairs to leave out (e.g. GPT-XL:1, measured by another run)")
    parser.add_argument("--tag", default="", help="a file-name part for a subset run (e.g. _rest: ar_rest_cuda_...)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    profile = args.profile or ("cuda" if device.type == "cuda" else "cpu")
    from ..loading.checkpoints import load_gpt

    report = Report(args.out, f"ar{file_tag(args.tag)}_{device.type}_{args.dtype}", markdown, **machine_info(device),
                    dtype=args.dtype, cfg_scale=args.cfg, ar=[], verify=[], errors=[])
    for label, config, batches, ar_repeats, verify_repeats in profile_models(profile, tuple(args.only),
                                                                             tuple(args.batches), tuple(args.skip)):
        try:  # one model failing (memory, a kernel) must not lose the others' rows
            if config is None:
                model, label = load_gpt(EMBEDDED_GPT, device=device, dtype=dtype).model, EMBEDDED_NAME
            else:
                model = random_model(config, device, dtype)
            for batch in batches:
                row = bench_ar(model, label, batch, args.cfg, ar_repeats)
                log.info("%s", row)
                report.add("ar", asdict(row))  # after every row: a later failure or a timeout loses nothing
            for row in bench_verify(model, label, rows=2, repeats=verify_repeats):
                report.add("verify", asdict(row))
        except Exception as error:
            log.exception("%s failed", label)
            report.add("errors", f"{label}: {type(error).__name__}: {str(error)[:300]}")
        finally:
            model = None
            free_between_models()
    return report.finish()


if __name__ == "__main__":
    main()
