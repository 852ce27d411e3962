"""Kernels and host reads per AR step and per iteration of every decoding mode (`make bench`, `make bench-cuda`):
the hardware-neutral figures that decide batch-1 speed on a GPU, counted on whatever device runs this.

Each decode runs the path a capturing device replays (`step_graphs.gpu_path`: windowed attention, fixed-trip
loops, no early exits), eagerly, under `kernel_count.StepCounter`; a few iterations are recorded and the decode
stops. Per step or iteration: kernels in all and by part (target layers, head, sampling; drafter levels,
verification forward, distributions, walk / judge, bookkeeping), host reads inside the step (must be 0), host
reads per iteration of the whole loop (the decoder's own bookkeeping included), random-number kernels inside
the step and factory calls that named no device. AR steps are counted on the published depths (embedded,
GPT-B, GPT-XL, a 7B shape) with narrow layers (64 wide, 4 heads): a kernel count depends on the code path, not
on the width (the tests check it). The CPU's own eager path (exact windows, no mask) is counted too, for
comparison. Kernel counts never change with the machine; timings are elsewhere (`iteration_cost.py`).

    python -m lantern_core.benchmarks.decode_counts --out bench/results [--dtype bfloat16] [--device cuda]
    python -m lantern_core.benchmarks.decode_counts --no-inductor --shapes --only "static_tree" "sjd w16"  # a subset
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from ..conditioning import Condition
from ..config import GPTConfig, SamplingConfig, gpt_preset
from ..decoding import ar_step as ar_step_module
from ..decoding import generate as generate_module
from ..decoding import step_graphs
from ..decoding.acceptance.neighbors import build_neighbors
from ..decoding.acceptance.relaxation import Grouping, Relaxation
from ..decoding.generate import generate
from ..decoding.jacobi import batch as jacobi_batch
from ..decoding.jacobi import iteration as jacobi_step
from ..decoding.jacobi.config import JacobiConfig
from ..decoding.jacobi.driver import jacobi_generate
from ..decoding.sampling import NodeDistributions, make_generators
from ..decoding.step_graphs import gpu_path
from ..decoding.trees import batch as tree_batch
from ..decoding.trees import iteration as tree_step
from ..decoding.trees.config import SpeculativeConfig
from ..decoding.trees.drafting import DrafterSession, DynamicShape
from ..decoding.trees.driver import speculative_generate
from ..decoding.trees.specs import NAIVE_EXTEND_57
from .ar import SEVEN_B, machine_info, random_model
from .families import family_config, random_prompted
from .kernel_count import OpCount, StepCounter, difference, module_part, replaced, tagged
from .report_writer import Report

log = logging.getLogger("lantern_core.benchmarks.decode_counts")
NARROW = dict(dim=64, n_head=4, n_kv_head=None, ffn_dim=None)
SHAPES = [("GPT-B c2i 256px", gpt_preset("GPT-B", "c2i", 256)), ("GPT-XL c2i 384px", gpt_preset("GPT-XL", "c2i", 384)),
          ("7B shape c2i 384px", SEVEN_B)]
RECORDED = 4  # iterations recorded per decode (every one runs the same fixed-trip code)
# the prompted layouts with forced end-of-row tokens, narrow (a kernel count does not depend on the width): Emu3's
# (GQA, no QK-norm, 8-pixel codes) and Lumina-mGPT 2.0's (QK-norm) at their published depths, 16 x 16 codes
PROMPTED_LAYOUTS = [("Emu3-Gen layout (32 layers, narrow)", replace(family_config("emu3", "8b", grid=16), dim=64,
                                                                    n_head=4, n_kv_head=1, ffn_dim=96,
                                                                    text_vocab_size=1024, vocab_size=513)),
                    ("Lumina-mGPT 2.0 layout (32 layers, narrow)", replace(family_config("lumina2", "7b", grid=16),
                                                                           dim=64, n_head=4, n_kv_head=4, ffn_dim=96,
                                                                           text_vocab_size=1024, vocab_size=513))]
LAYOUT_JACOBI = [("sjd_coupled w16", JacobiConfig(16, coupled=True, init="sample_left")),
                 ("lossless 2-D w15 + next row w16",
                  JacobiConfig(15, coupled=True, init="sample_left", rows=2, row_window=16, row_offset=-1))]


@dataclass
class StepCount:
    """One AR step or one iteration of a mode: kernels (the most any recorded call launched), their split, and
    the host traffic. `per_layer` is set for AR steps."""

    what: str
    path: str
    kernels: int
    parts: dict = field(default_factory=dict)
    kinds: dict = field(default_factory=dict)
    layers: int = 0
    per_layer: float | None = None
    host_reads_in_step: int = 0
    host_reads_per_iteration: float = 0.0
    rng_kernels: int = 0
    rng_per_iteration: float = 0.0  # generator calls the loop makes per iteration (noise drawn up front: none)
    stray_factories: dict = field(default_factory=dict)
    reads: dict = field(default_factory=dict)  # which host reads the loop made, per iteration

    @property
    def beyond_forward(self) -> int:
        """Kernels besides the target's verification forward (trunk and head)."""
        return self.kernels - self.parts.get("verification forward", 0)


