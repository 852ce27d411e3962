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

Relaxed modes replace p_j(x_j) by LANTERN's p~(x_j) (delta or lambda, `relaxation.py`; the absorbed
neighbours are carved out of q on rejection exactly as in the tree walk) or judge the draft by its GSD
group's mass p(G) / q(G). They relax only drafts the model proposed (Jacobi updates), never a fresh
initialisation: relaxing a uniform random token would accept it whenever its neighbours hold 1/V of
mass. They are not lossless; the mass they spend is reported in the stats. Greedy decoding (temperature
0) always uses the exact rule.

Rollback is free: accepted tokens already sit in consecutive cache slots; slots past the committed length
are stale and overwritten by the next window. One image at a time (rows = [cond; uncond] with CFG); image i
uses generator i. The `auto` window is chosen from the measured forward-cost curve (`jacobi_window.py`).
This module does not pick devices or load files.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from .acceptance import absorbed_set, normalise
from ..conditioning import Condition
from ..config import SamplingConfig
from ..errors import ConfigError
from .generate import DecodeState, GenerationResult, StepCallback, prefill_state, synchronize
from .jacobi_window import WindowChoice, choose_window, target_costs
from ..models.gpt import ForwardStep, ImageTransformer
from ..models.kv_cache import attention_mask
from .relaxation import Grouping, Relaxation, group_mass, relax
from .sampling import Generators, generator_for, sample_from_probs
from ..layout import extend_neighbors
from .speculative import NodeDistributions, RunTally, check_neighbors, weights_digest

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

    def __post_init__(self) -> None:
        if self.window != "auto" and (isinstance(self.window, bool) or not isinstance(self.window, int)
                                      or not 1 <= self.window <= 256):
            raise ConfigError("jacobi window", "an integer in 1..256 or 'auto'", self.window)
        if isinstance(self.max_window, bool) or not isinstance(self.max_window, int) or not 1 <= self.max_window <= 256:
            raise ConfigError("jacobi max_window", "an integer in 1..256", self.max_window)
        if self.init not in INITS:
            raise ConfigError("jacobi init", f"one of {INITS}", self.init)
        if self.relaxation is not None and self.grouping is not None:
            raise ConfigError("jacobi acceptance", "at most one of relaxation (LANTERN) or grouping (GSD)",
                              {"relaxation": self.relaxation, "grouping": self.grouping})

    @property
    def neighbor_k(self) -> int:
        """Latent neighbours per token the acceptance rule reads (0: no table needed)."""
        rule = self.relaxation or self.grouping
        return 0 if rule is None else rule.k

    def describe(self, window: int | str | None = None) -> str:
        """e.g. "coupled jacobi w12 (sample-left init), lantern k10 lambda 5"; `window` overrides "auto"."""
        name = f"{'coupled ' if self.coupled else ''}jacobi w{window or self.window} ({self.init.replace('_', '-')} init)"
        if self.relaxation is not None:
            r = self.relaxation
            name += f", lantern k{r.k} " + (f"delta {r.delta:g}" if r.delta is not None else f"lambda {r.lam:g}")
        if self.grouping is not None:
            name += f", gsd group k{self.grouping.k} gap {self.grouping.gap:g}"
        return name


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where a rejected draft's position is resampled from: normalise(max(0, p - q)) (p if that is empty)."""
    return normalise((p - q).clamp(min=0), p)


# ---------------------------------------------------------------------------------------------- cache


