"""Row fronts for relaxed 2-D Jacobi decoding (`JacobiConfig.row_commit`, Parallel-Jacobi style): where each
lower row's draft window sits, which of its lanes may be judged, and the attention mask of a forward whose
queries write their keys at their own raster slots.

With `row_commit` every window stays inside one image row. The frontier's W drafts never pass its row's
last cell (it emits at most up to there); committed cells it reaches (a lower row committed them) pass as
forced drafts and its keys for them are rewritten in the exact causal context. Every row below keeps its
own front: rows commit a prefix of themselves, so a front is the row's committed count. Lower window j
sits on row r0 + j (r0: the frontier's row) at that row's front, and lane i predicts the position
front + i. The lane is *real* (fed, written, kept, drafted) while it stays inside its row and the image;
it is *live* (judged, may commit) while the row above has committed the column `row_lead` to its right
as well. Lanes that are not real feed nothing useful: their keys go to the cache's last slot (the trash,
never visible), their predictions to the ring's discard row, their drafts to cells past the image.

Keys sit at raster slots (slot = prefix + position - 1 for the token a query reads), so a committed lower
token's key, written in the forward that fed it, stays where a later lower query can see it. A query sees
the committed prefix, the lower-row keys known to hold a committed token (`ahead_ok`), and the keys this
forward writes: all of them at earlier slots (raster-causal) or its own window's only (`row_causal`). The
frontier's queries sit before every lower key, so they see the exact causal context. This module computes
geometry and masks only: the iteration that uses them is `iteration.jacobi_iteration`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowLanes:
    """Where one iteration's windows sit, per image: the frontier's (confined to its row) and the lower rows'
    ((G, R - 1, w) lanes flattened to (G, (R - 1) w)). Idle lanes point at distinct cells past the image."""

    cells: torch.Tensor  # (G, W + 1) long the position each frontier query predicts
    front_width: torch.Tensor  # (G,) long frontier drafts that may be accepted (never past its row's last cell)
    positions: torch.Tensor  # (G, (R-1) w) long the position each lower lane predicts
    real: torch.Tensor  # (G, (R-1) w) bool lower lanes fed, written, kept and drafted
    width: torch.Tensor  # (G, R - 1) long leading live lanes of each lower window (the most it may commit)

    def ring(self, horizon: int) -> torch.Tensor:
        """(G, W + 1 + (R-1) w) the prediction-ring row of every query: its position mod `horizon`, or the
        discard row `horizon` for a lane that predicts nothing real."""
        inside = torch.arange(self.cells.shape[1], device=self.cells.device) <= self.front_width[:, None]
        return torch.cat([torch.where(inside, self.cells % horizon, horizon),
                          torch.where(self.real, self.positions % horizon, horizon)], 1)


def row_fronts(fixed: torch.Tensor, image_tokens: int, stride: int) -> torch.Tensor:
    """(G, >= N) committed cells -> (G, N / stride) committed count of every image row (its leading run)."""
    G = fixed.shape[0]
    grid = fixed[:, :image_tokens].view(G, image_tokens // stride, stride)  # (G, rows, stride)
    return grid.long().cumprod(2).sum(2)


def row_lanes(fixed: torch.Tensor, done: torch.Tensor, shape) -> RowLanes:
    """Where the windows of every image sit this iteration (see the module docstring). `shape` is a
    `shape.JacobiShape` with `config.row_commit`."""
    config, W, N, S = shape.config, shape.window, shape.image_tokens, shape.stride
    lower, w = config.rows - 1, config.row_window
    device, G = done.device, done.shape[0]
    dummy = N + 2 * shape.horizon + 1  # idle lane q points at cell dummy + q (the canvas is padded for it)
    fronts = row_fronts(fixed, N, S)  # (G, rows)
    last = fronts.shape[1] - 1
    frontier_row = (done // S).clamp(max=last)  # (G,)
    k = torch.arange(W + 1, device=device)
    front_width = ((frontier_row + 1) * S - 1 - done).clamp(min=0, max=W)  # (G,) drafts inside the row
    cells = torch.where(k <= front_width[:, None], done[:, None] + k, dummy + k)  # (G, W+1)
    rows = frontier_row[:, None] + torch.arange(1, lower + 1, device=device)  # (G, R-1) the windows' rows
    count = fronts.gather(1, rows.clamp(max=last))  # (G, R-1) committed per window row
    above = torch.cat([fronts.gather(1, frontier_row[:, None]), count[:, :-1]], 1)  # (G, R-1) the row above's
    column = count[..., None] + torch.arange(w, device=device)  # (G, R-1, w)
    real = (rows <= last)[..., None] & (column < S) & (done < N)[:, None, None]
    live = real & (column + config.row_lead < above[..., None])
    width = live.long().cumprod(2).sum(2)  # (G, R-1)
    idle = dummy + W + 1 + torch.arange(lower * w, device=device).view(1, lower, w)
    positions = torch.where(real, rows[..., None] * S + column, idle)
    return RowLanes(cells, front_width, positions.view(G, -1), real.view(G, -1), width)


def raster_mask(key_valid: torch.Tensor, ahead_ok: torch.Tensor, prefix_end: torch.Tensor, query_slots: torch.Tensor,
                written: torch.Tensor, blocks: torch.Tensor, window: int, row_causal: bool) -> torch.Tensor:
    """(rows, 1, Q, window) what each query sees. key_valid (rows, slots) the prefill's padding; ahead_ok (rows,
    slots) lower keys holding a committed token; prefix_end (rows,) the frontier's first slot (every slot
    before it committed); query_slots (rows, Q) where each query writes (the trash slot for lanes that feed
    nothing) and sits; written (rows, Q) whether it writes a real key; blocks (Q,) the window of each query."""
    rows, slots = key_valid.shape
    keys = torch.arange(window, device=key_valid.device)
    key_block = torch.full((rows, slots), -1, dtype=torch.long, device=key_valid.device)
    key_block.scatter_(1, query_slots, torch.where(written, blocks[None].expand(rows, -1), -1))  # trash gets -1 only
    key_block = key_block[:, :window]
    settled = key_valid[:, :window] & ((keys < prefix_end[:, None]) | ahead_ok[:, :window])  # (rows, window)
    fresh = key_block >= 0
    if row_causal:
        fresh_seen = fresh[:, None] & (key_block[:, None] == blocks[None, :, None])  # (rows, Q, window)
    else:
        fresh_seen = fresh[:, None].expand(-1, blocks.shape[0], -1)
    causal = keys <= query_slots[..., None]  # (rows, Q, window)
    return (causal & (settled[:, None] | fresh_seen))[:, None]