class _Enough(Exception):
    """Raised from the step callback once enough iterations were recorded."""


def record_decode(run: Callable[[Callable], None], owner, attribute: str, counter: StepCounter,
                  gpu: bool = True) -> list[tuple]:
    """Run `run(on_step)` and record its iterations (`owner.attribute` is the per-iteration function the decoder
    calls by name), on the GPU's code path (`gpu`) or on this device's own. Returns (snapshot at the iteration's
    start, its own count) per iteration."""
    original = getattr(owner, attribute)
    calls: list[tuple] = []

    def iteration(*args, **kwargs):
        start = counter.snapshot()
        out = original(*args, **kwargs)
        calls.append((start, difference(counter.snapshot(), start)))
        return out

    def on_step(*_) -> None:
        if len(calls) > RECORDED:
            raise _Enough

    path = gpu_path() if gpu else contextlib.nullcontext()
    with replaced(owner, attribute, iteration), path, counter.recording():
        try:
            run(on_step)
        except _Enough:
            pass
    if len(calls) < 3:
        raise RuntimeError(f"{attribute}: only {len(calls)} iterations ran; need 3 to count the loop")
    return calls


def summarise(what: str, path: str, calls: list[tuple], layers: int = 0) -> StepCount:
    """Per-iteration figures from `record_decode`'s calls: the largest iteration, and the loop's host reads per
    iteration between the second iteration's start and the last one's."""
    steps = [count for _, count in calls]
    largest: OpCount = max(steps, key=lambda c: c.kernels)
    loop = difference(calls[-1][0], calls[1][0])
    spans = len(calls) - 2
    stray = {}
    for count in steps:
        stray.update(count.stray_factories)
    parts = dict(sorted(largest.by_part.items(), key=lambda kv: -kv[1]))
    per_layer = round(parts.get("target layers", 0) / layers, 2) if layers else None
    return StepCount(what, path, largest.kernels, parts, dict(largest.by_kind), layers, per_layer,
                     max(c.syncs for c in steps), round(loop.syncs / spans, 2), largest.by_kind.get("rng", 0),
                     round(loop.by_kind.get("rng", 0) / spans, 2), stray,
                     {k: round(v / spans, 2) for k, v in {**loop.host_reads, "uploads": loop.uploads}.items() if v})


def condition_for(model, device: torch.device) -> Condition:
    """Class 0 for a class-conditional model; for a prompted one a 16-token prompt and a 12-token unconditional
    row (left-padded to one length, as a real prompt and negative prompt are)."""
    if model.config.model_type != "prompt":
        return Condition.classes([0], device=device)
    ids, u_ids = torch.ones(1, 16, dtype=torch.long, device=device), torch.ones(1, 12, dtype=torch.long, device=device)
    return Condition(prompt_ids=ids, prompt_mask=ids.bool(), uncond_ids=u_ids, uncond_mask=u_ids.bool())


