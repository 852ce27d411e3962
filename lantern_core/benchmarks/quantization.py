"""Weight-only quantization benchmark (`make bench`): what int8 and fp8 cost in fidelity and save in bytes.

For each weight format against the same model in the compute dtype:
- bytes: weights resident for the embedded model, a random GPT-B and a 7B LlamaGen shape (GPT-7B at 384 px,
  built on the meta device: exact byte counts, no 7B allocation);
- fidelity, teacher-forced over real images' token sequences (random crops of the embedded model's eight
  photos, encoded by its VQ; each crop's own class): max and mean |logit error|, top-1 agreement of the
  next-token laws and mean KL(compute dtype || quantized) in nats, at cfg 1 and at the sampling cfg (on the
  CFG-mixed law); the bfloat16-vs-float32 row says how much rounding the compute dtype alone already costs.
  GPT-B with random weights gets the same columns over random token sequences (its laws are near uniform);
- quality: `make bench`'s columns (classifier accuracy, Frechet distance on classifier features against real
  crops, token-marginal TVD against AR) for AR images of each format, with a second compute-dtype AR row on
  other seeds as the noise floor.

Timings are not taken here (batch-1 steps are launch-bound on the CPU; `bench-cuda` measures a GPU).

    python -m lantern_core.benchmarks.quantization --out bench/results
    python -m lantern_core.benchmarks.quantization --images 16 --crops 16 --out /tmp/q     # quick look
"""
from __future__ import annotations

import argparse
import copy
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..conditioning import Condition
from ..config import SamplingConfig, gpt_preset
from ..decoding.generate import generate
from ..decoding.sampling import make_generators
from ..decoding.sampling import NodeDistributions
from ..loading.embedded import EMBEDDED_GPT, EMBEDDED_NAME, EMBEDDED_VQ, load_classifier, load_gpt, load_vq
from ..models.gpt import LlamaGenGPT
from ..models.quantized import SCHEMES, quantize_blocks, resident_bytes
from .ar import machine_info
from .report_writer import write_report
from .speculative import frechet, marginal_tvd, real_crop_features

log = logging.getLogger("lantern_core.benchmarks.quantization")
FORMATS = ("int8", "fp8")


@dataclass(frozen=True)
class Fidelity:
    """One format against the reference, over teacher-forced positions."""

    model: str
    weights: str
    reference: str
    cfg_scale: float
    positions: int
    max_abs_logit_error: float
    mean_abs_logit_error: float
    top1_agreement: float
    mean_kl_nats: float


def bytes_rows() -> list[dict]:
    """Resident weight bytes for each format: embedded (float32 as shipped and bfloat16), GPT-B and GPT-7B
    shapes in bfloat16 (meta device: exact sizes, nothing allocated)."""
    rows = []
    shapes = {"GPT-B c2i 256px": gpt_preset("GPT-B"), "GPT-7B t2i 384px (LlamaGen 7B shape)":
              gpt_preset("GPT-7B", "t2i", 384)}
    for name, config in shapes.items():
        with torch.device("meta"):
            base = LlamaGenGPT(config).to(torch.bfloat16)
            row = {"model": name, "dtype": "bfloat16", "none": resident_bytes(base)}
            for fmt in FORMATS:
                row[fmt] = resident_bytes(quantize_blocks(copy.deepcopy(base), SCHEMES[fmt]))
        rows.append(row)
    for dtype in (torch.float32, torch.bfloat16):
        base = load_gpt(EMBEDDED_GPT, dtype=dtype).model
        row = {"model": EMBEDDED_NAME, "dtype": str(dtype).removeprefix("torch."), "none": resident_bytes(base)}
        for fmt in FORMATS:
            row[fmt] = resident_bytes(load_gpt(EMBEDDED_GPT, dtype=dtype, weights=fmt).model)
        rows.append(row)
    return rows


