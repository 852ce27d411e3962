"""Proactive drafting at the Jacobi frontier (SJD-PAC's tree at the rejection point, in our
own construction): K candidates instead of one at each of the first D positions past the frontier, verified
in the same forward and judged by recursive rejection sampling, so the frontier stays exact.

Layout: the frontier's chain of W drafts is unchanged (candidate 0 at every depth, the Jacobi draft). Each of
its first D positions gets K - 1 more candidates drawn without replacement from the law q candidate 0 was
drawn from (Gumbel-top-k over log q with candidate 0 removed, from the per-image, per-position noise table
that coupled drafting also reads). A candidate at depth d hangs from chain node d - 1, so the tree is a
caterpillar: the chain plus D x (K - 1) leaves. The leaves ride after every other query of the forward, at
the RoPE position of their depth, and see the committed prefix, the chain up to their parent and themselves;
no other query sees them. The leaves are drafted every iteration (static shapes): each iteration starts
right after a rejection or a bonus token, so the first D positions are where the last window stopped.

Judge: at depth d < D the K candidates are tested in rank order, each against the residual the earlier ones
left, with q minus the earlier candidates as its law (`acceptance.siblings.accept_siblings`); candidate 0's test is the
plain Jacobi test. The chain's run of candidate-0 acceptances ends at a. If a < D and a leaf at depth a
passes, it is committed, its key copied into the chain's slot a + 1, and the token after it drawn from the
leaf's own prediction; if none passes, the token is drawn from the residual after all K. Past depth D the
plain rule holds. Exact rules only (no LANTERN / GSD relaxation), on the 1-D and lossless 2-D windows; not
with row commits. Under the AR-identical rule (`judge_leaves_same_as_ar`) the chain and the leaves are the
race AR runs with its position noise (candidate 0 its winner, the leaves its runners-up), and a candidate is
taken only where it is AR's own draw. Drafting of the chain, the forward and the emission live in
`jacobi/iteration.py`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...models.kv_cache import KVCache
from ..acceptance.siblings import accept_siblings, normalise
from ..batching import per_row
from ..sampling import sample_from_probs
from .judge import judge_same_as_ar
from .shape import query_blocks, query_offsets


@dataclass
class LeafBuffers:
    """The static tensors proactive drafting adds to a Jacobi state."""

    visible: torch.Tensor  # (Q, Q) bool which scratch key each query of the forward sees
    offsets: torch.Tensor  # (Q,) long the offset past the frontier each query predicts
    leaves: torch.Tensor  # (G, S) long the leaves' tokens, depth-major: depth d holds leaves d (K-1) .. (d+1) (K-1) - 1

    @classmethod
    def allocate(cls, shape, images: int, device: torch.device) -> "LeafBuffers":
        base = query_offsets(shape, device)  # (Q0,) the frontier's and the lower windows' queries
        Q0, S = base.numel(), shape.leaves
        depth = leaf_depths(shape, device)  # (S,)
        index = torch.arange(Q0, device=device)
        visible = torch.zeros(Q0 + S, Q0 + S, dtype=torch.bool, device=device)
        causal = index[:, None] >= index[None]
        if shape.config.row_causal and shape.lower:
            blocks = query_blocks(shape, device)
            causal = causal & (blocks[:, None] == blocks[None])
        visible[:Q0, :Q0] = causal
        visible[Q0:, :Q0] = index[None] <= depth[:, None]  # a leaf at depth d reads the chain's queries 0 .. d
        visible[Q0:, Q0:] = torch.eye(S, dtype=torch.bool, device=device)
        return cls(visible, torch.cat([base, depth + 1]), torch.zeros(images, S, dtype=torch.long, device=device))

    def select(self, keep: torch.Tensor) -> "LeafBuffers":
        return LeafBuffers(self.visible, self.offsets, self.leaves.index_select(0, keep))


def leaf_depths(shape, device: torch.device) -> torch.Tensor:
    """(S,) the depth (offset past the frontier) of each leaf: K - 1 leaves at each of depths 0 .. D - 1."""
    return torch.arange(shape.tree_depth, device=device).repeat_interleave(shape.config.proactive - 1)


def draw_leaves(shape, q: torch.Tensor, chain: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    """The K - 1 leaves of each of the first D positions: q (G, D, V) the law candidate 0 `chain` (G, D) was
    drawn from, noise (G, D, V) the positions' Gumbel noise (None when greedy: the next most likely tokens).
    Gumbel-top-(K-1) over log q without candidate 0 draws them without replacement in rank order. A leaf
    whose q is 0 (the law held fewer tokens) is drawn anyway and never accepted. Returns (G, D (K-1))."""
    G, D, _ = q.shape
    scores = q if noise is None else q.clamp(min=0).log() + noise
    scores = scores.scatter(2, chain[..., None], float("-inf"))
    return scores.topk(shape.config.proactive - 1, dim=-1).indices.reshape(G, -1)  # (G, D, K-1) -> flat


@dataclass
class LeafVerdict:
    accepted: torch.Tensor  # (G,) long tokens accepted before the token after them (a leaf counts as one)
    token: torch.Tensor  # (G,) the token after them
    run: torch.Tensor  # (G,) long candidate-0 drafts accepted (the chain's leading run)
    leaf: torch.Tensor  # (G,) long index of the accepted leaf in `leaves`, -1 when none


def judge_with_leaves(p: torch.Tensor, p_leaves: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                      leaves: torch.Tensor, uniforms: torch.Tensor, width: torch.Tensor, greedy: bool) -> LeafVerdict:
    """p (G, W+1, V) the chain's targets, p_leaves (G, S, V) each leaf's own prediction, q (G, W, V) the drafts'
    laws, drafts (G, W), leaves (G, D, K-1) by depth, uniforms (G, W + 1 + S): the chain's tests, the token's draw (index
    `width`) and the leaves' tests; drafts and leaves at depth >= `width` (G,) are never accepted. No host read
    but the CPU's early stop inside `accept_siblings`."""
    G, W = drafts.shape
    _, D, K = leaves.shape
    K, V = K + 1, p.shape[-1]
    device = p.device
    cols = torch.arange(W, device=device)
    candidates = torch.cat([drafts[:, :D, None], leaves], 2)  # (G, D, K) rank order
    live = (torch.arange(D, device=device) < width[:, None])[..., None].expand(G, D, K)  # (G, D, K)
    if greedy:
        best = p[:, :W].argmax(-1)  # (G, W)
        ok = drafts == best
        match = (candidates == best[:, :D, None]) & live
        first = torch.where(match.any(-1), match.float().argmax(-1), torch.full_like(best[:, :D], -1))  # (G, D)
        residual = None
    else:
        tests = torch.cat([uniforms[:, :D, None], uniforms[:, W + 1:].view(G, D, K - 1)], 2)  # (G, D, K)
        verdict = accept_siblings(p[:, :D].reshape(G * D, V), q[:, :D].reshape(G * D, V).log(),
                                  candidates.reshape(G * D, K), tests.reshape(G * D, K), live.reshape(G * D, K))
        first = verdict.accepted.view(G, D)  # (G, D) the candidate accepted at each depth, -1 none
        residual = verdict.residual.view(G, D, V)
        target = p[:, :W].gather(2, drafts[..., None])[..., 0]
        draft = q.gather(2, drafts[..., None])[..., 0]
        ok = uniforms[:, :W] * draft < target  # the plain rule past depth D
    ok = torch.cat([first == 0, ok[:, D:]], 1) & (cols < width[:, None])
    run = ok.long().cumprod(1).sum(1)  # (G,)
    at = run.clamp(max=D - 1)[:, None]  # (G, 1)
    pick = first.gather(1, at)[:, 0]
    in_tree = (run < D) & (run < width)
    took = in_tree & (pick > 0)  # a leaf passed where the chain stopped
    leaf = torch.where(took, at[:, 0] * (K - 1) + pick - 1, torch.full_like(pick, -1))
    p_leaf = p_leaves.gather(1, leaf.clamp(min=0)[:, None, None].expand(-1, 1, V))[:, 0]  # (G, V)
    p_run = p.gather(1, run[:, None, None].expand(-1, 1, V))[:, 0]
    if greedy:
        token = torch.where(took, p_leaf.argmax(-1), p_run.argmax(-1))
    else:
        q_run = q.gather(1, run.clamp(max=W - 1)[:, None, None].expand(-1, 1, V))[:, 0]
        after_chain = torch.where((run < width)[:, None], normalise((p_run - q_run).clamp(min=0), p_run), p_run)
        tree_residual = residual.gather(1, at[..., None].expand(-1, 1, V))[:, 0]
        probs = torch.where(took[:, None], p_leaf, torch.where(in_tree[:, None], tree_residual, after_chain))
        token = sample_from_probs(probs, uniforms.gather(1, width.clamp(min=0)[:, None])[:, 0])
    return LeafVerdict(run + took.long(), token, run, leaf)