def head_of(model) -> list[torch.nn.Module]:
    """The modules that turn hidden states into image logits: LlamaGen's `output`, a prompted model's head
    (Chameleon-style `image.head`; Janus' `image.head_proj` and `image.head_out`)."""
    if hasattr(model, "output"):
        return [model.output]
    image = model.image
    return [image.head] if hasattr(image, "head") else [image.head_proj, image.head_out]


def count_ar(model, sampling: SamplingConfig, what: str, device: torch.device, eager_cpu: bool = False) -> StepCount:
    """Kernels of an AR step of `model` (batch 1): the captured path, or (`eager_cpu`) the CPU's exact-window one."""
    counter = StepCounter(untagged="bookkeeping")
    cond = condition_for(model, device)

    def run(on_step) -> None:
        generate(model, cond, sampling, make_generators(0, 1, device), on_step, compile="off")

    parts = [(ar_step_module, "sample_step_tokens", "sampling")]
    with module_part(counter, model.layers, "target layers"), module_part(counter, head_of(model), "head"), \
            tagged(counter, parts):
        calls = record_decode(run, generate_module, "ar_step", counter, gpu=not eager_cpu)
    return summarise(what, "cpu eager (exact window)" if eager_cpu else "captured path", calls, len(model.layers))


def tree_modes(k: int) -> list[tuple[str, SpeculativeConfig, bool]]:
    static = dict(tree="static", static_tree=NAIVE_EXTEND_57)
    dynamic = dict(tree="dynamic", dynamic=DynamicShape(5, 10, 58))
    rows = []
    for greedy in (False, True):
        tag = " greedy" if greedy else ""
        rows += [(f"static_tree naive_extend_57{tag}", SpeculativeConfig(**static), greedy),
                 (f"lantern_pp lambda 5 (naive_extend_57){tag}", SpeculativeConfig(**static, relaxation=Relaxation(k=k, lam=5.0)), greedy),
                 (f"eagle2 d5 k10 n58{tag}", SpeculativeConfig(**dynamic), greedy),
                 (f"lantern delta 0.1 (eagle2 d5 k10 n58){tag}",
                  SpeculativeConfig(**dynamic, relaxation=Relaxation(k=k, delta=0.1)), greedy)]
    rows += [("static_tree naive_extend_57 residual rule", SpeculativeConfig(**static, exact_rule="residual"), False),
             ("eagle2 d5 k10 n58 residual rule", SpeculativeConfig(**dynamic, exact_rule="residual"), False)]
    return rows


def jacobi_modes(k: int) -> list[tuple[str, JacobiConfig, bool]]:
    coupled = dict(coupled=True, init="sample_left")
    return [("sjd w16", JacobiConfig(16, init="sample_left"), False),
            ("sjd_coupled w16", JacobiConfig(16, **coupled), False),
            ("sjd_relaxed lambda 5 w16", JacobiConfig(16, **coupled, relaxation=Relaxation(k=k, lam=5.0)), False),
            ("sjd_relaxed gsd w16", JacobiConfig(16, **coupled, grouping=Grouping(k=k, gap=0.15)), False),
            ("sjd w16 greedy", JacobiConfig(16, init="sample_left"), True),
            ("sjd continuation w16", JacobiConfig(16, init="sample_left", continuation=True), False),
            ("sjd_coupled 2-D w15 + next row w16", JacobiConfig(15, **coupled, rows=2, row_window=16, row_offset=-1),
             False),
            ("sjd_coupled proactive 4 x depth 3 w16", JacobiConfig(16, **coupled, proactive=4, proactive_depth=3),
             False),
            ("sjd continuation proactive 4 x depth 3 w16",
             JacobiConfig(16, init="sample_left", continuation=True, proactive=4, proactive_depth=3), False),
            ("sjd_coupled relaxed 2-D w8, 6 rows x w6 (lossy)",
             JacobiConfig(8, **coupled, rows=6, row_window=6, row_commit=True, row_lead=0), False)]


