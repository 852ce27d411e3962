"""The acceptance test of a Jacobi window: every position's test at once (exact min(1, p / q), LANTERN's relaxed
p~ or GSD's grouped mass), the leading run of accepted drafts, and the token after it (a residual draw from
max(0, p - q) at the first rejection, or the bonus token), all on the device with static shapes
(`judge_run`). `judge_window` is the same test over one window with the accepted count read on the host (for
references and tests).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..acceptance.relaxation import group_mass, relax
from ..acceptance.siblings import absorbed_set, normalise
from ..sampling import sample_from_probs
from .config import JacobiConfig

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
    uniforms (w+1,): `judge_run` over a full window, with the accepted count read on the host."""
    width = torch.tensor([drafts.numel()], device=p.device)
    verdict = judge_run(p[None], q[None], drafts[None], None if uniforms is None else uniforms[None], width, config,
                        neighbors, None if relaxable is None else relaxable[None], greedy)
    a = int(verdict.accepted)
    return WindowVerdict(a, verdict.token, verdict.gain[0, :a])


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where a rejected draft's position is resampled from: normalise(max(0, p - q)) (p if that is empty)."""
    return normalise((p - q).clamp(min=0), p)


@dataclass
class StaticVerdict:
    accepted: torch.Tensor  # (G,) long leading drafts accepted (<= the active width)
    token: torch.Tensor  # (G,) the token after them
    gain: torch.Tensor  # (G, W) relaxed / grouped mass each accepted draft used, 0 elsewhere


def judge_run(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, uniforms: torch.Tensor | None,
              width: torch.Tensor, config, neighbors: torch.Tensor | None, relaxable: torch.Tensor | None = None,
              greedy: bool = False, forced: torch.Tensor | None = None, with_token: bool = True) -> StaticVerdict:
    """For G windows: p (G, W+1, V) target at each window position, q (G, W, V) the drafts' distributions,
    drafts (G, W), uniforms (G, >= width+1): the acceptance tests of every position at once, drafts past
    `width` ((G,) long) never accepted, then the leading run and the token after it: the residual
    max(0, p - q) at a rejection (with LANTERN's absorbed set carved out of q), p itself after the whole run.
    Relaxed / grouped rules apply where `relaxable` (G, W) is True (default everywhere); other positions are
    judged exactly; `forced` (G, W) positions (already committed) pass. Without `with_token` (p then may hold
    W rows) no token is drawn: `token` is the run itself. No host read."""
    G, W = drafts.shape
    V = p.shape[-1]
    device = p.device
    cols = torch.arange(W, device=device)
    flat_p, flat_q, flat_x = p[:, :W].reshape(G * W, V), q.reshape(G * W, V), drafts.reshape(-1)  # (G*W, ...)
    gain = torch.zeros(G, W, dtype=p.dtype, device=device)
    count = None
    if greedy:
        ok = drafts == p[:, :W].argmax(-1)
    else:
        target = flat_p.gather(1, flat_x[:, None]).view(G, W)
        draft = flat_q.gather(1, flat_x[:, None]).view(G, W)
        if relaxable is None:
            relaxable = torch.ones(G, W, dtype=torch.bool, device=device)
        if config.relaxation is not None:
            mass = relax(flat_p, flat_x, neighbors, config.relaxation)
            count = torch.where(relaxable, mass.count.view(G, W), torch.zeros_like(drafts))
            gain = torch.where(relaxable, mass.absorbed.view(G, W), gain)
            target = target + gain
        elif config.grouping is not None:
            group = group_mass(flat_p, flat_q, flat_x, neighbors, config.grouping)
            exact_target = target
            target = torch.where(relaxable, group.target.view(G, W), target)
            draft = torch.where(relaxable, group.draft.view(G, W), draft)
            gain = target - exact_target
        ok = uniforms[:, :W] * draft < target  # u < target / draft without dividing (draft > 0 for a drawn token)
    if forced is not None:
        ok = ok | forced
    ok = ok & (cols < width[:, None])
    a = ok.long().cumprod(1).sum(1)  # (G,) the leading run
    if not with_token:
        return StaticVerdict(a, a, torch.where(cols < a[:, None], gain, torch.zeros_like(gain)))
    p_a = p.gather(1, a[:, None, None].expand(-1, 1, V))[:, 0]  # (G, V)
    if greedy:
        token = p_a.argmax(-1)
    else:
        at = a.clamp(max=W - 1)[:, None]  # (G, 1)
        q_row = q.gather(1, at[..., None].expand(-1, 1, V))[:, 0]  # (G, V)
        if count is not None and config.relaxation.k > 0:  # LANTERN: the absorbed set leaves q, as in the tree walk
            q_row = q_row.masked_fill(absorbed_set(drafts.gather(1, at)[:, 0], count.gather(1, at)[:, 0], neighbors,
                                                   config.relaxation.k, V), 0.0)
        probs = torch.where((a < width)[:, None], residual_distribution(p_a, q_row), p_a)
        token = sample_from_probs(probs, uniforms.gather(1, width.clamp(min=0)[:, None])[:, 0])
    return StaticVerdict(a, token, torch.where(cols < a[:, None], gain, torch.zeros_like(gain)))


def judge_same_as_ar(filtered: torch.Tensor, gumbel: torch.Tensor, drafts: torch.Tensor,
                     width: torch.Tensor) -> StaticVerdict:
    """AR's own draws at the W+1 window positions, filtered (G, W+1, V) + gumbel (G, W+1, V) raced as AR races
    them (the table holds -log E, so x + g is AR's x - log E bit for bit); drafts (G, W) pass while they equal
    those draws (never past `width`); the token after the run is the draw there. Every emitted token is AR's."""
    W = drafts.shape[1]
    draws = (filtered + gumbel).argmax(-1)  # (G, W+1)
    ok = (drafts == draws[:, :W]) & (torch.arange(W, device=drafts.device) < width[:, None])
    a = ok.long().cumprod(1).sum(1)  # (G,) the leading run
    return StaticVerdict(a, draws.gather(1, a[:, None])[:, 0], torch.zeros_like(drafts, dtype=filtered.dtype))
