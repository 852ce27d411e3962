"""The step-by-step speculative decoder as it was before the static-shape iteration, kept as a test oracle:
Python-int cache lengths, exact key extents, an accepted path of exactly the accepted length, and the
drafter fed only the accepted pairs, all built from the library's dynamic-length primitives. Tokens only
(no stats); one image at a time with its own generator."""
from __future__ import annotations

import torch

from lantern_core.conditioning import build_prefix
from lantern_core.decoding.generate import prefill
from lantern_core.decoding.sampling import NodeDistributions, pick_tokens
from lantern_core.decoding.trees.attention import commit_path
from lantern_core.decoding.batching import per_row
from lantern_core.decoding.trees.drafting import (DrafterSession, DraftTree, DynamicShape, NodeDistribution,
                                                  draft_dynamic, draft_static, index_tensor,
                                                  plan_dynamic_tree, plan_static_tree, prefix_inputs,
                                                  sample_without_replacement)
from lantern_core.decoding.acceptance.position_noise import PositionNoise
from lantern_core.decoding.trees.iteration import tree_positions, verify_tree
from lantern_core.layout import extend_neighbors
from lantern_core.models.kv_cache import window_mask


@torch.no_grad()
def reference_tokens(model, drafter, condition, sampling, spec, generator, neighbors=None) -> torch.Tensor:
    """(N,) tokens of one image (`condition` of batch 1)."""
    N = model.config.num_image_tokens
    guided = sampling.uses_cfg
    dist = NodeDistributions(sampling, guided, model.constrain_logits)
    plan = None if spec.tree == "dynamic" else plan_static_tree(spec.static_tree, torch.device("cpu"))
    dynamic_plan = plan_dynamic_tree(spec.dynamic, torch.device("cpu")) if plan is None else None
    neighbors = extend_neighbors(model.config, neighbors)
    prefix = build_prefix(model, condition, guided)
    rows, T = prefix.key_valid.shape
    max_len = T + N + spec.cache_spare
    cache = model.allocate_cache(rows, max_len)
    key_valid = torch.empty(rows, max_len, dtype=torch.bool)
    hidden = prefill(model, prefix, cache, key_valid)
    first = pick_tokens(dist.combine(model.logits(hidden[:, -1:]), torch.zeros(1, dtype=torch.long))[:, 0],
                        sampling, generator)
    out = [int(first[0])]
    depth, width = (spec.dynamic.depth, spec.dynamic.top_k) if plan is None else (plan.spec.depth, plan.children.shape[-1])
    table = None if sampling.greedy else torch.rand(N, 1, depth, width + 1, generator=generator)  # every walk's, up front
    positions = PositionNoise.of(generator, 1, N + depth + 2, model.config.vocab_size, "cpu")
    session = DrafterSession(drafter, rows, max_len, key_valid)
    fed, embeddings = prefix_inputs(drafter, model, prefix.token_ids, first[:1], rows, T)
    session.consume(hidden, fed, embeddings)
    length = T
    iteration = 0
    while len(out) < N:
        done = len(out)
        root = torch.tensor([out[-1]])
        if plan is not None:
            noise = None  # a sampled tree's children race with the position noise of their positions
            if not sampling.greedy:
                exp = positions.exp_at(tree_positions(done - 1, plan.spec.depth, torch.device("cpu")))
                noise = [exp[:, d - 1:d].expand(-1, plan.parents_at[d].numel(), -1)
                         for d in range(1, plan.spec.depth + 1)]
            tree = draft_static(session, model, plan, root, done - 1, dist, sampling.greedy, generator, noise)
        else:
            tree = draft_dynamic(session, model, dynamic_plan, root, done - 1, dist)
        uniforms = None if table is None else table[iteration]
        iteration += 1
        check = verify_tree(model, cache, key_valid, length, tree, dist, spec, generator, neighbors, done - 1, uniforms)
        accepted = int(check.walk.accepted[0])
        path = check.walk.path[0, : accepted + 1]
        new = torch.cat([tree.tokens[0, path[1:]], check.walk.bonus[:1]])
        out.extend(new.tolist()[: N - done])
        length = commit_path(cache, length, path)
        session.consume(check.hidden[:, path], new[None].expand(rows, -1))
    return torch.tensor(out)