def count_tree(model, drafter, spec: SpeculativeConfig, sampling: SamplingConfig, neighbors, what: str,
               device: torch.device) -> StepCount:
    counter = StepCounter(untagged="bookkeeping")
    cond = Condition.classes([1], device=device)
    parts = [(tree_step, "draft_static", "drafter levels"), (tree_step, "draft_dynamic", "drafter levels"),
             (DrafterSession, "consume", "drafter consume"), (tree_step, "forward_tree", "verification forward"),
             (NodeDistributions, "__call__", "distributions"), (NodeDistributions, "combine", "distributions"),
             (tree_step, "walk_tree", "walk"), (tree_step, "walk_longest_path", "walk"),
             (tree_step, "walk_same_as_ar", "walk"), (tree_step, "race", "target draws")]

    def run(on_step) -> None:
        speculative_generate(model, drafter, cond, sampling, spec, make_generators(0, 1, device), neighbors, on_step,
                             compile="off")

    with module_part(counter, [model.output], "verification forward"), tagged(counter, parts):
        calls = record_decode(run, tree_batch, "tree_iteration", counter)
    return summarise(what, "captured path", calls)


def count_jacobi(model, config: JacobiConfig, sampling: SamplingConfig, neighbors, what: str,
                 device: torch.device) -> StepCount:
    counter = StepCounter(untagged="bookkeeping")
    cond = Condition.classes([1], device=device) if model.config.model_type != "prompt" else condition_for(model, device)
    parts = [(jacobi_step, "refill", "drafts (refill)"), (jacobi_step, "forward_window", "verification forward"),
             (jacobi_step, "forward_at_slots", "verification forward"),
             (jacobi_step.JacobiContext, "target", "distributions"), (jacobi_step, "judge_run", "judge"),
             (jacobi_step.JacobiContext, "filtered", "distributions"), (jacobi_step, "judge_same_as_ar", "judge"),
             (jacobi_step, "row_lanes", "row fronts"), (jacobi_step, "raster_mask", "row fronts"),
             (jacobi_step, "judge_with_leaves", "judge"), (jacobi_step, "judge_leaves_same_as_ar", "judge"),
             (jacobi_step, "move_leaf_key", "leaf key"),
             (jacobi_step, "draw_leaves", "drafts (refill)")]

    def run(on_step) -> None:
        jacobi_generate(model, cond, sampling, config, make_generators(0, 1, device), neighbors, on_step, compile="off")

    with tagged(counter, parts):
        calls = record_decode(run, jacobi_batch, "jacobi_iteration", counter)
    return summarise(what, "captured path", calls)


def narrow(config: GPTConfig) -> GPTConfig:
    return replace(config, **NARROW)


KERNEL_CALL = re.compile(r"^\s*(cpp_fused_\w+|triton_\w+\.run|extern_kernels\.\w+|torch\.ops\.\w+\.\w+(\.\w+)?|"
                         r"aten\.\w+(\.\w+)?)\(")


def inductor_kernels(code: str) -> int:
    """Kernel launches in Inductor's generated `call` function: its fused kernels (C++ on the CPU, Triton on CUDA)
    and the library calls it keeps (GEMMs, attention)."""
    body = code[code.index("def call("):]
    return sum(1 for line in body.splitlines() if KERNEL_CALL.match(line))


def count_inductor_ar(config: GPTConfig, sampling: SamplingConfig, device: torch.device, dtype: torch.dtype) -> StepCount:
    """An AR step compiled by Inductor (`fullgraph=True, dynamic=False`, the captured path's masked window): kernels
    at 2 and 4 layers of `config`'s width, so per layer = half the difference."""
    from torch._inductor.utils import run_and_get_code

    from ..decoding.ar_step import ARBuffers, ARShape, ar_step

    counts = {}
    for layers in (2, 4):
        model = random_model(replace(config, n_layer=layers), device, dtype)
        shape = ARShape(1, 128, config.num_image_tokens, sampling)
        buffers = ARBuffers.allocate(model, shape)
        buffers.index.fill_(3)
        step = torch.compile(lambda: ar_step(model, shape, buffers, 64, True), backend="inductor", fullgraph=True,
                             dynamic=False)
        _, codes = run_and_get_code(step)
        counts[layers] = sum(inductor_kernels(code) for code in codes)
        torch._dynamo.reset()
    per_layer = (counts[4] - counts[2]) / 2
    total = counts[2] + (config.n_layer - 2) * per_layer
    return StepCount(f"{config.n_layer}-layer trunk, Inductor", "torch.compile (inductor) of the captured path",
                     int(total), {"target layers": int(per_layer * config.n_layer)}, {}, config.n_layer, per_layer)