def forward_window(model: ImageTransformer, state: DecodeState, feed: torch.Tensor) -> torch.Tensor:
    """Feed tokens (n,) at the committed length (written, not committed) -> logits (rows, n, V)."""
    rows = state.key_valid.shape[0]
    n = feed.numel()
    slots = torch.arange(state.length, state.length + n, device=feed.device)
    step = ForwardStep(slots, state.cache, kv_len=state.length + n,
                       mask=attention_mask(state.key_valid, slots, state.length + n))
    return model.logits(model(model.embed_tokens(feed[None].expand(rows, -1)), step))


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
    uniforms (w+1,): the acceptance tests of every position at once (vectorised), then the leading run.
    Relaxed / grouped rules apply where `relaxable` (w,) is True (default: everywhere); other
    positions are judged exactly."""
    w = drafts.numel()
    rows = torch.arange(w, device=p.device)
    gain = torch.zeros(w, dtype=p.dtype, device=p.device)
    count = None
    if greedy:
        ok = drafts == p[:w].argmax(-1)
    else:
        q_x = q[rows, drafts]
        target, draft = p[rows, drafts], q_x
        if relaxable is None:
            relaxable = torch.ones(w, dtype=torch.bool, device=p.device)
        if config.relaxation is not None:
            mass = relax(p[:w], drafts, neighbors, config.relaxation)
            count = torch.where(relaxable, mass.count, torch.zeros_like(mass.count))
            gain = torch.where(relaxable, mass.absorbed, gain)
            target = target + gain
        elif config.grouping is not None:
            group = group_mass(p[:w], q, drafts, neighbors, config.grouping)
            target = torch.where(relaxable, group.target, target)
            draft = torch.where(relaxable, group.draft, draft)
            gain = target - p[rows, drafts]
        ok = uniforms[:w] * draft < target  # u < target / draft without dividing (draft > 0 for a drawn token)
    a = int(ok.long().cumprod(0).sum())  # the one host read per iteration
    if greedy:
        token = p[a:a + 1].argmax(-1)
    elif a < w:
        q_row = q[a:a + 1]
        if count is not None and config.relaxation.k > 0:  # LANTERN: the absorbed set leaves q, as in the tree walk
            q_row = q_row.masked_fill(absorbed_set(drafts[a:a + 1], count[a:a + 1], neighbors,
                                                   config.relaxation.k, p.shape[-1]), 0.0)
        token = sample_from_probs(residual_distribution(p[a:a + 1], q_row), uniforms[w:])
    else:
        token = sample_from_probs(p[a:a + 1], uniforms[w:])
    return WindowVerdict(a, token, gain[:a])


# ---------------------------------------------------------------------------------------------- drafts


class DraftWindow:
    """The W drafts ahead of the emitted prefix and the distributions they were drawn from. `canvas`
    holds emitted tokens followed by the current drafts (what the repeat initialisations copy)."""

    def __init__(self, config: JacobiConfig, window: int, model: ImageTransformer, greedy: bool,
                 generator: torch.Generator | None, device: torch.device):
        N, V = model.config.num_image_tokens, model.config.vocab_size
        self.config, self.W, self.V, self.grid = config, window, V, model.config.row_stride
        self.greedy, self.generator = greedy, generator
        self.canvas = torch.zeros(N + window + 1, dtype=torch.long, device=device)
        self.uniform = torch.full((window, V), 1.0 / V, device=device)
        self.gumbel = None
        if config.coupled and not greedy:  # one noise row per absolute image position
            u = torch.rand(N + window + 1, V, generator=generator, device=device).clamp_(min=1e-20, max=1 - 1e-7)
            self.gumbel = -(-u.log()).log()
        self.tokens = torch.empty(0, dtype=torch.long, device=device)
        self.q = torch.empty(0, V, device=device)
        self.proposed = torch.empty(0, dtype=torch.bool, device=device)

    def emit(self, start: int, tokens: torch.Tensor) -> None:
        self.canvas[start:start + tokens.numel()] = tokens

    def _draw(self, probs: torch.Tensor, start: int) -> torch.Tensor:
        """One token per row of probs (n, V) for positions start..: argmax when greedy, Gumbel-max with
        the positions' noise when coupled, else inverse-CDF sampling with fresh uniforms."""
        if self.greedy:
            return probs.argmax(-1)
        if self.gumbel is not None:
            return (probs.clamp(min=0).log() + self.gumbel[start:start + probs.shape[0]]).argmax(-1)
        return sample_from_probs(probs, torch.rand(probs.shape[0], generator=self.generator, device=probs.device))

    def refill(self, done: int, carried: torch.Tensor, latest: torch.Tensor) -> None:
        """New drafts for positions done..done+W-1: the first rows re-drawn from `carried` (c, V), the
        model's latest prediction for them (Jacobi update); the rest initialised (`sample_left` draws
        them from `latest` (V,), the prediction for the furthest position the model has seen)."""
        c = carried.shape[0]
        tokens = self._draw(carried, done)
        self.canvas[done:done + c] = tokens
        n, start = self.W - c, done + c
        if self.config.init == "random":
            fresh, q = self._draw(self.uniform[:n], start), self.uniform[:n]
        elif self.config.init == "sample_left":
            q = latest[None].expand(n, -1)
            fresh = self._draw(q, start)
        else:
            self._repeat(start, n)
            fresh = self.canvas[start:start + n]
            q = torch.nn.functional.one_hot(fresh, self.V).to(self.uniform.dtype)  # point masses
        self.canvas[start:start + n] = fresh
        self.tokens, self.q = torch.cat([tokens, fresh]), torch.cat([carried, q])
        self.proposed = torch.arange(self.W, device=carried.device) < c  # drawn from the model's own prediction

    def _repeat(self, start: int, n: int) -> None:
        """canvas[start:start+n] = copies of the token to the left (or above; left on the first row)."""
        end, G = start + n, self.grid
        if self.config.init == "repeat_above":
            pos = start
            while pos < end and pos < G:  # first image row: nothing above
                self.canvas[pos] = self.canvas[pos - 1]
                pos += 1
            while pos < end:  # whole rows at a time: the source lies at least G back
                stop = min(end, pos + G)
                self.canvas[pos:stop] = self.canvas[pos - G:stop - G]
                pos = stop
        else:
            self.canvas[start:end] = self.canvas[start - 1]


