"""The step-by-step Jacobi decoder as it was before the static-shape iteration, kept as a test oracle:
Python-int lengths and widths (w = min(W, N - done) drafts fed), exact key extents, a draft window object
that re-draws and initialises from its iteration's row of uniforms, `judge_window` per iteration. Tokens only.
Randomness follows the library's order: the first token's uniform, the coupled noise table, then one row of
2W + 1 uniforms per iteration (W for the refill, W + 1 for the judge), all drawn before the first iteration."""
from __future__ import annotations

import torch

from lantern_core.conditioning import build_prefix
from lantern_core.decoding.generate import prefill
from lantern_core.decoding.jacobi.judge import judge_window
from lantern_core.decoding.jacobi.iteration import forward_window
from lantern_core.decoding.sampling import sample_from_probs
from lantern_core.decoding.acceptance.position_noise import PositionNoise
from lantern_core.decoding.sampling import NodeDistributions
from lantern_core.layout import extend_neighbors


class DraftWindow:
    """The W drafts ahead of the emitted prefix and the laws they were drawn from; `canvas` holds emitted
    tokens followed by the current drafts (what the repeat initialisations copy)."""

    def __init__(self, config, window, model, greedy, generator, device):
        N, V = model.config.num_image_tokens, model.config.vocab_size
        self.config, self.W, self.V, self.grid = config, window, V, model.config.row_stride
        self.greedy, self.generator = greedy, generator
        self.canvas = torch.zeros(N + window + 1, dtype=torch.long, device=device)
        self.uniform = torch.full((window, V), 1.0 / V, device=device)
        self.gumbel = None
        if config.coupled and not greedy:  # AR's position noise of the image's seed, as -log E (no generator draw)
            noise = PositionNoise.of(generator, 1, N + window + 1, V, device)
            self.gumbel = noise.exp_at(torch.arange(N + window + 1, device=device)).log().neg_()[0]

    def _draw(self, probs, start, uniforms):
        if self.greedy:
            return probs.argmax(-1)
        if self.gumbel is not None:
            return (probs.clamp(min=0).log() + self.gumbel[start:start + probs.shape[0]]).argmax(-1)
        return sample_from_probs(probs, uniforms[:probs.shape[0]])

    def refill(self, done, carried, latest, uniforms):
        """`uniforms` (W,): the refill's row of the iteration that will judge these drafts."""
        c = carried.shape[0]
        tokens = self._draw(carried, done, uniforms)
        self.canvas[done:done + c] = tokens
        n, start = self.W - c, done + c
        if self.config.init == "random":
            fresh, q = self._draw(self.uniform[:n], start, uniforms[c:]), self.uniform[:n]
        elif self.config.init == "sample_left":
            q = latest[None].expand(n, -1)
            fresh = self._draw(q, start, uniforms[c:])
        else:
            end, G = start + n, self.grid
            if self.config.init == "repeat_above":
                pos = start
                while pos < end and pos < G:
                    self.canvas[pos] = self.canvas[pos - 1]
                    pos += 1
                while pos < end:
                    stop = min(end, pos + G)
                    self.canvas[pos:stop] = self.canvas[pos - G:stop - G]
                    pos = stop
            else:
                self.canvas[start:end] = self.canvas[start - 1]
            fresh = self.canvas[start:start + n]
            q = torch.nn.functional.one_hot(fresh, self.V).to(self.uniform.dtype)
        self.canvas[start:start + n] = fresh
        self.tokens, self.q = torch.cat([tokens, fresh]), torch.cat([carried, q])
        self.proposed = torch.arange(self.W, device=carried.device) < c


class _State:
    def __init__(self, cache, key_valid, length):
        self.cache, self.key_valid, self.length = cache, key_valid, length


@torch.no_grad()
def reference_tokens(model, condition, sampling, config, generator, neighbors=None) -> torch.Tensor:
    """(N,) tokens of one image (`condition` of batch 1) with an integer window."""
    N, W = model.config.num_image_tokens, config.window
    dist = NodeDistributions(sampling, sampling.uses_cfg, model.constrain_logits)
    neighbors = extend_neighbors(model.config, neighbors)
    prefix = build_prefix(model, condition, sampling.uses_cfg)
    rows, T = prefix.key_valid.shape
    cache = model.allocate_cache(rows, T + N + W + 1)
    key_valid = torch.empty(rows, T + N + W + 1, dtype=torch.bool)
    hidden = prefill(model, prefix, cache, key_valid)
    state = _State(cache, key_valid, T)

    def target(logits, index):
        return (dist.combine(logits, index).softmax(-1) if sampling.greedy else dist(logits, index))[0]

    first_p = target(model.logits(hidden[:, -1:]), torch.zeros(1, dtype=torch.long))
    first = first_p.argmax(-1) if sampling.greedy else sample_from_probs(first_p, torch.rand(1, generator=generator))
    out = torch.zeros(N, dtype=torch.long)
    out[0] = first[0]
    drafts = DraftWindow(config, W, model, sampling.greedy, generator, "cpu")
    table = torch.full((N, 2 * W + 1), 0.5) if sampling.greedy else torch.rand(N, 2 * W + 1, generator=generator)
    drafts.canvas[0] = first[0]
    drafts.refill(1, first_p[:0], first_p[0], table[0, :W])
    done, iteration = 1, 0
    while done < N:
        w = min(W, N - done)
        p = target(forward_window(model, state, torch.cat([out[done - 1:done], drafts.tokens[:w]])),
                   done + torch.arange(w + 1))
        uniforms = None if sampling.greedy else table[iteration, W:W + w + 1]
        iteration += 1
        verdict = judge_window(p, drafts.q[:w], drafts.tokens[:w], uniforms, config, neighbors,
                               drafts.proposed[:w], sampling.greedy)
        a = verdict.accepted
        emitted = torch.cat([drafts.tokens[:a], verdict.token])
        take = min(a + 1, N - done)
        out[done:done + take] = emitted[:take]
        drafts.canvas[done:done + take] = emitted[:take]
        state.length += a + 1
        done += take
        if done < N:
            drafts.refill(done, p[a + 1:w + 1], p[w], table[iteration, :W])
    return out
