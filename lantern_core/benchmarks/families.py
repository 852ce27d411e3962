"""Benchmark of the prompted families (Anole / Chameleon, Lumina-mGPT, Janus-Pro, Emu3) on the shared machinery.

For each family, a random-weight model of the family's shape (tiny on the CPU; the released sizes in
bf16 on a GPU) is timed side by side in one run: the forward-cost curve (one forward over n tokens at a
mid-image context, CFG rows) and whole images with plain AR, SJD and coupled SJD (auto window), and the
drafter modes (exact static tree, LANTERN++ with k = 10, lambda = 5 over a random codebook's
neighbours) with a drafter trained for `--train-steps` on the model's own samples (EAGLE's recipe, as
`train_drafter`). A random model has no prompts of its own: images are drawn for a pool of 8 random
prompts, and the drafter is distilled on other samples for the same prompts. A random target has no
structure to learn: the drafter fits its training sequences (top-1 ~0.8 there) but not new ones, and
Jacobi drafts rarely repeat, so acceptance stays near 1 token per step and these rows give the per-step
cost of each decoder on each family, not the speed-up a trained model reaches (the embedded model's
rows in speculative_cpu_float32 measure that). The random weights are drawn with a large std so next-token distributions are peaked
(about 3 nats, top token ~0.3) rather than uniform; they still say nothing about image quality or the
acceptance a trained model reaches. What this measures is the machinery's cost per family (QK-norm, the
Janus aligner/head, Lumina's end-of-row tokens, prompt prefill) and that every decoder runs on every
family (Emu3: GQA without QK-norm, 8-pixel codes with end-of-line tokens). Results:
bench/results/families_<device>_<dtype>.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from .ar import machine_info
from .report_writer import Report, merged_steps, step_cells, step_fields
from ..conditioning import Condition
from ..config import DrafterConfig, GPTConfig, SamplingConfig
from ..decoding.generate import generate, synchronize
from ..decoding.jacobi.config import JacobiConfig
from ..decoding.jacobi.driver import jacobi_generate
from ..decoding.jacobi.auto import curve_sizes
from ..models.drafter import EagleDrafter
from ..models.prompted import PromptedImageLM
from ..decoding.acceptance.neighbors import build_neighbors
from ..decoding.acceptance.relaxation import Relaxation
from ..decoding.trees.config import SpeculativeConfig
from ..decoding.trees.driver import speculative_generate
from .speculative import BENCH_COMPILE
from ..decoding.trees.specs import NAIVE_EXTEND_57
from ..decoding.cost_curve import verify_times

INIT_STD = 0.25  # peaked random next-token distributions (uniform ones would accept nothing)
PROMPTS = 8  # the prompt pool: drafters are distilled on these prompts and images are timed on them

log = logging.getLogger(__name__)


def family_config(family: str, size: str, grid: int | None = None) -> GPTConfig:
    """Released shapes (`size` "7b" / "1b"), a CPU-sized "tiny" one with the same structure or a "micro" one
    for smoke runs; `grid` overrides the token grid (smaller images for quick checks)."""
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
        # the code paths only (the GPU check's CPU dry run): 512 image codes keep the neighbour tables small
        ("chameleon", "micro"): dict(dim=64, n_layer=2, n_head=4, ffn_dim=172, text_vocab_size=1024,
                                     vocab_size=512, grid_size=8),
        ("janus", "micro"): dict(dim=64, n_layer=2, n_head=4, ffn_dim=172, text_vocab_size=1024,
                                 vocab_size=512, grid_size=8),
    }
    if family == "lumina":  # Chameleon's shape, the end-of-row token as one more image code, 768 px
        base = shapes[("chameleon", size)]
        shapes[(family, size)] = {**base, "vocab_size": base["vocab_size"] + 1,
                                  "grid_size": 48 if size == "7b" else base["grid_size"]}
    if family == "lumina2":  # Lumina-mGPT 2.0: a Chameleon-style decoder over MoVQGAN's 16,384 codes + the
        # end-of-row code, 768 px = 96 x 96 codes; sizes as its code and a third-party config give them
        base = shapes[("chameleon", size)]
        shapes[(family, size)] = {**base, "vocab_size": (16384 if size == "7b" else base["vocab_size"]) + 1,
                                  "text_vocab_size": 171385 if size == "7b" else base["text_vocab_size"] + 8192,
                                  "grid_size": 96 if size == "7b" else base["grid_size"]}
    if family == "emu3":  # Emu3-Gen: Llama layers with GQA (8 key/value heads), no QK-norm, RoPE base 1e6,
        # 32,768 codes + the end-of-line code, 720 px = 90 x 90 codes; the narrow shapes keep the GQA ratio
        base = shapes[("chameleon", size if size != "8b" else "7b")]
        shapes[(family, size)] = {**base, "vocab_size": (32768 if size == "8b" else base["vocab_size"]) + 1,
                                  "n_kv_head": base["n_head"] // 4 if size == "8b" else base["n_head"] // 2,
                                  "norm_eps": 1e-5, "rope_base": 1e6, **(
                                      dict(ffn_dim=14336, text_vocab_size=184622, grid_size=90) if size == "8b" else
                                      dict(text_vocab_size=base["text_vocab_size"] + 1024))}
    shape = {**shapes[(family, size)], **({"grid_size": grid} if grid else {})}
    extra = dict(qk_norm=family != "emu3", family="chameleon", row_end=family in ("lumina", "lumina2", "emu3")) \
        if family != "janus" else dict(image_embed_dim=8, family="janus")
    return GPTConfig(**shape, **extra, model_type="prompt", rope_dims=1, cls_token_num=64)


def random_prompted(config: GPTConfig, device, dtype) -> PromptedImageLM:
    with torch.device("meta"):
        model = PromptedImageLM(config)
    model = model.to_empty(device=device)
    model.rope_table = model._build_rope().to(device)
    model.init_weights(torch.Generator(device=device).manual_seed(0), std=INIT_STD)
    return model.to(dtype=dtype).eval()


def trained_drafter(model: PromptedImageLM, steps: int, device) -> EagleDrafter:
    """A drafter for `model` trained for `steps` on the model's own samples (self-distillation)."""
    from ..training.train_drafter import Recipe, self_distilled_data, train_drafter

    drafter = EagleDrafter(DrafterConfig.for_target(model.config)).to(device)
    drafter.init_from_target(model, torch.Generator(device=device).manual_seed(0))
    if steps <= 0:
        return drafter.eval()
    samples = PROMPTS * max(1, min(8, steps // 25))  # each pool prompt, several sampled images
    pool = prompt_pool(model.config, device)
    prompts = Condition(**{f: getattr(pool, f).repeat(samples // PROMPTS, 1) for f in
                           ("prompt_ids", "prompt_mask", "uncond_ids", "uncond_mask")})
    data = self_distilled_data(model, prompts, SamplingConfig(cfg_scale=3.0, temperature=1.0), seed=100, chunk=16)
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        epochs = max(1, -(-steps * 8 // samples))
        drafter, _ = train_drafter(model, data, Recipe(epochs=epochs, batch=8, lr=1e-3, checkpoint_every=10**6),
                                   scratch, drafter=drafter, max_steps=steps)
    return drafter.eval()


def random_condition(config: GPTConfig, batch: int, seed: int, device) -> Condition:
    """A 24-token prompt; unconditional rows as each family builds them (Janus: pads inside, same length;
    Anole: BOS + image start; Lumina: image start + the two size tokens)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, config.text_vocab_size - 10, (batch, 24), generator=g)
    if config.family == "janus":
        uncond = ids.clone()
        uncond[:, 1:-1] = 1
    elif config.row_end:
        uncond = ids[:, -3:]
    else:
        uncond = ids[:, [0, -1]]
    ones = lambda t: torch.ones_like(t, dtype=torch.bool)  # noqa: E731
    return Condition(prompt_ids=ids.to(device), prompt_mask=ones(ids).to(device), uncond_ids=uncond.to(device),
                     uncond_mask=ones(uncond).to(device))


def prompt_pool(config: GPTConfig, device) -> Condition:
    """The PROMPTS random prompts images are drawn for (a random model has no prompts of its own)."""
    return random_condition(config, PROMPTS, 7, device)


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


def bench_family(label: str, model: PromptedImageLM, images: int, device, drafter: EagleDrafter,
                 only: tuple[str, ...] = (), progress: Callable[[dict], None] = lambda row: None) -> dict:
    """The family's row: its cost curve, then AR and the methods whose names start with one of `only` (all when
    empty), `progress(row)` after each."""
    config = model.config
    sampling = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=0)
    curve = verify_times(model, 2, curve_sizes(32), reps=3)
    codebook = torch.randn(config.vocab_size - int(config.row_end), 8, generator=torch.Generator().manual_seed(1))
    neighbors = build_neighbors(codebook, 10).to(device)
    pool = prompt_pool(config, device)
    rows = dict(coupled=True, init="sample_left", rows=4, row_window=4)  # 2-D at each family's own row stride
    methods = {"ar": None, "sjd": JacobiConfig(window="auto"), "sjd_coupled": JacobiConfig(window="auto", coupled=True),
               "sjd_coupled 2-D": JacobiConfig(window=4, **{**rows, "rows": 2}, row_offset=0),
               "sjd_2d_relaxed": JacobiConfig(window="auto", **rows, row_commit=True, row_lead=0),
               "static_tree": SpeculativeConfig(tree="static", static_tree=NAIVE_EXTEND_57),
               "lantern_pp": SpeculativeConfig(tree="static", static_tree=NAIVE_EXTEND_57,
                                               relaxation=Relaxation(k=10, lam=5.0))}
    results = {}
    row = {"model": label, "family": config.family, "dim": config.dim, "layers": config.n_layer,
           "image_tokens": config.num_image_tokens, "image_codes": config.vocab_size,
           "curve_ms": [(n, round(1000 * s, 3)) for n, s in curve], "methods": results}
    progress(row)
    for name, method in methods.items():
        if name != "ar" and only and not name.startswith(only):
            continue
        passes, accepted, steps = [], [], []

        def decode(seed, method=method, passes=passes, accepted=accepted, steps=steps):
            cond = pool.row(seed % PROMPTS)
            gen = torch.Generator(device=device).manual_seed(seed)
            if method is None:
                result = generate(model, cond, sampling, gen, compile=BENCH_COMPILE)
            elif isinstance(method, JacobiConfig):
                result = jacobi_generate(model, cond, sampling, method, generator=gen, neighbors=neighbors,
                                         compile=BENCH_COMPILE)
            else:
                result = speculative_generate(model, drafter, cond, sampling, method, gen, neighbors,
                                              compile=BENCH_COMPILE)
            passes.append(result.stats.forward_passes)
            accepted.append(result.stats.mean_accepted_length)
            steps.append(result.stats.steps)

        decode(999)  # warm-up (and the auto window's calibration)
        passes.clear(), accepted.clear(), steps.clear()
        seconds = time_images(decode, images, device)
        results[name] = {"s_per_image": round(seconds, 4), "forward_passes": round(statistics.mean(passes), 1),
                         "mean_accepted_length": round(statistics.mean(accepted), 3),
                         "speedup_vs_ar": round(results["ar"]["s_per_image"] / seconds, 3) if results else 1.0,
                         **step_fields(merged_steps(steps))}
        progress(row)
    return row


def markdown(report: dict) -> str:
    lines = [f"# Prompted families ({report['device']}, {report['dtype']})", "",
             f"{report['machine']}; torch {report['torch']}, {report['threads']} threads; {report['date']}; "
             f"{report['images']} images per row, cfg 3, temperature 1; random weights with peaked next-token "
             f"distributions (init std {report.get('init_std', INIT_STD)}): a random target has no structure a drafter "
             "or a Jacobi window can exploit, so these rows are each decoder's per-step cost on each family, not "
             "speed-ups; drafters trained "
             f"{report.get('train_steps', 0)} steps on the model's own samples for the same {PROMPTS} prompts the images "
             "are drawn for; LANTERN++: naive_extend_57, k 10, "
             "lambda 5 over a random codebook", "",
             "| model | tokens | method | forward passes / image | mean accepted length | s / image | speed-up vs AR | "
             "graphs | compiled |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report.get("rows", []):
        for name, m in r["methods"].items():
            lines.append(f"| {r['model']} | {r['image_tokens']} | {name} | {m['forward_passes']} | "
                         f"{m.get('mean_accepted_length', 1.0):.2f} | {m['s_per_image']:.3f} | "
                         f"{m['speedup_vs_ar']:.2f}x | {step_cells(m)} |")
    lines += ["", "Forward over n tokens (2 CFG rows, mid-image context), ms:", ""]
    for r in report.get("rows", []):
        lines.append(f"- {r['model']}: " + " / ".join(f"{n}:{ms:.2f}" for n, ms in r["curve_ms"]))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="Chameleon / Janus-Pro machinery benchmark (random weights)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--images", type=int, default=3)
    parser.add_argument("--grid", type=int, default=None, help="token grid side (default: each model's own)")
    parser.add_argument("--train-steps", type=int, default=None,
                        help="drafter training steps per family (default: 100 on the CPU, 0 on a GPU: random drafter)")
    parser.add_argument("--models", nargs="*", default=None, metavar="FAMILY:SIZE",
                        help="e.g. chameleon:7b janus:1b (default: every family, tiny on the CPU, released on a GPU)")
    parser.add_argument("--only", nargs="*", default=[], help="method-name prefixes to time (AR always runs)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    sizes = [tuple(m.split(":")) for m in args.models] if args.models is not None else \
        [("chameleon", "tiny"), ("lumina", "tiny"), ("janus", "tiny"), ("emu3", "tiny"), ("lumina2", "tiny")] \
        if device.type == "cpu" else \
        [("chameleon", "7b"), ("lumina", "7b"), ("janus", "1b"), ("janus", "7b"), ("emu3", "8b")]
    steps = args.train_steps if args.train_steps is not None else (100 if device.type == "cpu" else 0)
    report = Report(args.out, f"families_{device.type}_{args.dtype}", markdown, **machine_info(device),
                    dtype=args.dtype, images=args.images, init_std=INIT_STD, train_steps=steps, rows=[])
    rows = report.data["rows"]
    for family, size in sizes:
        model = random_prompted(family_config(family, size, args.grid), device, dtype)
        drafter = trained_drafter(model, steps, device).to(dtype)
        rows.append({})

        def progress(row: dict) -> None:  # the family's row so far replaces its slot; every method rewrites the files
            rows[-1] = row
            report.save()

        bench_family(f"{family} {size} (random)", model, args.images, device, drafter, tuple(args.only), progress)
        log.info("%s", rows[-1])
        del model, drafter
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return report.finish()


if __name__ == "__main__":
    main()