def reference_draft_static(session, target, plan, root_tokens, root_index, distribution, greedy, generator, noise=None,
                           window=None):
    """The static-tree drafting as it was written first, kept as an oracle for `draft_static`: per-node tables of
    tokens, features and drafter laws, every level indexing them by node id (the parents' laws, the expanded
    nodes' features and tokens). Returns the DraftTree's tokens (G, n+1) and laws (G, n+1, V) (None greedy)."""
    b = plan.buffers
    n1 = b.parents.shape[0]
    rows, dim = session.root_feature.shape
    G = root_tokens.shape[0]
    device = root_tokens.device
    tokens = torch.zeros(G, n1, dtype=torch.long, device=device)
    tokens[:, 0] = root_tokens
    feats = session.root_feature.new_zeros(rows, n1, dim)
    feats[:, 0] = session.root_feature
    root_index = index_tensor(root_index, device)
    root_q = distribution.log_probs(target.logits(session.root_feature[:, None]), root_index + 1)
    log_q = root_q.new_full((G, n1, root_q.shape[-1]), float("-inf"))
    log_q[:, 0] = root_q[:, 0]
    ancestry = b.mask[1:, 1:]
    masks = session.tree_mask(ancestry, window)
    frame = session.frame(ancestry.shape[-1], plan.spec.depth, window)
    for d in range(1, plan.spec.depth + 1):
        parents, nodes, width = plan.parents_at[d], plan.nodes_at[d], plan.width_at[d]
        qp = log_q[:, parents].reshape(G * parents.numel(), -1)  # (G*P, V)
        drawn = qp.topk(width, dim=-1).indices if greedy else sample_without_replacement(
            qp, width, generator, None if noise is None else noise[d - 1])
        tokens[:, nodes] = drawn.view(G, parents.numel(), width)[:, plan.row_of[d], plan.rank_of[d]]
        grow = plan.expand_at[d]
        if grow.numel():
            level = plan.levels[d]
            out = session.expand(feats[:, level.parents], per_row(tokens[:, grow], rows), frame, d,
                                 frame.slots[:, grow - 1], masks[:, :, level.rows])
            feats[:, grow] = out
            log_q[:, grow] = distribution.log_probs(target.logits(out), root_index + level.positions)
    return tokens, None if greedy else log_q


