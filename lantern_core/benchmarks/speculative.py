"""Speculative-decoding benchmark on the embedded model (`make bench`): for AR, EAGLE-2, the static tree,
LANTERN / LANTERN++ settings and the training-free Jacobi modes (SJD, coupled SJD, relaxed Jacobi with
LANTERN's relaxation or GSD's groups), the forward passes per image, mean accepted length, wall-clock
speed-up over AR, and quality next to AR: the embedded classifier's accuracy, a Frechet distance on its
features against real crops, and the per-position token-marginal TVD against AR. A second AR row with
other seeds gives the AR-vs-AR noise floor for every quality column.

Methods run side by side: images are processed in rounds, every method decodes the same round of
images (same seeds) before the next round starts, so machine noise spreads over all rows alike.
Batch 1 per image (latency, as in the papers). Timings are never asserted anywhere.

    python -m lantern_core.benchmarks.speculative --out bench/results            # 128 images per row
    python -m lantern_core.benchmarks.speculative --images 16 --out /tmp/b       # quick look
"""
from __future__ import annotations

import argparse
import logging
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from ..conditioning import Condition
from ..config import SamplingConfig
from ..decoding.trees.drafting import DynamicShape
from ..loading.embedded import EMBEDDED_NAME, load_classifier, load_embedded
from ..decoding.generate import GenerationResult, generate, synchronize
from ..decoding.jacobi.config import JacobiConfig
from ..decoding.jacobi.driver import jacobi_generate
from ..decoding.acceptance.neighbors import build_neighbors
from ..decoding.acceptance.relaxation import Grouping, Relaxation
from .ar import machine_info
from ..decoding.sampling import make_generators
from ..decoding.trees.config import SpeculativeConfig
from ..decoding.trees.driver import speculative_generate
from ..decoding.trees.specs import NAIVE_EXTEND_57
from ..decoding.trees.auto import measure_costs
from ..decoding.step_graphs import StepExecution
from .report_writer import Report, step_cells, step_fields

log = logging.getLogger("lantern_core.benchmarks.speculative")
CPU_DYNAMIC = DynamicShape(depth=3, top_k=4, nodes=8)  # EAGLE-2 at CPU size: its 58 nodes cost ~5 steps here
# Speed-up tables decode with captured graphs, not compiled ones: an Inductor compile per mode, batch and setting
# would outlast the GPU check; `ar.py` measures the compiled AR step, `decode_counts.py` its kernels.
BENCH_COMPILE = "graphs"


@dataclass(frozen=True)
class Method:
    name: str
    spec: SpeculativeConfig | JacobiConfig | None  # None = plain AR
    seed_offset: int = 0  # the AR noise-floor row draws other seeds

    def decode(self, model, drafter, cond: Condition, sampling: SamplingConfig, gens, neighbors) -> GenerationResult:
        if self.spec is None:
            return generate(model, cond, sampling, gens, compile=BENCH_COMPILE)
        if isinstance(self.spec, JacobiConfig):
            return jacobi_generate(model, cond, sampling, self.spec, gens, neighbors, compile=BENCH_COMPILE)
        return speculative_generate(model, drafter, cond, sampling, self.spec, gens, neighbors, compile=BENCH_COMPILE)


def tree_label(tree: str) -> str:
    """The short name of what a row decoded with: the static tree, or the Jacobi window."""
    if "jacobi w" in tree:
        label = "window " + tree.split("jacobi w")[1].split(" ")[0]
        if ", 2-D: " in tree:  # "2 rows x w16 offset -1": the lower rows' windows
            label += " + " + tree.split(", 2-D: ")[1].split(",")[0].split(" (")[0]
        if ", relaxed 2-D (lossy): " in tree:  # "6 rows x w6 lead 0": rows committing at their own fronts
            label += " + " + tree.split(", relaxed 2-D (lossy): ")[1].split(",")[0].split(" (")[0]
        return label
    return tree.split(" ")[0]