def judge_leaves_same_as_ar(filtered: torch.Tensor, leaf_filtered: torch.Tensor, gumbel: torch.Tensor,
                            drafts: torch.Tensor, leaves: torch.Tensor, width: torch.Tensor) -> LeafVerdict:
    """The AR-identical judge with proactive leaves: filtered (G, W+1, V) the chain's filtered logits, leaf_filtered
    (G, S, V) each leaf's own prediction, gumbel (G, W+1, V) AR's noise (-log E) at the chain's W+1 positions,
    drafts (G, W), leaves (G, D, K-1) by depth. The chain passes while its drafts equal AR's draws (never past
    `width`); where it stops inside the first D positions, a leaf there that equals AR's draw is taken, and the
    token after it is AR's draw from the leaf's prediction with the next position's noise; otherwise the token is
    AR's draw where the chain stopped. Leaves are the runners-up of the race candidate 0 won, so each emitted
    token is AR's, whatever K and D."""
    G, W = drafts.shape
    _, D, K1 = leaves.shape
    V = filtered.shape[-1]
    chain = judge_same_as_ar(filtered, gumbel, drafts, width)  # the chain's run and AR's draw where it stops
    run = chain.accepted  # (G,) candidate-0 drafts accepted
    at = run.clamp(max=D - 1)[:, None]  # (G, 1)
    match = leaves.gather(1, at[..., None].expand(G, 1, K1))[:, 0] == chain.token[:, None]  # (G, K-1)
    took = (run < D) & (run < width) & match.any(-1)  # (at is the run wherever `took` can hold)
    leaf = torch.where(took, at[:, 0] * K1 + match.float().argmax(-1), torch.full_like(run, -1))
    after = leaf_filtered.gather(1, leaf.clamp(min=0)[:, None, None].expand(G, 1, V))[:, 0]  # (G, V)
    noise = gumbel.gather(1, (run + 1).clamp(max=W)[:, None, None].expand(G, 1, V))[:, 0]  # the next position's
    token = torch.where(took, (after + noise).argmax(-1), chain.token)
    return LeafVerdict(run + took.long(), token, run, leaf)


def move_leaf_key(cache: KVCache, length: torch.Tensor, verdict: LeafVerdict, chain_queries: int) -> None:
    """Copy an accepted leaf's key and value from its scratch slot to the chain's slot after the run (where
    candidate 0's were), per row; rows without an accepted leaf copy that slot onto itself."""
    rows = length.shape[0]
    dest = per_row(verdict.run + 1, rows)  # (rows,) scratch index of the slot the leaf takes
    source = torch.where(per_row(verdict.leaf, rows) >= 0, chain_queries + per_row(verdict.leaf, rows), dest)
    cache.compact((length + source)[:, None], length + dest)