def real_sequences(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels (count,), tokens (count, N)): random crops of the embedded model's photos through its VQ."""
    from ..training.train_embedded import load_photos, random_crops

    vq = load_vq(EMBEDDED_VQ).model
    labels = np.repeat(np.arange(8), -(-count // 8))[:count]
    with torch.no_grad():
        crops = random_crops(load_photos(), labels, np.random.default_rng(seed))
        tokens = torch.cat([vq.encode(chunk) for chunk in crops.split(32)])
    return torch.as_tensor(labels, dtype=torch.long), tokens


@torch.no_grad()
def law_logits(model: LlamaGenGPT, labels: torch.Tensor, tokens: torch.Tensor, cfg_scale: float) -> torch.Tensor:
    """Teacher-forced log-probabilities (B, N, V) in float32 of the law the sampler draws from (CFG mixed)."""
    sampling = SamplingConfig(cfg_scale=cfg_scale, temperature=1.0)
    if sampling.uses_cfg:
        null = torch.full_like(labels, model.config.num_classes)
        labels, tokens_in = torch.cat([labels, null]), torch.cat([tokens, tokens])
    else:
        tokens_in = tokens
    logits = model.training_logits(labels, tokens_in)  # (rows, N, V)
    dist = NodeDistributions(sampling, sampling.uses_cfg)
    N = tokens.shape[1]
    return torch.cat([dist.log_probs(logits[:, t:t + 1], torch.tensor([t])) for t in range(N)], dim=1).float()


def compare(name: str, weights: str, reference: str, ref: torch.Tensor, test: torch.Tensor,
            cfg_scale: float) -> Fidelity:
    """Fidelity of log-laws `test` against `ref` (B, N, V); logits compared after centring (log-softmax)."""
    error = (test - ref).abs()
    kl = (ref.exp() * (ref - test)).sum(-1)  # (B, N)
    agree = (ref.argmax(-1) == test.argmax(-1)).float()
    return Fidelity(name, weights, reference, cfg_scale, int(agree.numel()), float(error.max()), float(error.mean()),
                    float(agree.mean()), float(kl.mean()))


@torch.no_grad()
def fidelity_rows(crops: int, cfg_scale: float, seed: int) -> list[Fidelity]:
    labels, tokens = real_sequences(crops, seed)
    rows = []
    models = {(dtype, fmt): load_gpt(EMBEDDED_GPT, dtype=dtype, weights=fmt).model  # each loaded once
              for dtype in (torch.float32, torch.bfloat16) for fmt in ("none", *FORMATS)}
    for cfg in (1.0, cfg_scale):
        laws = {key: law_logits(model, labels, tokens, cfg) for key, model in models.items()}
        ref, bf16 = laws[(torch.float32, "none")], laws[(torch.bfloat16, "none")]
        for fmt in FORMATS:
            rows.append(compare(EMBEDDED_NAME, fmt, "float32", ref, laws[(torch.float32, fmt)], cfg))
        rows.append(compare(EMBEDDED_NAME, "none (bfloat16)", "float32", ref, bf16, cfg))
        for fmt in FORMATS:
            rows.append(compare(EMBEDDED_NAME, f"{fmt} (bfloat16)", "bfloat16", bf16, laws[(torch.bfloat16, fmt)], cfg))
    model = LlamaGenGPT(gpt_preset("GPT-B"))
    g = torch.Generator().manual_seed(seed)
    model.init_weights(g)
    model.output.weight.normal_(0.0, model.config.dim ** -0.5, generator=g)  # LlamaGen's init zeroes the head
    model.eval()
    labels = torch.randint(0, model.config.num_classes, (4,), generator=g)
    tokens = torch.randint(0, model.config.vocab_size, (4, model.config.num_image_tokens), generator=g)
    ref = law_logits(model, labels, tokens, 1.0)
    for fmt in FORMATS:
        test = law_logits(quantize_blocks(copy.deepcopy(model), SCHEMES[fmt]), labels, tokens, 1.0)
        rows.append(compare("GPT-B, random weights, random tokens", fmt, "float32", ref, test, 1.0))
    return rows


@torch.no_grad()
def quality_rows(images: int, batch: int, sampling: SamplingConfig) -> list[dict]:
    """AR images per format (same seeds) and a float32 AR row on other seeds: make bench's quality columns."""
    models = {"none": load_gpt(EMBEDDED_GPT).model}
    models.update({fmt: load_gpt(EMBEDDED_GPT, weights=fmt).model for fmt in FORMATS})
    rows = [("none", 0, "none"), ("none (other seeds)", 100_000, "none"), *((f, 0, f) for f in FORMATS)]
    vq = load_vq(EMBEDDED_VQ).model
    clf = load_classifier()
    real = real_crop_features(clf, max(images, 64), seed=4242)
    labels = torch.arange(images) % 8
    tokens = {}
    for name, offset, fmt in rows:
        chunks = []
        for start in range(0, images, batch):
            part = labels[start:start + batch]
            gens = make_generators(start + offset, len(part))
            chunks.append(generate(models[fmt], Condition.classes(part), sampling, gens, compile="off").tokens)
        tokens[name] = torch.cat(chunks)
        log.info("quality: %s done", name)
    out = []
    for name, _, _ in rows:
        feats, preds = [], []
        for chunk in tokens[name].split(32):
            f = clf.features(vq.decode(chunk).clamp(-1, 1)).mean(dim=(2, 3))
            feats.append(f)
            preds.append(clf.head(f).argmax(-1))
        out.append({"weights": name, "images": images,
                    "classifier_accuracy": float((torch.cat(preds) == labels).float().mean()),
                    "frechet_vs_real": frechet(torch.cat(feats).numpy(), real),
                    "token_tvd_vs_ar": marginal_tvd(tokens[name], tokens["none"], 1024) if name != "none" else 0.0})
    return out


def markdown(report: dict) -> str:
    gib = 2 ** 20
    lines = [f"# Weight-only quantization ({report['device']})", "",
             f"{report['machine']}; torch {report['torch']}, {report['threads']} threads; {report['date']}", "",
             "## Resident weight bytes", "",
             "| model | compute dtype | none (MiB) | int8 (MiB) | fp8 (MiB) | int8 / none | fp8 / none |",
             "|---|---|---|---|---|---|---|"]
    for r in report["bytes"]:
        lines.append(f"| {r['model']} | {r['dtype']} | {r['none'] / gib:,.1f} | {r['int8'] / gib:,.1f} | "
                     f"{r['fp8'] / gib:,.1f} | {r['int8'] / r['none']:.3f} | {r['fp8'] / r['none']:.3f} |")
    lines += ["", "Quantized: the blocks' attention and feed-forward linears (one scale per output row, held in the "
              "compute dtype). Kept: token and class embeddings, norms, the image head. The embedded model is tiny "
              "(dim 256), so its embeddings and head are a large share; a 7B's blocks are about 97 % of its bytes.", "",
              "## Teacher-forced fidelity", "",
              f"{report['crops']} real crops (8 photos, random crops and flips, seed {report['seed']}) encoded by the "
              "embedded VQ; every position's next-token law under the quantized model against the reference.", "",
              "| model | weights | against | cfg | positions | max abs log-prob error | mean abs log-prob error | "
              "top-1 agreement | mean KL (nats) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["fidelity"]:
        lines.append(f"| {r['model']} | {r['weights']} | {r['reference']} | {r['cfg_scale']:g} | {r['positions']} | "
                     f"{r['max_abs_logit_error']:.4f} | {r['mean_abs_logit_error']:.5f} | {r['top1_agreement']:.4f} | "
                     f"{r['mean_kl_nats']:.5f} |")
    s = report["sampling"]
    lines += ["", f"## Image quality (AR, cfg {s['cfg_scale']}, temperature {s['temperature']}, "
              f"{report['images']} images per row, class i mod 8, seed i)", "",
              "| weights | classifier acc. | Frechet (clf features) vs real | token-marginal TVD vs AR |",
              "|---|---|---|---|"]
    for r in report["quality"]:
        lines.append(f"| {r['weights']} | {r['classifier_accuracy']:.3f} | {r['frechet_vs_real']:.1f} | "
                     f"{r['token_tvd_vs_ar']:.3f} |")
    lines += ["", "`none (other seeds)` is the noise floor: two float32 AR sample sets differ this much by chance. "
              "A format whose columns sit inside it is not measurably worse at this sample size."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="weight-only quantization benchmark (embedded model, CPU)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--crops", type=int, default=64, help="real crops for the teacher-forced columns")
    parser.add_argument("--images", type=int, default=128, help="AR images per quality row")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--cfg", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=2024)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sampling = SamplingConfig(cfg_scale=args.cfg, temperature=1.0)
    report = {**machine_info(torch.device("cpu")), "model": EMBEDDED_NAME, "crops": args.crops, "seed": args.seed,
              "images": args.images, "sampling": asdict(sampling), "bytes": bytes_rows(),
              "fidelity": [asdict(r) for r in fidelity_rows(args.crops, args.cfg, args.seed)],
              "quality": quality_rows(args.images, args.batch, sampling)}
    write_report(args.out, "quantization_cpu", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