def count_inductor_tree(model, drafter, spec: SpeculativeConfig, sampling: SamplingConfig, neighbors, what: str,
                        device: torch.device, dtype: torch.dtype) -> StepCount:
    """A whole tree iteration compiled by Inductor, as compile "auto" runs it on CUDA (one `fullgraph` region:
    drafter levels, verification forward, walk, commit), forced here on this device: kernel launches of the
    generated code with 2- and 4-layer random targets of `model`'s width (the drafter reads only the width), so
    the target's layers are `model`'s depth x half the difference and the rest is what the iteration launches
    beyond them (the verification forward's embedding, norm and head included)."""
    from torch._inductor.utils import run_and_get_code

    cond = Condition.classes([1], device=device)
    counts = {}
    for layers in (2, 4):
        target = random_model(replace(model.config, n_layer=layers), device, dtype)

        reports = []

        def stop(*_) -> None:  # the first report comes before the loop, the second after an iteration
            reports.append(1)
            if len(reports) > 1:
                raise _Enough

        def decode() -> None:
            try:
                speculative_generate(target, drafter, cond, sampling, spec, make_generators(0, 1, device), neighbors,
                                     stop, compile="auto")
            except _Enough:
                pass

        with replaced(step_graphs, "uses_graphs", lambda choice, _device: choice in ("auto", "graphs")), \
                replaced(step_graphs, "uses_inductor", lambda choice, _device: choice == "auto"), \
                _quiet("lantern_core.step_graphs"):
            _, codes = run_and_get_code(decode)
        counts[layers] = sum(inductor_kernels(code) for code in codes if "def call(" in code)
        step_graphs.release(target)
        torch._dynamo.reset()
        if not counts[layers]:
            raise RuntimeError("Inductor generated no code for the iteration (it fell back to eager)")
    per_layer = (counts[4] - counts[2]) / 2
    layers = model.config.n_layer
    total = int(counts[2] + (layers - 2) * per_layer)
    return StepCount(what, "torch.compile (inductor) of the whole iteration", total,
                     {"verification forward": int(per_layer * layers), "the rest": total - int(per_layer * layers)},
                     {}, layers, per_layer)


@contextlib.contextmanager
def _quiet(logger: str):
    """The expected warnings of a forced CUDA layout on a device that cannot capture, kept out of the report."""
    target = logging.getLogger(logger)
    level = target.level
    target.setLevel(logging.ERROR)
    try:
        yield
    finally:
        target.setLevel(level)


def chosen(name: str, only: tuple[str, ...]) -> bool:
    """Whether a row named `name` runs under `--only` (name prefixes; every row when empty)."""
    return not only or name.startswith(only)