def reference_draft_dynamic(session: DrafterSession, target, shape: DynamicShape, root_tokens: torch.Tensor,
                  root_index: int | torch.Tensor, distribution: NodeDistribution,
                  window: int | None = None) -> DraftTree:
    """EAGLE-2 drafting as it was written first, kept as an oracle for `draft_dynamic`: each level rebuilds its
    attention mask from the frontier's ancestry over tree slots, every pool entry records its parent, and the
    tree's depths, ancestry and child table are settled by D rounds of pointer chasing over the kept entries."""
    K, D = shape.top_k, shape.depth
    rows, dim = session.root_feature.shape
    G = root_tokens.shape[0]
    device = root_tokens.device
    gi = torch.arange(G, device=device)[:, None]
    root_index = index_tensor(root_index, device)
    logq = distribution.log_probs(target.logits(session.root_feature[:, None]), root_index + 1)[:, 0]  # (G, V)
    score, tok = logq.topk(K, dim=-1)  # (G, K)
    pool_tok, pool_score = [tok], [score]
    pool_parent = [torch.full((G, K), -1, dtype=torch.long, device=device)]  # pool index of the parent, -1 root
    ranks = torch.arange(K, device=device)  # made on the step's device: a CPU index would sync (and fail capture)
    frontier = ranks.expand(G, K)  # pool ids of the frontier
    feat_in = session.root_feature[:, None].expand(rows, K, dim)
    # over drafter tree slots; a node sees itself: written as the device's own K x K identity, since a Python
    # True through an index would be a CPU tensor copied to the device (a sync, and refused by capture)
    itself = torch.eye(K, dtype=torch.bool, device=device)  # (K, K)
    ancestry = torch.zeros(G, K, D * K, dtype=torch.bool, device=device)
    ancestry[:, :, :K] = itself
    created = K
    for level in range(2, D + 1):
        slots = torch.arange((level - 2) * K, (level - 1) * K, device=device)  # this frontier's slots
        frame = session.frame(D * K, D, window)
        mask = window_mask(session.key_valid, session.length, ancestry, frame.kv_len)
        out = session.expand(feat_in, per_row(tok, rows), frame, level - 1, frame.slots[:, slots], mask)
        child = distribution.log_probs(target.logits(out), (root_index + level).expand(*root_index.shape[:-1], K))
        c_score, c_tok = child.topk(K, dim=-1)  # (G, K, K) log-probabilities
        c_score = (score[..., None] + c_score).reshape(G, K * K)  # cumulative
        c_tok = c_tok.reshape(G, K * K)
        pool_tok.append(c_tok), pool_score.append(c_score)
        pool_parent.append(frontier[..., None].expand(G, K, K).reshape(G, K * K))  # each parent K times
        best = c_score.topk(K, dim=-1).indices  # next frontier, (G, K)
        frontier = created + best
        created += K * K
        parent_slot = best // K  # (G, K) index into the current frontier
        score, tok = c_score.gather(1, best), c_tok.gather(1, best)
        feat_in = out.gather(1, per_row(parent_slot, rows)[..., None].expand(-1, -1, dim))
        ancestry = ancestry[gi, parent_slot]  # (G, K, D*K): inherit the parent's ancestors
        ancestry[:, :, (level - 1) * K:level * K] |= itself
    all_tok, all_score, all_parent = torch.cat(pool_tok, 1), torch.cat(pool_score, 1), torch.cat(pool_parent, 1)
    # keep the best `nodes`; a stable sort puts a parent (created first, score >= child) before its children
    keep = torch.sort(-all_score, dim=1, stable=True).indices[:, : shape.nodes]
    keep = torch.sort(keep, dim=1).values  # creation order: parents precede children
    return _reference_tree_from_pool(root_tokens, all_tok.gather(1, keep), all_score.gather(1, keep),
                           all_parent.gather(1, keep), keep, created, K, D)


def _reference_tree_from_pool(root_tokens: torch.Tensor, tok: torch.Tensor, score: torch.Tensor, parent_pool: torch.Tensor,
                    pool_ids: torch.Tensor, pool_size: int, K: int, D: int) -> DraftTree:
    """Kept pool entries (G, n) in creation order -> tree tensors with per-tree parents, depths, mask, children."""
    device = tok.device
    G, n = tok.shape
    gi = torch.arange(G, device=device)[:, None]
    node_of_pool = torch.zeros(G, pool_size, dtype=torch.long, device=device)
    node_of_pool[gi, pool_ids] = torch.arange(1, n + 1, device=device).expand(G, n)
    parents = torch.cat([torch.full((G, 1), -1, dtype=torch.long, device=device),
                         torch.where(parent_pool >= 0, node_of_pool.gather(1, parent_pool.clamp(min=0)), 0)], 1)
    depths = torch.zeros(G, n + 1, dtype=torch.long, device=device)
    eye = torch.eye(n + 1, dtype=torch.bool, device=device)
    mask = eye.expand(G, -1, -1).clone()
    for _ in range(D):  # D rounds settle depth and ancestry (parents precede children)
        depths[:, 1:] = depths.gather(1, parents[:, 1:]) + 1
        mask[:, 1:] = mask[gi, parents[:, 1:]] | eye[1:]
    # children by rank: order by parent, then by score (best first)
    by_score = torch.sort(-score, dim=1, stable=True).indices
    par = parents[:, 1:]
    order = by_score.gather(1, torch.sort(par.gather(1, by_score), dim=1, stable=True).indices)  # (G, n)
    sp = par.gather(1, order)
    counts = torch.zeros(G, n + 1, dtype=torch.long, device=device).scatter_add_(1, par, torch.ones_like(par))
    starts = counts.cumsum(1) - counts
    rank = torch.arange(n, device=device) - starts.gather(1, sp)
    children = torch.full((G, n + 1, K), -1, dtype=torch.long, device=device)
    children[gi, sp, rank] = order + 1
    tokens = torch.cat([root_tokens[:, None], tok], 1)
    return DraftTree(tokens, parents, depths, mask, children, D, None)
