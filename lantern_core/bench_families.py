"""Benchmark of the prompted families (Chameleon / Anole, Janus-Pro) on the shared machinery.

For each family, a random-weight model of the family's shape (tiny on the CPU; the released sizes in
bf16 on a GPU) is timed side by side in one run: the forward-cost curve (one forward over n tokens at a
mid-image context, CFG rows) and whole images with plain AR, SJD and coupled SJD (auto window). Random
weights say nothing about image quality or the acceptance a trained model reaches; what this measures is
the machinery's cost per family (QK-norm, the Janus aligner/head, the 65k-vocabulary rows, prompt
prefill) and that every decoder runs on every family. Results: bench/results/families_<device>_<dtype>.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path

import torch

from .bench import machine_info, write_report
from .conditioning import Condition
from .config import GPTConfig, SamplingConfig
from .generate import generate, synchronize
from .jacobi import JacobiConfig, jacobi_generate
from .jacobi_window import curve_sizes
from .models.prompted import PromptedImageLM
from .tree_select import verify_times

log = logging.getLogger(__name__)


def family_config(family: str, size: str) -> GPTConfig:
    """Released shapes (`size` "7b" / "1b") or a CPU-sized "tiny" one with the same structure."""
    shapes = {
        ("chameleon", "7b"): dict(dim=4096, n_layer=32, n_head=32, ffn_dim=11008, text_vocab_size=65536,
                                  vocab_size=8192, grid_size=32),
        ("janus", "7b"): dict(dim=4096, n_layer=30, n_head=32, ffn_dim=11008, text_vocab_size=102400,
                              vocab_size=16384, grid_size=24),
        ("janus", "1b"): dict(dim=2048, n_layer=24, n_head=16, ffn_dim=5632, text_vocab_size=102400,
                              vocab_size=16384, grid_size=24),
        ("chameleon", "tiny"): dict(dim=256, n_layer=4, n_head=4, ffn_dim=688, text_vocab_size=8704,
                                    vocab_size=8192, grid_size=16),
        ("janus", "tiny"): dict(dim=256, n_layer=4, n_head=4, ffn_dim=688, text_vocab_size=4096,
                                vocab_size=16384, grid_size=16),
    }
    shape = shapes[(family, size)]
    extra = dict(qk_norm=True) if family == "chameleon" else dict(image_embed_dim=8)
    return GPTConfig(**shape, **extra, model_type="prompt", family=family, rope_dims=1, cls_token_num=64)


def random_prompted(config: GPTConfig, device, dtype) -> PromptedImageLM:
    with torch.device("meta"):
        model = PromptedImageLM(config)
    model = model.to_empty(device=device)
    model.rope_table = model._build_rope().to(device)
    model.init_weights(torch.Generator(device=device).manual_seed(0))
    return model.to(dtype=dtype).eval()


def random_condition(config: GPTConfig, batch: int, seed: int, device) -> Condition:
    """A 24-token prompt; unconditional rows as each family builds them (Janus: pads inside, same length;
    Chameleon: BOS + image start)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, config.text_vocab_size - 10, (batch, 24), generator=g)
    if config.family == "janus":
        uncond = ids.clone()
        uncond[:, 1:-1] = 1
    else:
        uncond = ids[:, [0, -1]]
    ones = lambda t: torch.ones_like(t, dtype=torch.bool)  # noqa: E731
    return Condition(prompt_ids=ids.to(device), prompt_mask=ones(ids).to(device), uncond_ids=uncond.to(device),
                     uncond_mask=ones(uncond).to(device))


def time_images(decode, images: int, device) -> float:
    """Median seconds per image of `decode(seed)`."""
    times = []
    for seed in range(images):
        synchronize(device)
        start = time.perf_counter()
        decode(seed)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_family(label: str, model: PromptedImageLM, images: int, device) -> dict:
    config = model.config
    sampling = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=0)
    curve = verify_times(model, 2, curve_sizes(32), reps=3)
    methods = {"ar": None, "sjd": JacobiConfig(window="auto"), "sjd_coupled": JacobiConfig(window="auto", coupled=True)}
    results = {}
    for name, jacobi in methods.items():
        passes = []

        def decode(seed, jacobi=jacobi, passes=passes):
            cond = random_condition(config, 1, seed, device)
            gen = torch.Generator(device=device).manual_seed(seed)
            if jacobi is None:
                result = generate(model, cond, sampling, gen)
            else:
                result = jacobi_generate(model, cond, sampling, jacobi, generator=gen)
            passes.append(result.stats.forward_passes)

        decode(999)  # warm-up (and the auto window's calibration)
        passes.clear()
        results[name] = {"s_per_image": round(time_images(decode, images, device), 4),
                         "forward_passes": round(statistics.mean(passes), 1)}
    ar = results["ar"]["s_per_image"]
    for row in results.values():
        row["speedup_vs_ar"] = round(ar / row["s_per_image"], 3)
    return {"model": label, "family": config.family, "dim": config.dim, "layers": config.n_layer,
            "image_tokens": config.num_image_tokens, "image_codes": config.vocab_size,
            "curve_ms": [(n, round(1000 * s, 3)) for n, s in curve], "methods": results}


def markdown(report: dict) -> str:
    lines = [f"# Prompted families ({report['device']}, {report['dtype']})", "",
             f"{report['machine']}; torch {report['torch']}, {report['threads']} threads; {report['date']}; "
             f"{report['images']} images per row, cfg 3, temperature 1; random weights (machinery cost, not "
             "quality or trained acceptance)", "",
             "| model | tokens | method | forward passes / image | s / image | speed-up vs AR |", "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        for name, m in r["methods"].items():
            lines.append(f"| {r['model']} | {r['image_tokens']} | {name} | {m['forward_passes']} | "
                         f"{m['s_per_image']:.3f} | {m['speedup_vs_ar']:.2f}x |")
    lines += ["", "Forward over n tokens (2 CFG rows, mid-image context), ms:", ""]
    for r in report["rows"]:
        lines.append(f"- {r['model']}: " + " / ".join(f"{n}:{ms:.2f}" for n, ms in r["curve_ms"]))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="Chameleon / Janus-Pro machinery benchmark (random weights)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--images", type=int, default=4)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    sizes = [("chameleon", "tiny"), ("janus", "tiny")] if device.type == "cpu" else \
        [("chameleon", "7b"), ("janus", "1b"), ("janus", "7b")]
    rows = []
    for family, size in sizes:
        model = random_prompted(family_config(family, size), device, dtype)
        rows.append(bench_family(f"{family} {size} (random)", model, args.images, device))
        log.info("%s", rows[-1])
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report = {**machine_info(device), "dtype": args.dtype, "images": args.images, "rows": rows}
    write_report(args.out, f"families_{device.type}_{args.dtype}", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
