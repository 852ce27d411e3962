"""What feeding a drafter LANTERN's HF-port caption states costs (`make bench`, `make bench-cuda`): a random
LlamaGen-T2I-shaped target of the given size with left-padded 120-token captions, the same random drafter
run as "native" and as "hf_port" (`decoding/trees/prefix_states.py`), interleaved, median wall time and prefill
time of whole speculative runs (on 2 CPU cores `make bench` uses an 8 x 8 grid to stay short). The hf_port run adds one cache-free forward over the caption at the
prefill; everything after it is the same work. Random weights accept at random, so only the time is
compared here (acceptance: tests/core/test_prefix_states.py). Timings are never asserted.

    python -m lantern_core.benchmarks.prefix_states --device cuda --dtype bfloat16
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from ..conditioning import Condition
from ..config import DrafterConfig, GPTConfig, SamplingConfig, gpt_preset
from ..decoding.generate import synchronize
from ..decoding.sampling import make_generators
from ..decoding.trees.config import SpeculativeConfig
from ..decoding.trees.driver import speculative_generate
from .speculative import BENCH_COMPILE
from ..decoding.trees.specs import chain_tree
from ..models.drafter import EagleDrafter
from .ar import machine_info, random_model
from .report_writer import Report, merged_steps, step_cells, step_fields

log = logging.getLogger("lantern_core.benchmarks.prefix_states")
CAPTION_TOKENS = 120  # LlamaGen-T2I's caption length
REAL_TOKENS = 20  # a typical COCO caption in T5 tokens; the rest is left padding
TINY = dict(dim=64, n_layer=2, n_head=4)  # `--model tiny`: GPT-B's t2i layout, narrow and shallow (smoke runs)


def measure(model, drafter, condition: Condition, repeats: int,
            progress: Callable[[dict], None] = lambda medians: None) -> dict:
    """Interleaved native / hf_port runs; medians of wall and prefill seconds per convention, with how the timed
    runs' steps ran (`step_fields`), also handed to `progress` after every timed round."""
    device = model.tok_embeddings.weight.device
    sampling = SamplingConfig(cfg_scale=4.0, temperature=1.0, top_k=1000)
    spec = SpeculativeConfig(static_tree=chain_tree(4))
    drafters = {states: drafter if states == "native" else _with_states(drafter, states)
                for states in ("native", "hf_port")}
    times = {states: {"wall_s": [], "prefill_s": []} for states in drafters}
    steps = {states: [] for states in drafters}
    for repeat in range(repeats + 1):  # the first round warms up
        for states, d in drafters.items():
            synchronize(device)
            start = time.perf_counter()
            result = speculative_generate(model, d, condition, sampling, spec, make_generators(repeat, condition.batch, device),
                                          compile=BENCH_COMPILE)
            synchronize(device)
            if repeat:
                times[states]["wall_s"].append(time.perf_counter() - start)
                times[states]["prefill_s"].append(result.stats.prefill_time_s)
                steps[states].append(result.stats.steps)
        if repeat:
            progress(_medians(times, steps))
    return _medians(times, steps)


def _medians(times: dict, steps: dict) -> dict:
    return {states: {**{k: statistics.median(v) for k, v in t.items()}, **step_fields(merged_steps(steps[states]))}
            for states, t in times.items()}


def _with_states(drafter: EagleDrafter, states: str) -> EagleDrafter:
    copy = EagleDrafter(replace(drafter.config, prefix_states=states)).to(drafter.fc.weight.device, drafter.fc.weight.dtype)
    copy.load_state_dict(drafter.state_dict())
    return copy.eval()


def run(config: GPTConfig, label: str, device: torch.device, dtype: torch.dtype, repeats: int,
        real_tokens: int = REAL_TOKENS, report: Report | None = None) -> dict:
    """Time the two conventions on a random t2i target of `config` (its caption left-padded to
    `real_tokens` real tokens); `report` is rewritten after every timed round. Returns its data."""
    report = report or Report(None, "prefix_states", markdown)
    report.update(**machine_info(device), dtype=str(dtype).replace("torch.", ""), model=label, grid=config.grid_size,
                  caption_tokens=config.cls_token_num, real_caption_tokens=real_tokens, repeats=repeats,
                  tree="chain_4", cfg_scale=4.0)
    model = random_model(config, device, dtype)
    drafter = EagleDrafter(DrafterConfig.for_target(config)).to(device)
    drafter.init_from_target(model, torch.Generator(device=device).manual_seed(1))
    drafter = drafter.to(dtype).eval()
    T = config.cls_token_num
    caption = torch.randn(1, T, config.caption_dim, generator=torch.Generator().manual_seed(2))
    mask = torch.arange(T)[None] >= T - real_tokens
    condition = Condition(caption=caption.to(device), caption_mask=mask.to(device))
    with torch.no_grad():
        measure(model, drafter, condition, repeats, lambda medians: report.update(**compared(medians)))
    return report.data


def compared(medians: dict) -> dict:
    """The report's figures from the two conventions' medians."""
    native, port = medians["native"], medians["hf_port"]
    return {"medians": medians, "extra_prefill_ms": round(1000 * (port["prefill_s"] - native["prefill_s"]), 2),
            "wall_ratio": round(port["wall_s"] / native["wall_s"], 4)}


def markdown(report: dict) -> str:
    if "medians" not in report:
        return f"# Drafter prefix states ({report['device']}, {report['dtype']})\n\nNo timed round finished yet.\n"
    rows = "\n".join(f"| {states} | {1000 * m['wall_s']:.0f} | {1000 * m['prefill_s']:.1f} | {step_cells(m)} |"
                     for states, m in report["medians"].items())
    return f"""# Drafter prefix states: cost of the HF-port caption states ({report['device']}, {report['dtype']})

{report['machine']}; torch {report['torch']}, {report['threads']} threads; {report['date']}.
Random {report['model']}-shaped t2i target, {report['grid']}x{report['grid']} grid, a {report['caption_tokens']}-token
caption with {report['real_caption_tokens']} real tokens (left-padded), cfg {report['cfg_scale']}, tree {report['tree']},
batch 1; the same random drafter as "native" and as "hf_port", interleaved, medians of {report['repeats']} runs each.

| drafter prefix states | ms per image (whole run) | ms prefill | graphs | compiled |
|---|---|---|---|---|
{rows}

hf_port adds {report['extra_prefill_ms']:.1f} ms at the prefill (one forward over the caption); whole run
hf_port / native = {report['wall_ratio']:.3f}.
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lantern_core.benchmarks.prefix_states", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="GPT-B", help="LlamaGen preset shape of the random target, or tiny")
    p.add_argument("--grid", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    preset, narrow = ("GPT-B", TINY) if args.model == "tiny" else (args.model, {})
    config = gpt_preset(preset, "t2i", image_size=16 * args.grid, **narrow)  # 120 caption slots
    report = Report(args.out, f"prefix_states_{device.type}_{args.dtype}", markdown)
    run(config, args.model, device, dtype, args.repeats, report=report)
    log.info("\n%s", markdown(report.finish()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