def methods(lantern_k: int = 1000, pp_k: int = 10) -> list[Method]:
    dyn = dict(tree="dynamic", dynamic=CPU_DYNAMIC)
    rows = [Method("ar", None), Method("ar (other seeds)", None, seed_offset=100_000),
            Method("eagle2", SpeculativeConfig(**dyn)),
            Method("eagle2 (residual rule)", SpeculativeConfig(**dyn, exact_rule="residual")),
            Method("static_tree (auto)", SpeculativeConfig(tree="auto", static_tree=NAIVE_EXTEND_57)),
            Method("static_tree naive_extend_57", SpeculativeConfig(static_tree=NAIVE_EXTEND_57)),
            Method("static_tree naive_extend_57 (residual rule)",
                   SpeculativeConfig(static_tree=NAIVE_EXTEND_57, exact_rule="residual"))]
    rows += [Method(f"lantern delta={d}", SpeculativeConfig(**dyn, relaxation=Relaxation(k=lantern_k, delta=d)))
             for d in (0.05, 0.1, 0.2, 0.4)]
    rows += [Method(f"lantern_pp lambda={lam:g}", SpeculativeConfig(tree="auto", static_tree=NAIVE_EXTEND_57,
                                                                    relaxation=Relaxation(k=pp_k, lam=lam)))
             for lam in (2.0, 5.0, 10.0)]
    coupled = dict(coupled=True, init="sample_left")
    rows += [Method("sjd", JacobiConfig("auto", init="sample_left")), Method("sjd_coupled", JacobiConfig("auto", **coupled)),
             Method("sjd_coupled 2-D (next row)", JacobiConfig("auto", **coupled, rows=2, row_window=16, row_offset=-1)),
             Method("sjd 2-D (next row)", JacobiConfig("auto", init="sample_left", rows=2, row_window=16, row_offset=-1)),
             Method("sjd continuation", JacobiConfig("auto", init="sample_left", continuation=True)),
             Method("sjd continuation 2-D (next row)", JacobiConfig("auto", init="sample_left", continuation=True,
                                                                    rows=2, row_window=16, row_offset=-1)),
             Method("sjd_coupled proactive 4", JacobiConfig("auto", **coupled, proactive=4)),
             Method("sjd_coupled proactive 4 2-D (next row)", JacobiConfig("auto", **coupled, proactive=4, rows=2,
                                                                         row_window=16, row_offset=-1)),
             Method("sjd continuation proactive 4 (SJD-PAC)", JacobiConfig("auto", init="sample_left",
                                                                          continuation=True, proactive=4)),
             Method("sjd_coupled random init", JacobiConfig("auto", coupled=True, init="random")),
             Method("sjd w8", JacobiConfig(8, init="sample_left")),
             Method("sjd w8 (residual rule)", JacobiConfig(8, init="sample_left", exact_rule="residual")),
             Method("sjd_coupled w8", JacobiConfig(8, **coupled)),
             Method("sjd_coupled w8 (residual rule)", JacobiConfig(8, **coupled, exact_rule="residual")),
             Method("sjd_coupled repeat_above", JacobiConfig("auto", coupled=True, init="repeat_above"))]
    pac = dict(init="sample_left", continuation=True)  # SJD-PAC's pieces, each under both exact rules
    for name, config in (("sjd continuation w8", JacobiConfig(8, **pac)),
                         ("sjd_coupled proactive 4 w8", JacobiConfig(8, **coupled, proactive=4)),
                         ("sjd continuation proactive 4 w8", JacobiConfig(8, **pac, proactive=4))):
        rows += [Method(name, config), Method(f"{name} (residual rule)", replace(config, exact_rule="residual"))]
    rows += [Method(f"sjd_relaxed lambda={lam:g} k={pp_k}", JacobiConfig("auto", **coupled, relaxation=Relaxation(k=pp_k, lam=lam)))
             for lam in (5.0, 10.0)]
    rows += [Method(f"sjd_relaxed delta={d} k={k}", JacobiConfig("auto", **coupled, relaxation=Relaxation(k=k, delta=d)))
             for d, k in ((0.1, 8), (0.2, 16), (0.1, lantern_k))]
    rows.append(Method("sjd_relaxed gsd k=64 gap=0.15", JacobiConfig("auto", **coupled, grouping=Grouping(k=64, gap=0.15))))
    relaxed_2d = dict(**coupled, rows=6, row_window=6, row_commit=True, row_lead=0)  # lossy: rows commit early
    rows += [Method("sjd_2d_relaxed", JacobiConfig("auto", **relaxed_2d)),
             Method("sjd_2d_relaxed row-causal", JacobiConfig("auto", **relaxed_2d, row_causal=True)),
             Method("sjd_2d_relaxed 4 rows lead 1", JacobiConfig("auto", **{**relaxed_2d, "rows": 4, "row_lead": 1})),
             Method(f"sjd_2d_relaxed lambda=5 k={pp_k}",
                    JacobiConfig("auto", **relaxed_2d, relaxation=Relaxation(k=pp_k, lam=5.0)))]
    return rows


