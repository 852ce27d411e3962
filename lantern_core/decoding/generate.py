"""Plain autoregressive generation with a static KV cache (the baseline every speculative decoder
is measured against).

One entry point, `generate`, returns tokens plus stats: an eager prefill, then a loop over the static-shape
`ar_step` (`ar_step.py`), replayed from a CUDA graph on CUDA (`step_graphs.py`). CFG runs as [cond; uncond]
rows in one batch; the cache is preallocated for prefix + image tokens; sampling randomness comes only from
the caller's generators. Device and dtype are the model's; this module never picks them. Decoding tokens
to pixels is the VQ tokenizer's job.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from ..conditioning import Condition, build_prefix
from ..config import SamplingConfig
from ..models.gpt import ForwardStep, ImageTransformer
from ..models.kv_cache import KVCache, attention_mask
from .ar_step import (ARBuffers, ARShape, ar_step, exact_window, sample_step_tokens, slots_for,
                      window_for, windows)
from .sampling import Generators
from .step_graphs import RunLayout, StepExecution, StepRunner, layout_for, runner

# (tokens done per sample, total per sample, the (B, N) token buffer filled up to `done`)
StepCallback = Callable[[int, int, torch.Tensor], None]


@dataclass
class GenerationStats:
    batch: int
    image_tokens: int  # per sample
    forward_passes: int
    wall_time_s: float
    prefill_time_s: float
    kv_cache_bytes: int
    steps: StepExecution = StepExecution()  # how the decode steps ran: replayed graphs or eager, compiled or not

    @property
    def tokens_per_s(self) -> float:
        return self.batch * self.image_tokens / max(self.wall_time_s, 1e-9)

    @property
    def ms_per_step(self) -> float:
        return 1000.0 * self.wall_time_s / max(self.forward_passes, 1)

    @property
    def mean_accepted_length(self) -> float:
        return self.image_tokens / max(self.forward_passes, 1)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(tokens_per_s=self.tokens_per_s, ms_per_step=self.ms_per_step,
                   mean_accepted_length=self.mean_accepted_length, steps=self.steps.to_dict())
        return out

    def speed_text(self) -> str:
        return (f"{self.batch}x{self.image_tokens} tokens in {self.wall_time_s:.2f} s "
                f"({self.tokens_per_s:.1f} tok/s, {self.forward_passes} forward passes, "
                f"{self.ms_per_step:.1f} ms/step, mean accepted length {self.mean_accepted_length:.2f})")

    def fallback_text(self) -> str:
        """'; steps: <how they ran>' when a requested graph or compile fell back to eager, else ''."""
        return f"; steps: {self.steps.describe()}" if self.steps.fell_back else ""

    def summary(self) -> str:
        return self.speed_text() + self.fallback_text()


@dataclass
class GenerationResult:
    tokens: torch.Tensor  # (B, N) long, raster order
    stats: GenerationStats
    accepted_per_cell: torch.Tensor  # (B, N) int: tokens accepted by the forward that produced each cell
    rows: int = 0  # token rows of the grid (0: a square grid)

    def acceptance_grid(self, sample: int = 0) -> list[list[int]]:
        """The heat map of one sample as rows of the token grid (1 everywhere for plain AR)."""
        rows = self.rows or int(round(self.tokens.shape[1] ** 0.5))
        return self.accepted_per_cell[sample].reshape(rows, -1).tolist()


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels so wall times are real (CUDA and MPS run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def prefill(model: ImageTransformer, prefix, cache: KVCache, key_valid: torch.Tensor) -> torch.Tensor:
    """Write the prefix (rows, T) into slots 0..T-1 of `cache`, marking its padded keys in `key_valid`
    (rows, max_len; every later slot valid). Returns the prefix's hidden states (rows, T, dim)."""
    T = prefix.key_valid.shape[1]
    key_valid.fill_(True)
    key_valid[:, :T] = prefix.key_valid
    pos = torch.arange(T, device=key_valid.device)
    return model(prefix.embeddings, ForwardStep(pos, cache, kv_len=T, mask=attention_mask(key_valid, pos, T)))