@torch.no_grad()
def run(report: Report, device: torch.device, dtype: torch.dtype, k: int = 10, inductor: bool = True,
        only: tuple[str, ...] = (), shapes: tuple[str, ...] | None = None) -> dict:
    """Count every row into `report` (written after each): the AR steps (the embedded model, then the published
    shapes whose labels start with one of `shapes`, all when None), then the modes named by `only` (prefixes;
    all when empty; the two AR rows always)."""
    from ..loading.embedded import load_embedded

    sampling = SamplingConfig(cfg_scale=4.0, temperature=1.0)
    greedy = replace(sampling, temperature=0.0)
    report.update(sampling=asdict(sampling), lantern_k=k, ar_steps=[], modes=[])
    pipe = load_embedded(device, dtype, drafter=True)
    model, drafter = pipe.gpt.model, pipe.drafter.model
    neighbors = build_neighbors(pipe.vq.model.quantize.embedding.weight, k).to(device)
    add_ar = lambda row: report.add("ar_steps", _row(row))  # noqa: E731
    add_mode = lambda row: report.add("modes", _row(row))  # noqa: E731
    add_ar(count_ar(model, sampling, "embedded", device))
    if device.type == "cpu":
        add_ar(count_ar(model, sampling, "embedded", device, eager_cpu=True))
    published = [(label, config) for label, config in SHAPES if shapes is None or label.startswith(tuple(shapes))]
    for label, config in published:
        shape_model = random_model(narrow(config), device, dtype)
        add_ar(count_ar(shape_model, sampling, f"{label} ({config.n_layer} layers, narrow)", device))
        del shape_model
    if inductor:
        for label, config in [shape for shape in SHAPES[:2] if shape in published]:
            what = f"{label} ({config.n_layer} layers, narrow)"
            add_ar(_counted(what, lambda: replace(count_inductor_ar(narrow(config), sampling, device, dtype),
                                                  what=what)))
    add_mode(count_ar(model, sampling, "ar", device))
    add_mode(count_ar(model, greedy, "ar greedy", device))
    for name, spec, is_greedy in tree_modes(k):
        if chosen(name, only):
            add_mode(_counted(name, lambda: count_tree(model, drafter, spec, greedy if is_greedy else sampling,
                                                       neighbors, name, device)))
    for name, config, is_greedy in jacobi_modes(k):
        if chosen(name, only):
            add_mode(_counted(name, lambda: count_jacobi(model, config, greedy if is_greedy else sampling, neighbors,
                                                         name, device)))
    report.update(layouts=[])
    for label, config in PROMPTED_LAYOUTS:  # forced end-of-row tokens, GQA / QK-norm, prompt prefixes
        if not chosen(label, only):
            continue
        layout_model = random_prompted(config, device, dtype)  # narrow: the next one replaces it
        report.add("layouts", _row(_counted(f"{label} ar", lambda: count_ar(layout_model, sampling, f"{label} ar",
                                                                           device))))
        for name, jacobi in LAYOUT_JACOBI:
            what = f"{label} {name}"
            report.add("layouts", _row(_counted(what, lambda: count_jacobi(layout_model, jacobi, sampling, None, what,
                                                                           device))))
    if inductor:  # the goals' rows (a sampled and a greedy 57-node static tree), whole iterations fused
        for name, spec, is_greedy in tree_modes(k)[::4][:2]:
            if chosen(name, only):
                add_mode(_counted(name, lambda: count_inductor_tree(model, drafter, spec,
                                                                    greedy if is_greedy else sampling, neighbors,
                                                                    name, device, dtype)))
    return report.data


def _row(row: StepCount) -> dict:
    return asdict(row) | {"beyond_forward": row.beyond_forward}


def _counted(what: str, count: Callable[[], StepCount]) -> StepCount:
    """`count()`, or a row that says why it failed: one mode (or a compiler problem) must not lose the others."""
    try:
        return count()
    except Exception as error:
        log.exception("%s failed", what)
        return StepCount(what, f"failed: {type(error).__name__}: {error}"[:200], -1)


def _parts(parts: dict) -> str:
    return ", ".join(f"{name} {count}" for name, count in parts.items())