@dataclass
class Tally:
    seconds: float = 0.0
    forwards: int = 0
    images: int = 0
    trees: set = field(default_factory=set)
    tokens: list = field(default_factory=list)
    labels: list = field(default_factory=list)
    pixels: list = field(default_factory=list)
    steps: StepExecution = StepExecution()  # how the timed runs' steps ran, all together


def frechet(a: np.ndarray, b: np.ndarray) -> float:
    """Frechet distance between Gaussians fitted to feature sets a, b (n, d); NaN for fewer than 2 samples in
    either (no covariance to fit: a one-image smoke run)."""
    import warnings

    from scipy import linalg

    if min(len(a), len(b)) < 2:
        return float("nan")
    mu1, mu2 = a.mean(0), b.mean(0)
    s1, s2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    with warnings.catch_warnings():  # few samples give singular covariances; the value is still defined
        warnings.simplefilter("ignore", linalg.LinAlgWarning)
        covmean = linalg.sqrtm(s1 @ s2)
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1 + s2 - 2 * covmean.real))


def marginal_tvd(tokens: torch.Tensor, reference: torch.Tensor, vocab: int) -> float:
    """Mean over positions of the TVD between the empirical token marginals of two (n, N) sample sets."""
    n, N = tokens.shape
    offsets = torch.arange(N) * vocab
    a = torch.bincount((tokens + offsets).flatten(), minlength=N * vocab).view(N, vocab).double() / n
    b = torch.bincount((reference + offsets).flatten(), minlength=N * vocab).view(N, vocab).double() / reference.shape[0]
    return float(0.5 * (a - b).abs().sum(-1).mean())


