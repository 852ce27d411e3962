"""Tokens per forward of every exact mode under its two exact rules, on tiny models whose laws can be enumerated:
the AR-identical rule (a draft is kept only where it is AR's own draw, the default) against the residual rule
(min(1, p/q) with a residual draw, `exact_rule="residual"`). The models are those of the whole-image exactness
tests (2x2 grids of 5 codes, a 3x3 grid of 3 codes; random targets with flat or peaked laws, drafters initialised
from them), so both rules are measured where their acceptance is easy to reason about and far from the embedded
model's textures. Many images per row, one batch each; nothing is timed and nothing asserted.

    python -m lantern_core.benchmarks.rule_acceptance --out bench/results
"""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..conditioning import Condition
from ..config import DrafterConfig, GPTConfig, SamplingConfig
from ..decoding.jacobi.config import JacobiConfig
from ..decoding.jacobi.driver import jacobi_generate
from ..decoding.sampling import make_generators
from ..decoding.trees.config import SpeculativeConfig
from ..decoding.trees.drafting import DynamicShape
from ..decoding.trees.driver import speculative_generate
from ..decoding.trees.specs import NAIVE_EXTEND_57, TreeSpec
from ..models.drafter import EagleDrafter
from ..models.gpt import LlamaGenGPT
from .ar import machine_info
from .report_writer import Report

log = logging.getLogger("lantern_core.benchmarks.rule_acceptance")


@dataclass(frozen=True)
class TinyWeights:
    """A tiny target (random weights; `output_std` small: flat laws, large: peaked) and a drafter made from it."""

    name: str
    grid: int
    vocab: int
    seed: int
    output_std: float

    def build(self) -> tuple[LlamaGenGPT, EagleDrafter]:
        config = GPTConfig(dim=32, n_layer=2, n_head=2, vocab_size=self.vocab, model_type="c2i", num_classes=4,
                           cls_token_num=1, grid_size=self.grid)
        model = LlamaGenGPT(config)
        generator = torch.Generator().manual_seed(self.seed)
        model.init_weights(generator, std=0.3)
        with torch.no_grad():
            model.output.weight.normal_(0.0, self.output_std, generator=generator)
        drafter = EagleDrafter(DrafterConfig.for_target(config, ffn_dim=48))
        drafter.init_from_target(model, torch.Generator().manual_seed(self.seed + 1), std=0.3)
        return model.eval(), drafter.eval()


WEIGHTS = (TinyWeights("2x2, 5 codes, flat", 2, 5, 0, 0.3), TinyWeights("2x2, 5 codes, flatter", 2, 5, 5, 0.08),
           TinyWeights("3x3, 3 codes", 3, 3, 7, 0.3))
COUPLED = dict(coupled=True, init="sample_left")
# a branching tree no wider than 3 codes, for the 3-code model (naive_extend_57 has 5 children under a node)
SMALL_TREE = TreeSpec("small_branching_6", ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))
MODES = {  # each runs under both exact rules; "static_tree" is naive_extend_57, or SMALL_TREE on 3 codes
    "static_tree": SpeculativeConfig(static_tree=NAIVE_EXTEND_57),
    "eagle2 d4 k3 n8": SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(4, 3, 8)),
    "sjd w3": JacobiConfig(3, init="sample_left"),
    "sjd_coupled w3": JacobiConfig(3, **COUPLED),
    "sjd continuation w3": JacobiConfig(3, init="sample_left", continuation=True),
    "sjd_coupled proactive 3 x depth 2 w3": JacobiConfig(3, **COUPLED, proactive=3, proactive_depth=2),
    "sjd continuation proactive 3 x depth 2 w3": JacobiConfig(3, init="sample_left", continuation=True, proactive=3,
                                                              proactive_depth=2),
}
RULES = ("same_as_ar", "residual")


@torch.no_grad()
def tokens_per_forward(model, drafter, spec, sampling: SamplingConfig, images: int, seed: int) -> float:
    """Image tokens per verification forward (the mean accepted length) over `images` images of class 2, one batch."""
    condition = Condition.classes([2] * images)
    generators = make_generators(seed, images)
    if isinstance(spec, JacobiConfig):
        result = jacobi_generate(model, condition, sampling, spec, generators)
    else:
        result = speculative_generate(model, drafter, condition, sampling, spec, generators)
    return result.stats.mean_accepted_length


def markdown(report: dict) -> str:
    lines = ["# Tokens per forward of the two exact rules on tiny enumerable models", "",
             f"{report['machine']}; {report['images']} images per cell (class 2, seeds {report['seed']} ..), "
             f"one batch; cfg {report['cfg']}, temperature 1; {report['date']}", "",
             "Mean accepted length (image tokens per verification forward). `AR-identical`: a draft is kept only "
             "where it is AR's own draw (the default; the images are AR's); `residual`: min(1, p/q) with a residual "
             "draw (AR's law, another image). Both are exact; the ratio says what the default costs or gains.", "",
             "| model | mode | AR-identical | residual | AR-identical / residual |", "|---|---|---|---|---|"]
    for r in report.get("rows", []):
        lines.append(f"| {r['weights']} | {r['mode']} | {r['same_as_ar']:.3f} | {r['residual']:.3f} | "
                     f"{r['same_as_ar'] / r['residual']:.3f} |")
    lines += ["", "On models this small a tree or window covers most of an image, so the numbers sit near the image "
              "length when drafts agree; the embedded model's rows (`speculative_*`) are the ones users see."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="tokens per forward of the two exact rules on tiny models")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--cfg", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=123)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    sampling = SamplingConfig(cfg_scale=args.cfg, temperature=1.0)
    info = machine_info(torch.device("cpu"))
    report = Report(args.out, "rule_acceptance_cpu", markdown, images=args.images, cfg=args.cfg, seed=args.seed, **info)
    report.update(machine=f"{info['machine']}; torch {info['torch']}")
    for weights in WEIGHTS:
        model, drafter = weights.build()
        for name, spec in MODES.items():
            if name == "static_tree" and weights.vocab < 5:
                spec, name = replace(spec, static_tree=SMALL_TREE), f"static_tree {SMALL_TREE.name}"
            elif name == "static_tree":
                name = "static_tree naive_extend_57"
            row = {"weights": weights.name, "mode": name}
            for rule in RULES:
                row[rule] = tokens_per_forward(model, drafter, replace(spec, exact_rule=rule), sampling, args.images,
                                               args.seed)
            report.add("rows", row)
            log.info("%s", row)
    return report.finish()


if __name__ == "__main__":
    main()