# ---------------------------------------------------------------------------------------------- decoding


@torch.no_grad()
def jacobi_generate(model: ImageTransformer, condition: Condition, sampling: SamplingConfig, config: JacobiConfig,
                    generator: Generators = None, neighbors: torch.Tensor | None = None,
                    on_step: StepCallback | None = None) -> GenerationResult:
    """Sample `condition.batch` images with speculative Jacobi decoding; image i uses generator[i].
    `neighbors` (V, >= k) is needed for relaxation / grouping with k > 0."""
    start = time.perf_counter()
    device = model.tok_embeddings.weight.device
    neighbors = extend_neighbors(model.config, check_neighbors(config.neighbor_k, neighbors, device))
    N, B = model.config.num_image_tokens, condition.batch
    window, note = config.window, ""
    if window == "auto":
        choice = _auto_window(model, condition.row(0), sampling, config, neighbors)
        window, note = choice.window, f" (auto; {choice.note})"
    tokens = torch.empty(B, N, dtype=torch.long, device=device)
    per_cell = torch.ones(B, N, dtype=torch.int32, device=device)
    tally = RunTally(device)
    for i in range(B):
        def report(done: int, _i=i) -> None:
            if on_step is not None:
                on_step(_i * N + done, B * N, tokens[_i:_i + 1])
        _decode_one(model, condition.row(i), sampling, replace(config, window=window), generator_for(generator, i),
                    neighbors, tokens[i], per_cell[i], tally, report)
    synchronize(device)
    stats = tally.to_stats(B, N, time.perf_counter() - start, config.describe(window) + note)
    return GenerationResult(tokens, stats, per_cell)