def real_crop_features(clf, count: int, seed: int) -> np.ndarray:
    from ..training.train_embedded import load_photos, random_crops

    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(8), -(-count // 8))[:count]
    device = next(clf.parameters()).device  # the crops are made on the CPU; the classifier may sit on a GPU
    with torch.no_grad():
        return clf.features(random_crops(load_photos(), labels, rng).to(device)).mean(dim=(2, 3)).cpu().numpy()


@torch.no_grad()
def run(images: int, round_size: int, sampling: SamplingConfig, device: torch.device, dtype: torch.dtype,
        only: tuple[str, ...] = (), report: Report | None = None) -> dict:
    """Decode `images` per method in interleaved rounds; `report` gets the timing columns after every round, then
    the quality columns and the cost curve. Returns the report's data."""
    report = report or Report(None, "speculative", markdown)
    pipe = load_embedded(device, dtype, drafter=True)
    model, drafter, vq = pipe.gpt.model, pipe.drafter.model, pipe.vq.model
    neighbors = build_neighbors(vq.quantize.embedding.weight, 1000)
    rows = [m for m in methods() if m.name.startswith("ar") or not only or m.name.startswith(only)]
    tallies = {m.name: Tally() for m in rows}
    for m in rows:  # warm-up (and `auto` calibration) outside the timed rounds
        m.decode(model, drafter, Condition.classes([0]), sampling, make_generators(999_999, 1, device), neighbors)
    for start in range(0, images, round_size):
        idx = list(range(start, min(images, start + round_size)))
        labels = [i % 8 for i in idx]
        for m in rows:
            t = tallies[m.name]
            for i, label in zip(idx, labels):
                cond = Condition.classes([label], device=device)
                gens = make_generators(i + m.seed_offset, 1, device)
                synchronize(device)
                t0 = time.perf_counter()
                result = m.decode(model, drafter, cond, sampling, gens, neighbors)
                t.forwards += result.stats.forward_passes
                t.steps = t.steps.merged(result.stats.steps)
                if m.spec is not None:
                    t.trees.add(tree_label(result.stats.tree))
                synchronize(device)
                t.seconds += time.perf_counter() - t0
                t.images += 1
                t.tokens.append(result.tokens.cpu())
                t.labels.append(label)
        log.info("round %d/%d done", start // round_size + 1, -(-images // round_size))
        report.update(rows=timing_rows(rows, tallies))
    report.update(**summarise(rows, tallies, vq, device, images, model.config.vocab_size))
    curve = measure_costs(model, drafter, rows=2 if sampling.uses_cfg else 1, reps=20)
    return report.update(cost_curve={"verify_ms": [(n, 1000 * s) for n, s in curve.verify_s],
                                     "draft_ms": 1000 * curve.draft_s})


def timing_rows(rows: list[Method], tallies: dict) -> list[dict]:
    """The columns known as soon as images are decoded (quality comes at the end), for the methods that have
    images so far."""
    ar = tallies["ar"]
    ar_s = ar.seconds / ar.images if ar.images else float("nan")
    out = []
    for m in rows:
        t = tallies[m.name]
        if not t.images:
            continue
        s_per_image = t.seconds / t.images
        out.append({"method": m.name, "tree": ", ".join(sorted(t.trees)) or "-", "images": t.images,
                    "forward_passes_per_image": t.forwards / t.images,
                    "mean_accepted_length": t.tokens[0].shape[1] * t.images / t.forwards,
                    "s_per_image": s_per_image, "speedup_vs_ar": ar_s / s_per_image, **step_fields(t.steps)})
    return out


def summarise(rows: list[Method], tallies: dict, vq, device, images: int, vocab: int) -> dict:
    clf = load_classifier(device)
    try:
        real = real_crop_features(clf, max(images, 64), seed=4242)
    except ImportError as error:  # a GPU box without scikit-image: keep every other column
        log.warning("no real photos for the Frechet column (%s)", error)
        real = None
    ar_tokens = torch.cat(tallies["ar"].tokens)
    out = timing_rows(rows, tallies)
    for row in out:
        t = tallies[row["method"]]
        tokens = torch.cat(t.tokens)
        labels = torch.tensor(t.labels)
        feats, preds = [], []
        with torch.no_grad():
            for chunk in tokens.split(32):
                pixels = vq.decode(chunk.to(device)).clamp(-1, 1).float()
                f = clf.features(pixels).mean(dim=(2, 3))
                feats.append(f.cpu())
                preds.append(clf.head(f).argmax(-1).cpu())
        feats = torch.cat(feats).numpy()
        row.update(classifier_accuracy=float((torch.cat(preds) == labels).float().mean()),
                   frechet_vs_real=frechet(feats, real) if real is not None else float("nan"),
                   token_tvd_vs_ar=marginal_tvd(tokens, ar_tokens, vocab) if row["method"] != "ar" else 0.0)
        log.info("%s", row)
    return {"rows": out}


def quality_cells(row: dict) -> str:
    """The three quality cells of a row, blank until the run's end computes them."""
    if "classifier_accuracy" not in row:
        return " |  | "
    return f"{row['classifier_accuracy']:.3f} | {row['frechet_vs_real']:.3f} | {row['token_tvd_vs_ar']:.3f}"


def file_tag(prefixes: list[str]) -> str:
    """A subset run's file-name part (`--only sjd` -> "_sjd"), in characters every file system keeps."""
    return "".join("_" + re.sub(r"[^A-Za-z0-9_.-]+", "-", prefix).strip("-") for prefix in prefixes)


def markdown(report: dict) -> str:
    s = report["sampling"]
    lines = [f"# Speculative decoding on the embedded model ({report['device']}, {report['dtype']})", "",
             f"{report['model']}; {report['machine']}; torch {report['torch']}, {report['threads']} threads; "
             f"cfg {s['cfg_scale']}, temperature {s['temperature']}, top-k {s['top_k']}, top-p {s['top_p']}; "
             f"{report['images']} images per row (class i mod 8, seed i), batch 1, rows interleaved per round; "
             f"{report['date']}", "",
             "| method | tree | forward passes / image | mean accepted length | s / image | speed-up vs AR | "
             "classifier acc. | Frechet (clf features) vs real | token-marginal TVD vs AR | graphs | compiled |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report.get("rows", []):
        lines.append(f"| {r['method']} | {r['tree']} | {r['forward_passes_per_image']:.1f} | "
                     f"{r['mean_accepted_length']:.2f} | {r['s_per_image']:.3f} | {r['speedup_vs_ar']:.2f}x | "
                     f"{quality_cells(r)} | {step_cells(r)} |")
    lines += ["", "The `ar (other seeds)` row is the noise floor: two AR sample sets differ this much by chance "
                  "alone. Exact modes (eagle2, static_tree, sjd, sjd_coupled, sjd continuation, the 2-D (next row) rows) "
                  "sample the AR distribution, so their quality columns should sit within that noise; the relaxed and "
                  "sjd_2d_relaxed rows are lossy and are measured against it. `graphs`: how the timed runs' steps "
                  "ran (all replayed from CUDA graphs; partial or none: a fallback to eager; off: nothing captured "
                  "on this device); `compiled`: off (the rows decode with compile graphs).", "",
              "## Forward-cost curve (what `auto` plans with)", ""]
    if "cost_curve" not in report:
        return "\n".join(lines + ["Not measured yet (the run stopped before it)."]) + "\n"
    lines += ["| tree tokens verified | ms per verification | vs 1 token |", "|---|---|---|"]
    base = report["cost_curve"]["verify_ms"][0][1]
    for n, ms in report["cost_curve"]["verify_ms"]:
        lines.append(f"| {n} | {ms:.2f} | {ms / base:.2f}x |")
    lines.append(f"\nOne drafter forward (a tree level, incl. its logits): {report['cost_curve']['draft_ms']:.2f} ms.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="speculative decoding benchmark (embedded model)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--round", type=int, default=8, help="images per interleaving round")
    parser.add_argument("--cfg", type=float, default=3.0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--only", nargs="*", default=[], help="method-name prefixes to run (the AR rows always run)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    sampling = SamplingConfig(cfg_scale=args.cfg, temperature=args.temperature)
    # a subset run keeps the full table's file apart
    report = Report(args.out, f"speculative{file_tag(args.only)}_{device.type}_{args.dtype}", markdown,
                    **machine_info(device), model=EMBEDDED_NAME, dtype=args.dtype, images=args.images,
                    sampling=asdict(sampling), rows=[])
    torch.set_flush_denormal(True)
    try:
        run(args.images, args.round, sampling, device, dtype, tuple(args.only), report)
    finally:
        torch.set_flush_denormal(False)
    return report.finish()


if __name__ == "__main__":
    main()
