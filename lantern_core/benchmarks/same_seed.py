"""Same seed, same picture, measured: on the embedded model, each seeded image decoded by plain AR and by the
lossless tree modes and Jacobi windows, in each dtype and compile setting asked for. Per row: the share of images whose tokens equal
AR's (same dtype and setting), the share of tokens that do, where the first difference falls (a near-tie race
decided the other way, after which the images part), and tokens per forward; then how AR's own tokens agree across
dtypes and compile settings (the first pair is the reference). float64 must agree everywhere; in float32 and bf16
a difference is a near-tie flip of the arithmetic, and the report counts them.

    python -m lantern_core.benchmarks.same_seed --out bench/results                     # CPU: float64 and float32
    python -m lantern_core.benchmarks.same_seed --device cuda --dtype bfloat16 float32 --compile off graphs --out ...

Nothing here is asserted: `tests/core/test_same_as_ar.py` holds the float64 claims.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from ..conditioning import Condition
from ..config import SamplingConfig
from ..decoding.acceptance.neighbors import build_neighbors
from ..decoding.acceptance.relaxation import Relaxation
from ..decoding.generate import generate
from ..decoding.jacobi.config import JacobiConfig
from ..decoding.jacobi.driver import jacobi_generate
from ..decoding.sampling import make_generators
from ..decoding.trees.config import SpeculativeConfig
from ..decoding.trees.drafting import DynamicShape
from ..decoding.trees.driver import speculative_generate
from ..decoding.trees.specs import NAIVE_EXTEND_57
from ..loading.embedded import EMBEDDED_NAME, load_embedded
from .ar import machine_info
from .report_writer import Report

log = logging.getLogger("lantern_core.benchmarks.same_seed")
MODES = {
    "static_tree naive_extend_57": SpeculativeConfig(static_tree=NAIVE_EXTEND_57),
    "eagle2 d3 k4 n8": SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(3, 4, 8)),
    "lantern_pp lambda 1": SpeculativeConfig(static_tree=NAIVE_EXTEND_57, relaxation=Relaxation(k=10, lam=1.0)),
    "sjd_coupled w8": JacobiConfig(8, coupled=True, init="sample_left"),
    "sjd w16": JacobiConfig(16, init="sample_left"),
    "sjd continuation w8": JacobiConfig(8, init="sample_left", continuation=True),
    "sjd_coupled proactive 4 w8": JacobiConfig(8, coupled=True, init="sample_left", proactive=4),
}


def decode(pipe, spec, images: int, sampling: SamplingConfig, compile: str, neighbors) -> tuple[torch.Tensor, float]:
    """(images, N) tokens of seeds 0 .. images-1 (class i mod the classes), one image at a time, and tokens per
    forward."""
    rows, forwards = [], 0
    classes = pipe.gpt.config.num_classes
    for i in range(images):
        condition = Condition.classes([i % classes], device=neighbors.device)
        generators = make_generators(i, 1, neighbors.device)
        if spec is None:
            result = generate(pipe.gpt.model, condition, sampling, generators, compile=compile)
        elif isinstance(spec, JacobiConfig):
            result = jacobi_generate(pipe.gpt.model, condition, sampling, spec, generators, compile=compile)
        else:
            result = speculative_generate(pipe.gpt.model, pipe.drafter.model, condition, sampling, spec, generators,
                                          neighbors if spec.relaxation else None, compile=compile)
        rows.append(result.tokens.cpu())
        forwards += result.stats.forward_passes
    tokens = torch.cat(rows)
    return tokens, tokens.numel() / max(forwards, 1)


def compare(tokens: torch.Tensor, reference: torch.Tensor) -> dict:
    """Images equal, tokens equal, and the mean position of the first difference among the images that differ."""
    same = tokens == reference
    firsts = [int((~row).nonzero()[0]) for row in same if not bool(row.all())]
    return {"images_equal": float(same.all(-1).float().mean()), "tokens_equal": float(same.float().mean()),
            "first_difference": sum(firsts) / len(firsts) if firsts else None}


def markdown(report: dict) -> str:
    lines = [f"# Same seed, same picture ({report['device']})", "",
             f"{report['model']}; {report['machine']}; {report['images']} images per row (seeds 0 ..), batch 1, "
             f"cfg {report['cfg']}, temperature 1; {report['date']}", "",
             "| mode | dtype | compile | images = AR's | tokens = AR's | first difference (mean position) | "
             "tokens per forward |", "|---|---|---|---|---|---|---|"]
    for r in report.get("rows", []):
        first = "-" if r["first_difference"] is None else f"{r['first_difference']:.0f}"
        lines.append(f"| {r['mode']} | {r['dtype']} | {r['compile']} | {100 * r['images_equal']:.0f}% | "
                     f"{100 * r['tokens_equal']:.1f}% | {first} | {r['tokens_per_forward']:.2f} |")
    if report.get("across"):
        lines += ["", "AR's tokens against the first setting's (" + report["across_reference"] + "):", "",
                  "| dtype | compile | images equal | tokens equal | first difference |", "|---|---|---|---|---|"]
        for r in report["across"]:
            first = "-" if r["first_difference"] is None else f"{r['first_difference']:.0f}"
            lines.append(f"| {r['dtype']} | {r['compile']} | {100 * r['images_equal']:.0f}% | "
                         f"{100 * r['tokens_equal']:.1f}% | {first} |")
    lines += ["", "A lossless tree or Jacobi window keeps a drafted token only where it is AR's own draw, so its "
              "images are AR's; a difference is a race decided the other way by the rounding of another forward "
              "shape (a tree or window against AR's one-token step), after which the image parts from AR's: rare "
              "near-ties in float32, frequent in bf16, whose logits differ by about 1e-2 between shapes (each image "
              "is still an exact sample of the bf16 target). float64 rows must read 100%."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="same seed, same picture: lossless modes against AR")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", nargs="+", default=["float64", "float32"])
    parser.add_argument("--compile", nargs="+", default=["off"], choices=["off", "graphs", "auto"])
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--cfg", type=float, default=4.0)
    parser.add_argument("--only", nargs="*", default=[], help="mode-name prefixes (AR always runs)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device = torch.device(args.device)
    sampling = SamplingConfig(cfg_scale=args.cfg, temperature=1.0)
    info = machine_info(device)
    report = Report(args.out, f"same_seed_{device.type}_{'_'.join(args.dtype)}", markdown, model=EMBEDDED_NAME, images=args.images,
                    cfg=args.cfg, **info)
    report.update(machine=f"{info['machine']}; torch {info['torch']}, {info['threads']} threads", device=device.type)
    modes = {k: v for k, v in MODES.items() if not args.only or k.startswith(tuple(args.only))}
    reference = None
    for dtype_name in args.dtype:
        pipe = load_embedded(device, getattr(torch, dtype_name), drafter=True)
        neighbors = build_neighbors(pipe.vq.model.quantize.embedding.weight.float(), 10).to(device)
        for compile in args.compile:
            ar, _ = decode(pipe, None, args.images, sampling, compile, neighbors)
            if reference is None:
                reference = ar
                report.update(across_reference=f"{dtype_name}, compile {compile}")
            else:
                report.add("across", {"dtype": dtype_name, "compile": compile, **compare(ar, reference)})
            report.add("rows", {"mode": "ar", "dtype": dtype_name, "compile": compile, **compare(ar, ar),
                                "tokens_per_forward": 1.0})
            for name, spec in modes.items():
                tokens, per_forward = decode(pipe, spec, args.images, sampling, compile, neighbors)
                report.add("rows", {"mode": name, "dtype": dtype_name, "compile": compile, **compare(tokens, ar),
                                    "tokens_per_forward": per_forward})
                log.info("%s %s %s: %s", name, dtype_name, compile, report.data["rows"][-1])
    return report.finish()


if __name__ == "__main__":
    main()