def _decode_one(model: ImageTransformer, condition: Condition, sampling: SamplingConfig, config: JacobiConfig,
                generator: torch.Generator | None, neighbors: torch.Tensor | None, out: torch.Tensor,
                per_cell: torch.Tensor, tally: RunTally, report) -> None:
    """Decode one image into `out` (N,) with an integer window."""
    t0 = time.perf_counter()
    N, W = model.config.num_image_tokens, config.window
    dist = NodeDistributions(sampling, sampling.uses_cfg, model.constrain_logits)
    state, hidden = prefill_state(model, condition, sampling.uses_cfg, spare=W + 1)
    device = hidden.device

    def target(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """(rows, n, V) logits -> (n, V) what the sampler samples from (softmax of the CFG mix when greedy)."""
        return (dist.combine(logits, index).softmax(-1) if sampling.greedy else dist(logits, index))[0]

    try:
        first_p = target(model.logits(hidden[:, -1:]), torch.zeros(1, dtype=torch.long, device=device))  # (1, V)
        first = first_p.argmax(-1) if sampling.greedy else \
            sample_from_probs(first_p, torch.rand(1, generator=generator, device=device))
        out[0] = first[0]
        drafts = DraftWindow(config, W, model, sampling.greedy, generator, device)
        drafts.emit(0, first)
        tally.prefill_s += time.perf_counter() - t0
        report(1)
        done = 1
        drafts.refill(done, first_p[:0], first_p[0])
        while done < N:
            w = min(W, N - done)  # never draft past the last image token
            logits = forward_window(model, state, torch.cat([out[done - 1:done], drafts.tokens[:w]]))  # (rows, w+1, V)
            index = done + torch.arange(w + 1, device=device)  # image position each row predicts
            p = target(logits, index)  # (w+1, V)
            uniforms = None if sampling.greedy else torch.rand(w + 1, generator=generator, device=device)
            verdict = judge_window(p, drafts.q[:w], drafts.tokens[:w], uniforms, config, neighbors,
                                   drafts.proposed[:w], sampling.greedy)
            a = verdict.accepted
            emitted = torch.cat([drafts.tokens[:a], verdict.token])
            take = min(a + 1, N - done)
            out[done:done + take] = emitted[:take]
            per_cell[done:done + take] = a + 1
            drafts.emit(done, emitted[:take])
            state.length += a + 1  # rollback: the rejected tail's slots are overwritten next time
            done += take
            tally.record(verdict.accepted, verdict.absorbed)
            report(done)
            if done < N:
                drafts.refill(done, p[a + 1:w + 1], p[w])  # Jacobi update for the positions the model just predicted
    finally:
        tally.cache_bytes = max(tally.cache_bytes, state.release())


# ---------------------------------------------------------------------------------------------- auto window

_WINDOWS: dict[tuple, dict] = {}  # by weights digest: a reloaded model keeps its window (same seed, same image)


def _auto_key(sampling: SamplingConfig, config: JacobiConfig, device: torch.device, dtype: torch.dtype) -> tuple:
    return (sampling.uses_cfg, sampling.greedy, round(sampling.cfg_scale, 3), round(sampling.temperature, 3),
            sampling.top_k, round(sampling.top_p, 3), replace(config, window=1), str(device), str(dtype))


def _auto_window(model: ImageTransformer, condition: Condition, sampling: SamplingConfig, config: JacobiConfig,
                 neighbors: torch.Tensor | None) -> WindowChoice:
    """Once per model, sampling setting, rule and device: decode one scratch image (fixed seed, output
    discarded) with the largest window to measure how far drafts get accepted, then pick the window with
    the most tokens per second on the measured cost curve. The user's seeds are untouched."""
    weight = model.tok_embeddings.weight
    key = _auto_key(sampling, config, weight.device, weight.dtype)
    cached = _WINDOWS.setdefault(weights_digest(model), {})
    if key not in cached:
        scratch = RunTally(weight.device)
        N = model.config.num_image_tokens
        _decode_one(model, condition, sampling, replace(config, window=config.max_window),
                    torch.Generator(device=weight.device).manual_seed(0), neighbors,
                    torch.empty(N, dtype=torch.long, device=weight.device),
                    torch.ones(N, dtype=torch.int32, device=weight.device), scratch, lambda done: None)
        costs = target_costs(model, 2 if sampling.uses_cfg else 1, config.max_window + 1)
        cached[key] = choose_window(scratch.histogram, costs, config.max_window)
    return cached[key]