def markdown(report: dict) -> str:
    lines = [f"# Kernels and host reads per step ({report['device']}, {report['dtype']})", "",
             f"{report['machine']}; torch {report['torch']}; {report['date']}. Counted ATen kernels (views and metadata "
             "excluded; `rms_norm` as the one fused kernel it is on CUDA), batch 1, cfg 4, the code path CUDA graphs "
             "replay, run eagerly.", "",
             "## AR step", "", "| model | path | layers | kernels / step | per layer | outside the layers | split |",
             "|---|---|---|---|---|---|---|"]
    for r in report["ar_steps"]:
        if r["kernels"] < 0:
            lines.append(f"| {r['what']} | {r['path']} | | | | | |")
            continue
        outside = r["kernels"] - r["parts"].get("target layers", 0)
        lines.append(f"| {r['what']} | {r['path']} | {r['layers']} | {r['kernels']} | {r['per_layer']} | {outside} | "
                     f"{_parts(r['parts'])} |")
    lines += ["", "## One iteration of every mode (embedded model and drafter)", "",
              "| mode | kernels / iteration | beyond the verification forward | split | host reads inside | "
              "host reads / iteration (loop) | rng kernels inside | generator calls / iteration (loop) | "
              "factories without a device |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in report["modes"]:
        if r["kernels"] < 0:
            lines.append(f"| {r['what']} | {r['path']} | | | | | | | |")
            continue
        if r["path"].startswith("torch.compile"):  # kernel launches only: host reads are the eager row's
            lines.append(f"| {r['what']}, Inductor (whole iteration) | {r['kernels']} | {r['beyond_forward']} | "
                         f"{_parts(r['parts'])} | | | | | |")
            continue
        stray = ", ".join(f"{k} x{v}" for k, v in r["stray_factories"].items()) or "none"
        lines.append(f"| {r['what']} | {r['kernels']} | {r['beyond_forward']} | {_parts(r['parts'])} | "
                     f"{r['host_reads_in_step']} | {r['host_reads_per_iteration']} | {r['rng_kernels']} | "
                     f"{r['rng_per_iteration']} | {stray} |")
    lines += ["", "Per layer: the kernels inside the target's transformer blocks divided by their number. An AR "
              "step's 'sampling' part is CFG, filters and the draw. 'Host reads / iteration (loop)' counts every "
              "read the decode loop makes per iteration, the decoder's bookkeeping included; reads inside a step must "
              "be 0. 'Generator calls / iteration' counts the random-number kernels the loop launches per iteration "
              "outside the step: every race (AR's, the drafter's, the AR-identical judge's) hashes the position "
              "noise of the image's seed inside the step or fills a Jacobi table from it once per image, and the "
              "residual and relaxed rules' acceptance uniforms are drawn once per image up front: 0 everywhere. "
              "Goals: an AR step <= 24 kernels per layer eager and <= 12 compiled; a sampled "
              "57-node static-tree or EAGLE-2 iteration <= 300 kernels beyond its verification forward eagerly, "
              "<= 250 compiled; at most one host read per iteration."]
    if report.get("layouts"):
        lines += ["", "## Prompted layouts with forced end-of-row tokens (random narrow models, published depths)", "",
                  "| layout and mode | kernels / step or iteration | split | host reads inside | "
                  "host reads / iteration (loop) | factories without a device |", "|---|---|---|---|---|---|"]
        for r in report["layouts"]:
            if r["kernels"] < 0:
                lines.append(f"| {r['what']} | {r['path']} | | | | |")
                continue
            stray = ", ".join(f"{k} x{v}" for k, v in r["stray_factories"].items()) or "none"
            lines.append(f"| {r['what']} | {r['kernels']} | {_parts(r['parts'])} | {r['host_reads_in_step']} | "
                         f"{r['host_reads_per_iteration']} | {stray} |")
        lines += ["", "A prompt of 16 tokens and an unconditional row of 12 (CFG 4); the end-of-row rule "
                  "(`layout.constrain`) runs inside the step, so the captured path keeps no host read."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="kernels and host reads per AR step and per decoding iteration")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--lantern-k", type=int, default=10)
    parser.add_argument("--no-inductor", action="store_true", help="skip the torch.compile (Inductor) AR-step counts")
    parser.add_argument("--only", nargs="*", default=[], help="mode-name prefixes to count (the AR rows always run)")
    parser.add_argument("--shapes", nargs="*", default=None,
                        help="published AR shapes to count, by label prefix (default: all; none with no value)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    report = Report(args.out, f"decode_counts_{device.type}_{args.dtype}", markdown, **machine_info(device),
                    dtype=args.dtype)
    run(report, device, dtype, args.lantern_k, not args.no_inductor, tuple(args.only), args.shapes)
    return report.finish()


if __name__ == "__main__":
    main()
