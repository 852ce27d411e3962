"""Verifying a drafted tree: walk from the root, accept at most one child per depth, then draw the bonus
token. Vectorised over rows, a fixed loop over depth, no host syncs (the caller reads the path once).

Inputs are per-node target distributions (already CFG-combined and filtered), the tree's child table
and, for sampled trees, the drafter distribution each node's children were drawn from. Greedy decoding
(temperature 0) accepts a child iff it is the argmax of the (relaxed) target, LANTERN's greedy rule,
and the bonus is the argmax at the last accepted node. On the CPU, where reading a tensor costs no
device sync, the loops stop as soon as every row has stopped. `walk_same_as_ar` is the default lossless
rule for sampled trees: a node is accepted iff its token is the target's own draw after its parent (AR's
Gumbel race at that position), so the tokens are AR's; it has no loop at all. Drafting and KV bookkeeping
are elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..acceptance.relaxation import Relaxation, relax
from ..acceptance.siblings import accept_siblings
from ..sampling import sample_from_probs
from ..step_graphs import may_read_host


@dataclass
class WalkResult:
    path: torch.Tensor  # (B, depth+1) node ids root first, -1 after the last accepted node
    accepted: torch.Tensor  # (B,) drafted tokens accepted (path length - 1)
    bonus: torch.Tensor  # (B,) token drawn from the target after the accepted path
    absorbed: torch.Tensor | None  # (B, depth) relaxed mass moved onto each accepted token (None: an exact walk)


def greedy_children(scores: torch.Tensor, child_tokens: torch.Tensor, valid: torch.Tensor,
                    rule: Relaxation | None, neighbors: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """First child (rank order) that is the argmax of the relaxed target. scores (B, V) CFG-combined
    logits; child_tokens, valid (B, m). Returns (index or -1 (B,), absorbed mass (B,))."""
    B, m = child_tokens.shape
    x = child_tokens.clamp(min=0)
    rows = torch.arange(B, device=scores.device).repeat_interleave(m)  # (B*m,) each child's parent row
    passes, absorbed = relaxed_greedy_passes(scores, rows, x.reshape(-1), rule, neighbors)
    passes, absorbed = passes.view(B, m) & valid, absorbed.view(B, m)
    best = scores.argmax(-1)  # (B,)
    first = torch.where(passes.any(-1), passes.float().argmax(-1), torch.full_like(best, -1))
    return first, absorbed.gather(1, first.clamp(min=0)[:, None])[:, 0] * (first >= 0)


def walk_tree(target: torch.Tensor, children: torch.Tensor, node_tokens: torch.Tensor, depth: int,
              uniforms: torch.Tensor, drafter_log_q: torch.Tensor | None = None, greedy: bool = False,
              rule: Relaxation | None = None, neighbors: torch.Tensor | None = None,
              widths: tuple[int, ...] | None = None) -> WalkResult:
    """target (B, n+1, V): target probabilities at each node (greedy: CFG-combined logits); children
    (n+1, C) or per row (B, n+1, C) node ids by rank, -1 padded; node_tokens (B, n+1); uniforms (B, depth, C+1);
    drafter_log_q (B, n+1, V) log drafter distributions for sampled trees, None when children are
    deterministic (top-k); `widths[d]` (static trees) the most children a depth-d node has, so the sibling
    loop at depth d runs that many times instead of C (the padding it skips changes nothing)."""
    B = target.shape[0]
    device = target.device
    rows = torch.arange(B, device=device)
    cur = torch.zeros(B, dtype=torch.long, device=device)
    alive = torch.ones(B, dtype=torch.bool, device=device)
    steps = [cur]  # the path's node at each depth, -1 once a row stopped (root first)
    masses = []  # the relaxed mass each depth's accepted token absorbed (relaxed rules only)
    residual = None if greedy else target[:, 0]  # where a stopped row samples its bonus token
    C = children.shape[-1]
    # host reads are free on the CPU: stop at the first depth where every row has stopped (the extra
    # depths change nothing; never in a captured or compiled step)
    cpu = may_read_host(device)
    for d in range(depth):
        if cpu and d > 0 and not bool(alive.any()):
            steps.extend([torch.full_like(cur, -1)] * (depth - d))
            masses.extend([torch.zeros(B, device=device)] * (depth - d) if rule is not None else [])
            break
        width = C if widths is None else max(min(widths[d], C), 1)
        kids = (children[cur] if children.dim() == 2 else children[rows, cur])[:, :width]  # (B, width)
        valid = (kids >= 0) & alive[:, None]
        tokens = node_tokens[rows[:, None], kids.clamp(min=0)]  # (B, width)
        here = target[rows, cur]  # (B, V)
        if greedy:
            choice, mass = greedy_children(here, tokens, valid, rule, neighbors)
        else:
            log_q = None if drafter_log_q is None else drafter_log_q[rows, cur]
            verdict = accept_siblings(here, log_q, tokens, uniforms[:, d, :width], valid, rule, neighbors)
            choice, mass = verdict.accepted, verdict.absorbed
        took = alive & (choice >= 0)
        if not greedy:  # a row ending here samples from what its rejections left, or from here at a leaf
            ended = alive ^ took
            residual = torch.where(ended[:, None], torch.where(valid.any(-1, keepdim=True), verdict.residual, here),
                                   residual)
        cur = torch.where(took, kids.gather(1, choice.clamp(min=0)[:, None])[:, 0], cur)
        steps.append(torch.where(took, cur, -1))
        if rule is not None:
            masses.append(torch.where(took, mass.float(), 0.0))
        alive = took
    path = torch.stack(steps, 1)  # (B, depth+1)
    absorbed = torch.stack(masses, 1) if masses else torch.zeros(B, depth, device=device)
    if greedy:
        bonus = target[rows, cur].argmax(-1)
    else:  # rows that accepted at every depth sample from their last node
        residual = torch.where(alive[:, None], target[rows, cur], residual)
        bonus = sample_from_probs(residual, uniforms[:, -1, -1])
    accepted = (path >= 0).sum(-1) - 1
    return WalkResult(path, accepted, bonus, absorbed)


def walk_same_as_ar(draws: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, mask: torch.Tensor,
                    node_tokens: torch.Tensor, depth: int, paths: torch.Tensor | None = None) -> WalkResult:
    """The AR-identical walk. draws (G, n+1): the token the target draws after each node (`sampling.race`
    with the position noise of the node's child position; the argmax when greedy); parents, depths (n+1,) or
    (G, n+1), root parent -1; mask (n+1, n+1) or (G, n+1, n+1) ancestor-or-self; node_tokens (G, n+1); `paths`
    (n+1, depth+1) the node ids from the root to each node of a static tree (else read off the mask). A node
    passes iff its token is its parent's draw; the accepted path ends at the deepest node whose ancestors all
    pass (siblings hold distinct tokens, so the passing nodes under the root form one chain); the bonus is that
    node's draw. Each image thus emits exactly the tokens AR draws for it. Fixed-trip tensor code, no host read."""
    G, n1 = node_tokens.shape
    device = node_tokens.device
    parents, depths = parents.expand(G, n1), depths.expand(G, n1)
    passes = node_tokens[:, 1:] == draws.gather(1, parents[:, 1:])  # (G, n) nodes 1..n against their parents' draws
    ok = ~(mask[..., 1:] & ~passes[:, None, :]).any(-1)  # (G, n+1): the node and every ancestor below the root pass
    end = torch.where(ok, depths, -1).argmax(-1)  # (G,) the deepest accepted node
    accepted = depths.gather(1, end[:, None])[:, 0]
    if paths is not None and paths.dim() == 2:
        path = paths[end]  # (G, depth+1)
    elif paths is not None:  # per tree (G, n+1, depth+1)
        path = paths.gather(1, end[:, None, None].expand(G, 1, paths.shape[-1]))[:, 0]
    else:
        gi = torch.arange(G, device=device)
        on_path = mask.expand(G, n1, n1)[gi, end]  # (G, n+1) ancestors-or-self of the end node
        steps = torch.arange(depth + 1, device=device)
        at_depth = on_path[:, None, :] & (depths[:, None, :] == steps[None, :, None])  # (G, depth+1, n+1)
        path = torch.where(at_depth.any(-1), at_depth.float().argmax(-1), -1)  # (G, depth+1)
    bonus = draws.gather(1, end[:, None])[:, 0]
    return WalkResult(path, accepted, bonus, None)


def relaxed_greedy_passes(scores: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, rule: Relaxation | None,
                          neighbors: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """LANTERN's greedy test for M candidates at once: scores (R, V) CFG-combined logits of the parents, rows
    (M,) each candidate's parent row, tokens (M,). A candidate passes iff it is the argmax of the target with
    its own probability raised to p~(x) (nothing zeroed). Argmax and softmax run once per parent row. Returns
    (passes (M,) bool, the mass it absorbed (M,): zero where the token is the argmax anyway and needed none)."""
    exact = tokens == scores.argmax(-1).index_select(0, rows)
    absorbed = torch.zeros(tokens.shape, device=scores.device)
    if rule is None or rule.k == 0:
        return exact, absorbed
    probs = scores.float().softmax(-1).index_select(0, rows)  # (M, V)
    mass = relax(probs, tokens, neighbors, rule)
    raised = probs.scatter(1, tokens[:, None], mass.probability[:, None])
    relaxed = ~exact & (raised.argmax(-1) == tokens)  # passes only thanks to the absorbed mass
    return exact | relaxed, torch.where(relaxed, mass.absorbed, absorbed)


def walk_longest_path(target: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, mask: torch.Tensor,
                      node_tokens: torch.Tensor, depth: int, rule: Relaxation | None,
                      neighbors: torch.Tensor | None) -> WalkResult:
    """Greedy verification of dynamic (EAGLE-2) trees as LANTERN's released code chooses among passing
    siblings: every node is tested against its parent's target (`relaxed_greedy_passes`), each root-to-leaf
    path accepts its longest passing prefix, and the path that accepts most wins, ties going to the leaf
    created first (the order of its retrieve rows), so a shallower leaf can beat a deeper sibling's branch.
    target (G, n+1, V) CFG-combined logits; parents, depths (G, n+1) (root parent -1); mask (G, n+1, n+1)
    ancestor-or-self; node_tokens (G, n+1). Fixed-trip tensor code, no host read."""
    G, n1, V = target.shape
    device = target.device
    gi = torch.arange(G, device=device)[:, None]
    parent = parents.clamp(min=0)  # (G, n+1)
    rows = (gi * n1 + parent).reshape(-1)  # (G*(n+1),) each node's parent row in target
    passes, absorbed = relaxed_greedy_passes(target.reshape(G * n1, V), rows, node_tokens.reshape(-1), rule, neighbors)
    passes, absorbed = passes.view(G, n1), absorbed.view(G, n1)
    passes[:, 0] = True  # the root is the last accepted token
    ok = passes.clone()
    for _ in range(depth):  # ok = the node and all its ancestors pass (parents precede children)
        ok = passes & ok.gather(1, parent)
    ok[:, 0] = True
    node_ids = torch.arange(n1, device=device)
    is_leaf = ~(parents[:, :, None] == node_ids).any(1)  # (G, n+1): no node names it as parent
    is_leaf[:, 0] = n1 == 1
    reach = torch.where(mask & ok[:, None, :], depths[:, None, :], torch.full_like(mask, -1, dtype=torch.long))
    accepted_by_leaf = reach.max(-1).values  # (G, n+1) longest passing prefix of each node's path
    score = torch.where(is_leaf, accepted_by_leaf * (n1 + 1) + (n1 - node_ids), torch.full_like(accepted_by_leaf, -1))
    best = score.argmax(-1)  # (G,) the winning leaf
    on_best = mask[gi[:, 0], best] & ok  # (G, n+1) accepted ancestors-or-self of the winning leaf
    end = torch.where(on_best, depths, torch.full_like(depths, -1)).argmax(-1)  # (G,) deepest accepted node
    accepted = depths.gather(1, end[:, None])[:, 0]
    steps = torch.arange(depth + 1, device=device)
    at_depth = on_best[:, None, :] & (depths[:, None, :] == steps[None, :, None])  # (G, depth+1, n+1)
    path = torch.where(at_depth.any(-1), at_depth.float().argmax(-1), torch.full((G, depth + 1), -1, device=device))
    taken = path[:, 1:].clamp(min=0)
    mass = torch.where(path[:, 1:] >= 0, absorbed.gather(1, taken), torch.zeros_like(absorbed[:, :depth]))
    bonus = target[gi[:, 0], end].argmax(-1)
    return WalkResult(path, accepted, bonus, mass.float())