def eager_ar_runner(model: ImageTransformer, shape: ARShape, masked: bool = True) -> StepRunner:
    """Fresh buffers for `shape` and the step over them, run eagerly (the caller releases the buffers)."""
    buffers = ARBuffers.allocate(model, shape)
    return StepRunner(lambda window: ar_step(model, shape, buffers, window, masked), buffers)


def reset_for_warmup(runner: StepRunner, variant=None) -> None:
    """A valid state for warm-up steps before a capture (index 1, one prefix slot, zero tokens)."""
    runner.buffers.index.fill_(1)
    runner.buffers.prefix_len.fill_(1)
    runner.buffers.tokens.zero_()


def ar_runner(model: ImageTransformer, shape: ARShape, layout: RunLayout, masked: bool = True) -> StepRunner:
    """The step runner for `shape`: a cached runner with one CUDA graph per attention window where `layout`
    uses graphs, else `eager_ar_runner` (`masked` as in `ar_step`)."""
    return runner(model, ("ar", shape), lambda: eager_ar_runner(model, shape, masked),
                  lambda: [shape.slots] if layout.compiled else windows(shape.slots),
                  reset_for_warmup, layout, model.tok_embeddings.weight.device)


@torch.no_grad()
def generate(model: ImageTransformer, condition: Condition, sampling: SamplingConfig,
             generator: Generators = None, on_step: StepCallback | None = None,
             compile: str = "auto") -> GenerationResult:
    """Sample `condition.batch` images' tokens autoregressively. Returns tokens (B, N) and stats.

    Prefill runs eagerly; every later token is one `ar_step` over static buffers, replayed from a CUDA graph
    when `compile` is "auto" on a CUDA device (captured once per shape, `step_graphs.py`), else eager.
    Both paths give the same tokens: token i of image g is decided by the position noise of (g's key, i),
    the key coming from its generator's seed (`position_noise.image_keys`)."""
    config = model.config
    n_tokens = config.num_image_tokens
    start = time.perf_counter()
    prefix = build_prefix(model, condition, sampling.uses_cfg)
    rows, T = prefix.key_valid.shape
    device = prefix.embeddings.device
    layout = layout_for(compile, device)
    shape = ARShape(condition.batch, slots_for(T, n_tokens, layout.slot_bucket), n_tokens, sampling)
    window = exact_window if layout.exact else window_for  # exact: the bare forward's cost
    if layout.compiled:  # one compiled variant: the whole cache, masked (as gpt-fast attends)
        window = lambda slot, slots: slots  # noqa: E731
    step_runner = ar_runner(model, shape, layout, masked=not layout.exact or not bool(prefix.key_valid.all()))
    buffers: ARBuffers = step_runner.buffers
    try:
        if not sampling.greedy:
            buffers.noise.fill(generator)
        logits = model.logits(prefill(model, prefix, buffers.cache, buffers.key_valid)[:, -1])  # (rows, V)
        buffers.index.zero_()
        buffers.tokens[:, 0] = sample_step_tokens(model, logits, sampling, buffers.index, buffers.noise)
        buffers.index.fill_(1)
        buffers.prefix_len.fill_(T)
        prefill_time = time.perf_counter() - start
        if on_step is not None:
            on_step(1, n_tokens, buffers.tokens)
        for i in range(1, n_tokens):
            step_runner.run(window(T + i - 1, shape.slots))
            if on_step is not None:
                on_step(i + 1, n_tokens, buffers.tokens)
        tokens = buffers.tokens.clone()
        cache_bytes = buffers.cache.nbytes
    finally:
        if not step_runner.shared:
            buffers.release()  # frees the eager buffers now, even when a callback interrupts the run
    synchronize(device)
    stats = GenerationStats(batch=condition.batch, image_tokens=n_tokens, forward_passes=n_tokens,
                            wall_time_s=time.perf_counter() - start, prefill_time_s=prefill_time,
                            kv_cache_bytes=cache_bytes, steps=step_runner.execution())
    return GenerationResult(tokens, stats, torch.ones_like(tokens, dtype=torch.int32), model.config.grid_size)
