"""Training-free speculative Jacobi decoding on the static KV cache: SJD (arXiv 2410.01699), coupled SJD
(SCD, arXiv 2510.24211), and relaxed Jacobi (LANTERN's latent relaxation, or GSD's grouped acceptance,
arXiv 2508.07747). No drafter, any target.

A window of W draft tokens rides along with the last emitted token in one causal forward. Draft j was
drawn from a known distribution q_j: the model's own prediction for that position in the previous
iteration (the Jacobi update), or, for positions entering the window, the initialisation: uniform
`random` tokens (q uniform), a sample from the model's latest prediction, the one for the furthest
position it has seen (`sample_left`, q that prediction), or a copy of the token to the left / above
(`repeat_left`, `repeat_above`; q a point mass). The test min(1, p_j(x_j) / q_j(x_j)) over the leading run, with the first rejected
position resampled from max(0, p - q), keeps the output distributed exactly as AR. Coupled drafting draws
every draft by Gumbel-max from one noise table indexed by absolute position (derived from the run's
generator), so a position whose distribution barely changed re-draws the same token and is accepted.

Proactive drafting (`proactive` K > 1, `jacobi_proactive.py`) adds K - 1 candidates, drawn without replacement
from the same law, at each of the window's first `proactive_depth` positions and judges each position's
candidates by recursive rejection sampling: still exact, more tokens per forward.

Relaxed modes replace p_j(x_j) by LANTERN's p~(x_j) (delta or lambda, `relaxation.py`; the absorbed
neighbours are carved out of q on rejection exactly as in the tree walk) or judge the draft by its GSD
group's mass p(G) / q(G). They relax only drafts the model proposed (Jacobi updates), never a fresh
initialisation: relaxing a uniform random token would accept it whenever its neighbours hold 1/V of
mass. They are not lossless; the mass they spend is reported in the stats. Greedy decoding (temperature
0) always uses the exact rule.

Rollback is free: accepted tokens already sit in consecutive cache slots; slots past the committed length
are stale and overwritten by the next window. A batch of B images runs together (rows = [cond B; uncond B]
with CFG): one forward verifies every image's window, each image accepts its own run and advances on its
own; image i draws only from generator i, so it equals a single run with that generator. Each iteration is one static-shape `jacobi_iteration` (`jacobi_step.py`), replayed from a
CUDA graph with compile "auto" on CUDA; this module prefills, draws the first token and loops, reading
the number of tokens done once per iteration. The `auto` window is chosen from the measured forward-cost
curve (`jacobi_window.py`). This module does not pick devices or load files.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from ..conditioning import Condition, build_prefix
from . import auto_store
from ..config import SamplingConfig
from ..errors import ConfigError
from .ar_step import slots_for
from .done_reader import DoneReader
from .generate import GenerationResult, StepCallback, prefill, synchronize
from .jacobi_step import (JacobiContext, JacobiShape, JacobiState, jacobi_bands, jacobi_iteration,
                          jacobi_window, judge_run)
from .jacobi_window import (LOSSLESS_GEOMETRIES, ROW_GEOMETRIES, WindowChoice, choose_rows, choose_window,
                            expected_tokens, target_costs)
from ..models.gpt import ImageTransformer
from .relaxation import Grouping, Relaxation
from .sampling import Generators, fill_per_image, generator_for, sample_from_probs
from ..layout import extend_neighbors
from .speculative import (BatchProgress, BatchRequest, BatchSink, NodeDistributions, RunTally, check_neighbors,
                          progress_tokens, record_images, retire_finished, weights_digest)
from .step_graphs import RunLayout, StepRunner, layout_for, runner

INITS = ("random", "sample_left", "repeat_left", "repeat_above")


@dataclass(frozen=True)
class JacobiConfig:
    """window: drafts verified per forward (besides the last emitted token), or "auto" (chosen up to
    `max_window` from this machine's cost curve). `relaxation` (LANTERN delta / lambda) or `grouping` (GSD)
    make it lossy; neither is lossless SJD."""

    window: int | str = 8
    coupled: bool = False  # SCD: Gumbel-max drafts from a per-position noise table
    init: str = "random"  # how positions entering the window are drafted
    relaxation: Relaxation | None = None
    grouping: Grouping | None = None
    max_window: int = 32
    rows: int = 1  # draft windows open: the frontier's plus rows - 1 on the image rows below it (2-D drafting)
    row_window: int = 4  # drafts per lower-row window
    row_offset: int | None = None  # where row j's window starts: j x (row stride + row_offset) past the frontier
    # (default -row_window - 1: it ends one column left of the column below the frontier, so the tokens above
    # it and above-right of it are committed)
    continuation: bool = False  # SJD-PAC's adaptive continuation: a Jacobi update keeps the current draft with
    # probability min(1, p / q) (else a residual draw), a maximal coupling; uncoupled drafts only
    row_causal: bool = False  # lower windows see the committed tokens and their own window only (PJD's mask);
    # else every earlier token the forward holds (the frontier's drafts and the windows above), in raster order
    row_commit: bool = False  # relaxed 2-D (Parallel-Jacobi style, lossy): each lower row keeps its own front,
    # judges its window there against what it sees and commits its accepted drafts before the frontier arrives
    row_lead: int = 1  # with row_commit: a lower row commits column c only once the row above holds c + row_lead
    auto_rows: bool = False  # rows, row_window (and for lossless 2-D row_offset) chosen per machine on scratch images
    proactive: int = 1  # proactive drafting (SJD-PAC's tree, `jacobi_proactive.py`): candidates at each of the first
    # `proactive_depth` positions past the frontier, judged by recursive rejection sampling (lossless); 1 = off
    proactive_depth: int = 3

    def __post_init__(self) -> None:
        if self.window != "auto" and (isinstance(self.window, bool) or not isinstance(self.window, int)
                                      or not 1 <= self.window <= 256):
            raise ConfigError("jacobi window", "an integer in 1..256 or 'auto'", self.window)
        if isinstance(self.max_window, bool) or not isinstance(self.max_window, int) or not 1 <= self.max_window <= 256:
            raise ConfigError("jacobi max_window", "an integer in 1..256", self.max_window)
        if self.init not in INITS:
            raise ConfigError("jacobi init", f"one of {INITS}", self.init)
        for name, value, low, high in (("jacobi rows", self.rows, 1, 8), ("jacobi row_window", self.row_window, 1, 64)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(name, f"an integer in {low}..{high}", value)
        if self.row_offset is not None and (isinstance(self.row_offset, bool) or not isinstance(self.row_offset, int)):
            raise ConfigError("jacobi row_offset", "an integer (columns; negative = left of the frontier's)",
                              self.row_offset)
        if isinstance(self.row_lead, bool) or not isinstance(self.row_lead, int) or not 0 <= self.row_lead <= 64:
            raise ConfigError("jacobi row_lead", "an integer in 0..64 (columns the row above stays ahead)", self.row_lead)
        if self.row_commit and self.rows < 2:
            raise ConfigError("jacobi row_commit", "rows >= 2 (lower rows to commit)", {"rows": self.rows},
                              "open at least one lower row, or turn row_commit off")
        if self.continuation and self.coupled:
            raise ConfigError("jacobi continuation", "uncoupled drafts (continuation is itself a coupling)",
                              {"continuation": True, "coupled": True}, "use sjd with continuation, or sjd_coupled")
        if self.relaxation is not None and self.grouping is not None:
            raise ConfigError("jacobi acceptance", "at most one of relaxation (LANTERN) or grouping (GSD)",
                              {"relaxation": self.relaxation, "grouping": self.grouping})
        for name, value, low, high in (("jacobi proactive", self.proactive, 1, 8),
                                       ("jacobi proactive_depth", self.proactive_depth, 1, 16)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(name, f"an integer in {low}..{high}", value)
        if self.proactive > 1 and (self.relaxation is not None or self.grouping is not None or self.row_commit):
            raise ConfigError("jacobi proactive", "the exact Jacobi rule (sjd, sjd_coupled, lossless 2-D)",
                              {"proactive": self.proactive, "relaxed": self.relaxation is not None
                               or self.grouping is not None, "row_commit": self.row_commit},
                              "set proactive to 1 with relaxed acceptance or relaxed 2-D decoding")

    @property
    def column_offset(self) -> int:
        """Columns between the column below the frontier and the start of the next row's window."""
        return -self.row_window - 1 if self.row_offset is None else self.row_offset

    def far_starts(self, window: int, stride: int) -> tuple[int, ...]:
        """Offsets (past the frontier) where each lower row's window starts, for a frontier `window` on rows of
        `stride` tokens; checked so that no two windows overlap."""
        step = stride + self.column_offset
        starts = tuple(j * step for j in range(1, self.rows))
        if self.rows > 1 and (starts[0] < window or (self.rows > 2 and step < self.row_window)):
            raise ConfigError("jacobi row geometry",
                              f"lower-row windows past the frontier's {window} drafts and apart by >= row_window "
                              f"{self.row_window} (row stride {stride} + row_offset >= max(window, row_window))",
                              {"rows": self.rows, "row_window": self.row_window, "row_offset": self.column_offset,
                               "window": window, "row stride": stride},
                              "open fewer rows, draft a smaller window, or start the lower windows further right "
                              "(a larger row_offset)")
        return starts

    def largest_window(self, stride: int) -> int:
        """The widest frontier window "auto" may choose: `max_window`, and with lower-row windows no wider than
        the offset where the first of them starts."""
        if self.rows == 1:
            return self.max_window
        if self.row_commit:  # the frontier's window stays inside its row
            return max(1, min(self.max_window, stride - 1))
        return max(1, min(self.max_window, stride + self.column_offset))

    def tree_depth(self, window: int) -> int:
        """Positions past the frontier that carry proactive candidates with a frontier `window` (0: off)."""
        return 0 if self.proactive == 1 else min(self.proactive_depth, window)

    def leaves(self, window: int) -> int:
        """Extra candidates proactive drafting adds to a forward with a frontier `window`: K - 1 at each of the
        `tree_depth` positions."""
        return (self.proactive - 1) * self.tree_depth(window)

    @property
    def neighbor_k(self) -> int:
        """Latent neighbours per token the acceptance rule reads (0: no table needed)."""
        rule = self.relaxation or self.grouping
        return 0 if rule is None else rule.k

    def describe(self, window: int | str | None = None) -> str:
        """e.g. "coupled jacobi w12 (sample-left init), lantern k10 lambda 5"; `window` overrides "auto"."""
        kind = "coupled " if self.coupled else "continued " if self.continuation else ""
        name = f"{kind}jacobi w{window or self.window} ({self.init.replace('_', '-')} init)"
        if self.rows > 1 and self.row_commit:
            name += (f", relaxed 2-D (lossy): {self.rows} rows x w{self.row_window} lead {self.row_lead}"
                     f"{' row-causal' if self.row_causal else ''}")
        elif self.rows > 1:
            name += (f", 2-D: {self.rows} rows x w{self.row_window} offset {self.column_offset:+d}"
                     f"{' row-causal' if self.row_causal else ''}")
        if self.proactive > 1:
            name += f", proactive {self.proactive} x depth {self.proactive_depth}"
        if self.auto_rows:
            name += " (auto geometry)"
        if self.relaxation is not None:
            r = self.relaxation
            name += f", lantern k{r.k} " + (f"delta {r.delta:g}" if r.delta is not None else f"lambda {r.lam:g}")
        if self.grouping is not None:
            name += f", gsd group k{self.grouping.k} gap {self.grouping.gap:g}"
        return name


# ------------------------------------------------------------------------------------------ acceptance


@dataclass
class WindowVerdict:
    accepted: int  # leading drafts accepted
    token: torch.Tensor  # (1,) the token after them: residual sample at the rejection, or the bonus
    absorbed: torch.Tensor  # (accepted,) relaxed / grouped mass each accepted draft used (0 when exact)


def judge_window(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, uniforms: torch.Tensor | None,
                 config: JacobiConfig, neighbors: torch.Tensor | None, relaxable: torch.Tensor | None = None,
                 greedy: bool = False) -> WindowVerdict:
    """p (w+1, V) target at each window position, q (w, V) the drafts' distributions, drafts (w,),
    uniforms (w+1,): `jacobi_step.judge_run` over a full window, with the accepted count read on the host."""
    width = torch.tensor([drafts.numel()], device=p.device)
    verdict = judge_run(p[None], q[None], drafts[None], None if uniforms is None else uniforms[None], width, config,
                        neighbors, None if relaxable is None else relaxable[None], greedy)
    a = int(verdict.accepted)
    return WindowVerdict(a, verdict.token, verdict.gain[0, :a])


# ---------------------------------------------------------------------------------------------- decoding


@torch.no_grad()
def jacobi_generate(model: ImageTransformer, condition: Condition, sampling: SamplingConfig, config: JacobiConfig,
                    generator: Generators = None, neighbors: torch.Tensor | None = None,
                    on_step: StepCallback | None = None, compile: str = "auto") -> GenerationResult:
    """Sample `condition.batch` images together with speculative Jacobi decoding; image i uses generator[i].
    `on_step` gets the tokens done by the whole batch, out of B x N, and the (B, N) tokens (-1 past each
    image's progress).
    `neighbors` (V, >= k) is needed for relaxation / grouping with k > 0. `compile` "auto" replays each
    iteration from a CUDA graph on CUDA (`jacobi_step.py`); "off" runs eagerly."""
    start = time.perf_counter()
    device = model.tok_embeddings.weight.device
    neighbors = extend_neighbors(model.config, check_neighbors(config.neighbor_k, neighbors, device, model.config))
    N, B = model.config.num_image_tokens, condition.batch
    window, note = config.window, ""
    if window == "auto" or config.auto_rows:
        choice = _auto_window(model, condition.row(0), sampling, config, neighbors, B)
        window, note = choice.window, f" (auto; {choice.note})"
        if choice.rows is not None:
            offset = config.row_offset if choice.row_offset is None else choice.row_offset
            config = replace(config, rows=choice.rows, row_window=choice.row_window, row_offset=offset)
    tally = RunTally(device)
    sink = BatchSink.allocate(B, N, tally)
    if on_step is not None:
        sink.report = lambda done: on_step(sum(done), B * N, sink.tokens)
    request = BatchRequest(condition, sampling, [generator_for(generator, i) for i in range(B)], neighbors, compile)
    _decode_batch(model, replace(config, window=window), request, sink)
    synchronize(device)
    stats = tally.to_stats(B, N, time.perf_counter() - start, config.describe(window) + note)
    return GenerationResult(sink.tokens, stats, sink.per_cell, model.config.grid_size)


def draw_position_noise(state: JacobiState, generators: list) -> None:
    """Coupled drafts and proactive leaves: one Gumbel noise row per absolute image position, image g's from
    `generators[g]` (a single run of it draws the same); nothing without a noise table."""
    if state.gumbel is None:
        return
    device = state.gumbel.device
    for g, generator in enumerate(generators):
        u = torch.rand(state.gumbel.shape[1:], generator=generator, device=device).clamp_(min=1e-20, max=1 - 1e-7)
        state.gumbel[g].copy_(-(-u.log()).log())


def jacobi_runner(model: ImageTransformer, shape: JacobiShape, dist: NodeDistributions,
                  neighbors: torch.Tensor | None, layout: RunLayout) -> StepRunner:
    """The iteration runner for `shape`: cached, with one CUDA graph per window band (variants are
    `jacobi_window`'s (band start, keys)), where `layout` uses graphs; else fresh eager buffers (the caller
    releases them)."""
    def build() -> StepRunner:
        state = JacobiState.allocate(model, shape, neighbors)
        context = JacobiContext(model, shape, dist)
        return StepRunner(lambda variant: jacobi_iteration(context, state, variant[1]), state)

    variants = (lambda: [jacobi_window(0, shape, False, whole=True)]) if layout.compiled else (lambda: jacobi_bands(shape))
    return runner(model, ("jacobi", shape), build, variants,
                  lambda r, variant: r.buffers.reset_for_warmup(variant[0] if variant else 0), layout,
                  model.tok_embeddings.weight.device)


def _decode_batch(model: ImageTransformer, config: JacobiConfig, request: BatchRequest, sink: BatchSink) -> None:
    """Decode a batch of G images into `sink` with an integer window: eager prefill and first tokens, then a
    loop of `jacobi_iteration`s over all of them (captured on CUDA) until the last is done, reading the tokens
    done of every image once per iteration."""
    condition, sampling, generators, neighbors = request.condition, request.sampling, request.generators, request.neighbors
    out, tally = sink.tokens, sink.tally
    t0 = time.perf_counter()
    N, W = model.config.num_image_tokens, config.window
    dist = NodeDistributions(sampling, sampling.uses_cfg, model.constrain_logits)
    prefix = build_prefix(model, condition, sampling.uses_cfg)
    rows, T = prefix.key_valid.shape
    device = prefix.embeddings.device
    layout = layout_for(request.compile, device)
    shape = JacobiShape(rows, 0, N, sampling, config, model.config.row_stride)
    shape = replace(shape, slots=slots_for(T, N + shape.extent + int(shape.row_commit), layout.slot_bucket))  # + trash
    G = shape.images
    step_runner = jacobi_runner(model, shape, dist, neighbors, layout)
    state: JacobiState = step_runner.buffers
    try:
        state.reset_counters()
        if state.neighbors is not None:
            state.neighbors.copy_(neighbors)
        hidden = prefill(model, prefix, state.cache, state.key_valid)
        first_p = JacobiContext(model, shape, dist).target(model.logits(hidden[:, -1:]),
                                                           torch.zeros(1, dtype=torch.long, device=device))[:, 0]  # (G, V)
        if sampling.greedy:
            first = first_p.argmax(-1)
        else:
            first = sample_from_probs(first_p, torch.cat([torch.rand(1, generator=g, device=device) for g in generators]))
        state.start_image(T, first, first_p)
        draw_position_noise(state, generators)
        if not sampling.greedy:  # every iteration's uniforms, per image, before the first one
            fill_per_image(state.uniforms, generators)
        progress_tokens(out, state.canvas, state.done)
        tally.prefill_s += time.perf_counter() - t0
        tally.batches += 1
        progress = BatchProgress.start(G, N)
        sink.report(progress.total)
        reader = DoneReader(state.done, late=not layout.exact)  # captured loops read one iteration late
        lag = W + 1 if reader.late else 0  # tokens an image may have gained since the counts were read
        while progress.running:
            step_runner.run(jacobi_window(T + progress.furthest_after(lag) - 1, shape, layout.exact, layout.compiled))
            tally.batch_iterations += 1
            progress.update(reader.read(state.done))  # the one host read per iteration
            progress_tokens(out, state.canvas, state.done, progress.index)
            sink.report(progress.total)
            smaller, keep = retire_finished(state, progress, sink, sampling.uses_cfg) if layout.exact else (None, None)
            if smaller is not None:
                state, shape = smaller, replace(shape, rows=smaller.length.shape[0])
                context = JacobiContext(model, shape, dist)
                step_runner = StepRunner(lambda variant, c=context, st=state: jacobi_iteration(c, st, variant[1]), state)
        record_images(state, progress, list(range(len(progress.images))), sink)
        tally.add_totals(state)
    finally:
        tally.cache_bytes = max(tally.cache_bytes, state.nbytes)
        if not step_runner.shared:
            state.release()


# ---------------------------------------------------------------------------------------------- auto window

_WINDOWS: dict[tuple, dict] = {}  # by weights digest: a reloaded model keeps its window (same seed, same image)


def _auto_key(sampling: SamplingConfig, config: JacobiConfig, device: torch.device, dtype: torch.dtype) -> tuple:
    return (sampling.uses_cfg, sampling.greedy, round(sampling.cfg_scale, 3), round(sampling.temperature, 3),
            sampling.top_k, round(sampling.top_p, 3), replace(config, window=1), str(device), str(dtype))


def _auto_window(model: ImageTransformer, condition: Condition, sampling: SamplingConfig, config: JacobiConfig,
                 neighbors: torch.Tensor | None, batch: int = 1) -> WindowChoice:
    """Once per model, sampling setting, rule, device and batch size: decode one scratch image (fixed seed,
    output discarded) with the largest window to measure how far drafts get accepted, then pick the window
    with the most tokens per second on the cost curve measured at the batch's rows. The user's seeds are
    untouched."""
    weight = model.tok_embeddings.weight
    key = (_auto_key(sampling, config, weight.device, weight.dtype), batch)
    cached = _WINDOWS.setdefault(weights_digest(model), {})
    stored_key = auto_store.entry_key("window", weights_digest(model), auto_store.device_name(weight.device),
                                      str(weight.dtype), _auto_key(sampling, config, "-", "-"), batch)
    if key in cached:
        return cached[key]
    stored = auto_store.recall(stored_key)  # an earlier process may have measured it (`auto_store.py`)
    try:
        if stored is not None:
            geometry = (None, None, None)
            if config.auto_rows:
                offset = stored.get("row_offset")
                geometry = (int(stored["rows"]), int(stored["row_window"]), None if offset is None else int(offset))
            cached[key] = WindowChoice(int(stored["window"]), float(stored["tokens_per_s"]),
                                       float(stored["ar_tokens_per_s"]), *geometry)
            return cached[key]
    except (KeyError, TypeError, ValueError):
        pass  # measured again below
    if config.auto_rows:
        choice = _measure_rows(model, condition, sampling, config, neighbors, batch)
    else:
        scratch = RunTally(weight.device)
        request = BatchRequest(condition, sampling, [torch.Generator(device=weight.device).manual_seed(0)], neighbors)
        largest = config.largest_window(model.config.row_stride)
        _decode_batch(model, replace(config, window=largest), request,
                      BatchSink.allocate(1, model.config.num_image_tokens, scratch))
        extra = (config.rows - 1) * config.row_window + config.leaves(largest)  # lower rows' drafts, leaves
        costs = target_costs(model, batch * (2 if sampling.uses_cfg else 1), largest + 1 + extra)
        choice = choose_window(scratch.histogram, costs, largest, extra)
    cached[key] = choice
    entry = {"window": choice.window, "tokens_per_s": choice.tokens_per_s, "ar_tokens_per_s": choice.ar_tokens_per_s}
    if choice.rows is not None:
        entry.update(rows=choice.rows, row_window=choice.row_window, row_offset=choice.row_offset)
    auto_store.remember(stored_key, entry, f"jacobi window for {type(model).__name__} at batch {batch}")
    return choice


def _measure_rows(model: ImageTransformer, condition: Condition, sampling: SamplingConfig, config: JacobiConfig,
                  neighbors: torch.Tensor | None, batch: int) -> WindowChoice:
    """An auto geometry: one scratch image (seed 0, discarded) per candidate, then the candidate with the most
    tokens per second on this machine's cost curve at the batch's rows. Relaxed 2-D tries `ROW_GEOMETRIES` with
    the frontier's widest window and measures tokens per forward directly; the lossless modes try
    `LOSSLESS_GEOMETRIES` (1-D among them) and plan each one's window from its acceptance histogram."""
    if not config.row_commit:
        return _lossless_geometry(model, condition, sampling, config, neighbors, batch)
    weight, N = model.tok_embeddings.weight, model.config.num_image_tokens
    window = config.largest_window(model.config.row_stride) if config.window == "auto" else config.window
    measured = {}
    for rows, row_window in ROW_GEOMETRIES:
        scratch = RunTally(weight.device)
        request = BatchRequest(condition, sampling, [torch.Generator(device=weight.device).manual_seed(0)], neighbors)
        _decode_batch(model, replace(config, window=window, rows=rows, row_window=row_window), request,
                      BatchSink.allocate(1, N, scratch))
        measured[(rows, row_window)] = N / max(scratch.iterations, 1)
    widest = max((rows - 1) * row_window for rows, row_window in ROW_GEOMETRIES)
    costs = target_costs(model, batch * (2 if sampling.uses_cfg else 1), window + 1 + widest)
    return choose_rows(measured, costs, window)


def _lossless_geometry(model: ImageTransformer, condition: Condition, sampling: SamplingConfig,
                       config: JacobiConfig, neighbors: torch.Tensor | None, batch: int) -> WindowChoice:
    """`_measure_rows` for sjd / sjd_coupled / sjd_relaxed: each geometry of `LOSSLESS_GEOMETRIES` that fits the
    image's rows, its window chosen (or the user's) from its own scratch image's acceptance histogram."""
    weight, N, stride = model.tok_embeddings.weight, model.config.num_image_tokens, model.config.row_stride
    candidates = []
    for rows, row_window, offset in LOSSLESS_GEOMETRIES:
        candidate = replace(config, rows=rows, row_window=row_window, row_offset=offset, auto_rows=False)
        window = candidate.largest_window(stride) if config.window == "auto" else config.window
        try:
            candidate.far_starts(window, stride)
        except ConfigError:
            continue  # this geometry does not fit these rows (or the user's window)
        candidates.append((replace(candidate, window=window),
                           ((rows - 1) * row_window if rows > 1 else 0) + candidate.leaves(window)))
    costs = target_costs(model, batch * (2 if sampling.uses_cfg else 1),
                         max(c.window + 1 + extra for c, extra in candidates))
    best = None
    for candidate, extra in candidates:
        scratch = RunTally(weight.device)
        request = BatchRequest(condition, sampling, [torch.Generator(device=weight.device).manual_seed(0)], neighbors)
        _decode_batch(model, candidate, request, BatchSink.allocate(1, N, scratch))
        if config.window == "auto":
            choice = choose_window(scratch.histogram, costs, candidate.window, extra)
        else:
            choice = WindowChoice(candidate.window, expected_tokens(scratch.histogram, candidate.window)
                                  / costs.verify(candidate.window + 1 + extra), 1.0 / costs.verify(1))
        choice = replace(choice, rows=candidate.rows, row_window=candidate.row_window, row_offset=candidate.row_offset)
        if best is None or choice.tokens_per_s > best.tokens_per_s:
            best = choice
    return best
