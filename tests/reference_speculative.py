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
from lantern_core.decoding.trees.drafting import (DrafterSession, draft_dynamic, draft_static, index_tensor,
                                                  plan_static_tree, prefix_inputs, sample_without_replacement)
from lantern_core.decoding.trees.iteration import verify_tree
from lantern_core.layout import extend_neighbors


@torch.no_grad()
def reference_tokens(model, drafter, condition, sampling, spec, generator, neighbors=None) -> torch.Tensor:
    """(N,) tokens of one image (`condition` of batch 1)."""
    N = model.config.num_image_tokens
    guided = sampling.uses_cfg
    dist = NodeDistributions(sampling, guided, model.constrain_logits)
    plan = None if spec.tree == "dynamic" else plan_static_tree(spec.static_tree, torch.device("cpu"))
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
    session = DrafterSession(drafter, rows, max_len, key_valid)
    fed, embeddings = prefix_inputs(drafter, model, prefix.token_ids, first[:1], rows, T)
    session.consume(hidden, fed, embeddings)
    length = T
    iteration = 0
    while len(out) < N:
        done = len(out)
        root = torch.tensor([out[-1]])
        if plan is not None:
            tree = draft_static(session, model, plan, root, done - 1, dist, sampling.greedy, generator)
        else:
            tree = draft_dynamic(session, model, spec.dynamic, root, done - 1, dist)
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
    for d in range(1, plan.spec.depth + 1):
        parents, nodes, width = plan.parents_at[d], plan.nodes_at[d], plan.width_at[d]
        qp = log_q[:, parents].reshape(G * parents.numel(), -1)  # (G*P, V)
        drawn = qp.topk(width, dim=-1).indices if greedy else sample_without_replacement(
            qp, width, generator, None if noise is None else noise[d - 1])
        tokens[:, nodes] = drawn.view(G, parents.numel(), width)[:, plan.row_of[d], plan.rank_of[d]]
        grow = plan.expand_at[d]
        if grow.numel():
            level = plan.levels[d]
            out = session.expand(feats[:, level.parents], per_row(tokens[:, grow], rows), d, grow, ancestry, window,
                                 masks[:, :, level.rows])
            feats[:, grow] = out
            log_q[:, grow] = distribution.log_probs(target.logits(out), root_index + level.positions)
    return tokens, None if greedy else log_q
