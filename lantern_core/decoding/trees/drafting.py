"""Drafting token trees with the EAGLE feature drafter: static trees (LANTERN++ / EAGLE-1: a fixed shape,
children sampled without replacement, or top-c when greedy) and the dynamic EAGLE-2 tree (top-k
expansion by cumulative drafter log-probability, pruned to the best `nodes`).

`DrafterSession` owns the drafter's KV cache for a batch's rows: `consume` appends accepted (feature, token)
pairs, `expand` runs tree nodes against the cached prefix plus their ancestors. Node distributions
come from the same CFG + filters the target uses, as log-probabilities: children are drawn without
replacement by a Gumbel race in the log domain, so a sibling after one that held almost all of q is
still drawn from q's true conditional, however far below float32's range its mass is. Verification is in
`trees/walk.py`; the decode loop in `trees/batch.py`. Everything stays on the device: no host syncs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ...models.drafter import EagleDrafter
from ...models.gpt import ForwardStep, ImageTransformer, additive_mask
from ...models.kv_cache import attention_mask, window_mask
from ..batching import per_row
from .prefix_states import drafter_key_valid
from .specs import TreeBuffers, TreeSpec, build_tree_buffers


class NodeDistribution(Protocol):
    """CFG + filters of one run (speculative.NodeDistributions): logits (rows, T, V) and the image-token
    index each of T predicts -> (G, T, V) per tree."""

    def log_probs(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """log of the sampling distribution; -inf where the filters remove a token."""

    def filtered(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """The filtered logits `log_probs` normalises (what a race needs)."""


@dataclass
class DraftTree:
    """G independent trees of n drafted nodes (one per image of the batch being decoded)."""

    tokens: torch.Tensor  # (G, n+1) long, node 0 = the root (last accepted token)
    parents: torch.Tensor  # (n+1,) or (G, n+1) long, -1 for the root
    depths: torch.Tensor  # (n+1,) or (G, n+1) long
    mask: torch.Tensor  # (n+1, n+1) or (G, n+1, n+1) bool, ancestor-or-self
    children: torch.Tensor | None  # (n+1, C) or (G, n+1, C) long node ids by rank, -1 padded (None: not built)
    depth: int
    log_q: torch.Tensor | None  # (G, n+1, V) log drafter law each node's children were drawn from; None = top-k
    widths: tuple[int, ...] | None = None  # static trees: most children a node at depth d has (the walk's trip)
    paths: torch.Tensor | None = None  # (n+1, depth+1) or (G, n+1, depth+1) node ids root -> each node, -1 padded


class DrafterSession:
    """The drafter's cache for the rows of G images ([cond G; uncond G] with CFG). Slot s holds pair
    (f_s, x_{s+1}).

    `length` (rows,) committed slots per row (rows of a batch advance independently) and `root_feature`
    are device buffers updated in place, so a captured iteration reads and writes the same memory on
    every replay. `known` mirrors the (common) length on the host while it is known there (after exact
    consumes of every row); forwards given an explicit `window` never need it. The keys it attends to
    follow the drafter's prefix convention (`prefix_states.drafter_key_valid`): the target's padding
    mask, shared, or none."""

    def __init__(self, drafter: EagleDrafter, rows: int, max_len: int, key_valid: torch.Tensor):
        self.drafter = drafter
        self.cache = drafter.allocate_cache(rows, max_len)
        # (rows, >= max_len) bool: the target's (shared) or all valid
        self.key_valid = drafter_key_valid(drafter.config.prefix_states, key_valid)
        device = key_valid.device
        self.length = torch.zeros(rows, dtype=torch.long, device=device)
        self.known: int | None = 0
        # f^ predicting the root's children
        self.root_feature = torch.zeros(rows, drafter.config.dim, dtype=self.cache.keys.dtype, device=device)
        self._last_row = drafter.rope_table.shape[0] - 1

    def keep_rows(self, rows: list[int], key_valid: torch.Tensor) -> "DrafterSession":
        """A session over the batch rows `rows` (ascending) of this one, its cache compacted in place
        (`KVCache.keep_rows`: this session must not be used after), with the target's `key_valid` (already
        selected) as its mask where its convention shares it."""
        index = torch.tensor(rows, dtype=torch.long, device=self.length.device)
        session = DrafterSession.__new__(DrafterSession)
        session.drafter, session.known = self.drafter, self.known
        session.key_valid = drafter_key_valid(self.drafter.config.prefix_states, key_valid)
        session.cache = self.cache.keep_rows(rows)
        session.length = self.length.index_select(0, index)
        session.root_feature = self.root_feature.index_select(0, index)
        session._last_row = self._last_row
        return session

    def reset(self, length: int = 0) -> None:
        self.length.fill_(length)
        self.known = length
        self.root_feature.zero_()

    def _window(self, extent: int, window: int | None) -> int:
        if window is not None:
            return window
        if self.known is None:
            raise ValueError("the drafter's length lives on the device only: pass a window")
        return self.known + extent

    def consume(self, features: torch.Tensor, tokens: torch.Tensor, embeddings: torch.Tensor | None = None,
                count: torch.Tensor | None = None, window: int | None = None,
                advance: torch.Tensor | None = None) -> None:
        """features (rows, T, dim), tokens (rows, T): append T accepted pairs, keep the last prediction.
        `embeddings` (rows, T, dim) replaces the token embeddings (see `prefix_inputs`). With `count` (a (1,)
        or per-row (rows,) device tensor, 1 <= count <= T) only the first `count` pairs of a row are real: all
        T are written (the rest land past the new length, stale), the prediction of pair count-1 is kept and
        the length grows by `count`; `window` (>= length + T for every row) is then the static extent attended
        over. `advance` (rows,), when given, replaces `count` as the growth of the length (0 freezes a row
        whose image is done)."""
        rows, T = tokens.shape
        kv_len = self._window(T, window)
        slots = self.length[:, None] + torch.arange(T, device=tokens.device)  # (rows, T)
        step = ForwardStep(slots.clamp(max=self._last_row), self.cache, kv_len=kv_len,
                           mask=attention_mask(self.key_valid, slots, kv_len), slots=slots)
        out = self.drafter(features, tokens, step, embeddings)  # (rows, T, dim)
        if count is None:
            self.root_feature.copy_(out[:, -1])
            self.length.add_(T)
            self.known = None if self.known is None else self.known + T
        else:
            last = (count.view(-1) - 1).expand(rows)  # (rows,)
            self.root_feature.copy_(out.gather(1, last[:, None, None].expand(rows, 1, out.shape[-1]))[:, 0])
            self.length.add_(count.view(-1) if advance is None else advance)
            self.known = None

    def tree_mask(self, ancestry: torch.Tensor, window: int | None = None) -> torch.Tensor:
        """(rows, 1, T, window) attention mask of T tree queries with ancestry (T, n) or (G, T, n) over nodes
        1..n: `expand` takes rows of it (a static tree builds it once per iteration for all its nodes)."""
        return window_mask(self.key_valid, self.length, ancestry, self._window(ancestry.shape[-1], window))

    def frame(self, extent: int, depth: int, window: int | None = None,
              steps: torch.Tensor | None = None) -> "DraftFrame":
        """Where a tree of `extent` drafter slots and `depth` levels goes past the committed length (made once
        per iteration, read by every level's `expand`); `window` as in `consume`; `steps` (>= max(extent,
        depth),) 0, 1, ... made once by a plan (else here)."""
        if steps is None:
            steps = torch.arange(max(extent, depth), device=self.length.device)
        base = self.length[:, None]  # (rows, 1)
        return DraftFrame(self._window(extent, window), (base + steps[:depth]).clamp(max=self._last_row),
                          base + steps[:extent])

    def expand(self, features: torch.Tensor, tokens: torch.Tensor, frame: "DraftFrame", depth: int,
               slots: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Run tree nodes: features/tokens (rows, T, ...), all at tree `depth`, written at cache `slots` (rows, T)
        (columns of `frame.slots`); `mask` (rows, 1, T, frame.kv_len) bool or additive (their rows of
        `tree_mask`, or an EAGLE-2 frontier's). Returns predicted features (rows, T, dim)."""
        rows, T = tokens.shape
        positions = frame.positions[:, depth - 1:depth].expand(rows, T)  # siblings share a RoPE row
        step = ForwardStep(positions, self.cache, kv_len=frame.kv_len, mask=mask, slots=slots)
        return self.drafter(features, tokens, step)


@dataclass(frozen=True)
class DraftFrame:
    """One iteration's drafted slots in the drafter cache: the keys attended over, the RoPE row of each tree
    depth and the cache slot of each tree slot, per row."""

    kv_len: int
    positions: torch.Tensor  # (rows, depth) RoPE row of the nodes at tree depth d + 1
    slots: torch.Tensor  # (rows, extent) cache slot of tree slot j (static trees: node j + 1)


def prefix_inputs(drafter: EagleDrafter, model, prefix_ids: torch.Tensor | None, first: torch.Tensor,
                  rows: int, T: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The drafter's x_{s+1} over a prefix of T slots whose last pair holds the first image code `first`
    (a 0-d or (1,) tensor): LlamaGen feeds code 0 over the condition (LANTERN's zeros); a prompted family
    feeds the target's embeddings of the next prompt tokens (LANTERN's Anole drafter sees the prompt).
    `first` may also hold one code per image (G,) of a batch. Returns (tokens (rows, T), embeddings (rows,
    T, dim) or None)."""
    tokens = torch.zeros(rows, T, dtype=torch.long, device=first.device)
    tokens[:, -1] = per_row(first.reshape(-1), rows)
    if prefix_ids is None:
        return tokens, None
    prompt = model.embed_prompt(prefix_ids[:, 1:])  # (rows, T-1, dim): embedding of token s+1 at slot s
    return tokens, torch.cat([prompt, drafter.embed_tokens(tokens[:, -1:]).to(prompt.dtype)], dim=1)


def sample_without_replacement(log_q: torch.Tensor, count: int, generator: torch.Generator | None,
                               noise: torch.Tensor | None = None) -> torch.Tensor:
    """log_q (P, V) -> (P, count) tokens drawn without replacement, in draw order: Gumbel-top-k in the
    log domain (log q - log E, E ~ Exp(1), torch's own race for multinomial, without leaving the log
    domain), so the k-th column is distributed as the k-th draw of sequential sampling from q, even
    where q is below float32's range. Tokens with log q = -inf come last (callers mark them invalid)."""
    if noise is None:  # else Exp(1) draws of shape log_q.shape, made before a captured step
        noise = torch.empty(log_q.shape, dtype=torch.float32, device=log_q.device).exponential_(generator=generator)
    # noise may be a strided (G, P / G, V) view of a larger table: its log is contiguous, so the reshape is a view
    return (log_q.float() - noise.log().reshape(log_q.shape)).topk(count, dim=-1).indices


@dataclass
class StaticPlan:
    """Per-depth index tensors of a static tree, built once per (tree, device)."""

    spec: TreeSpec
    buffers: TreeBuffers
    children: torch.Tensor  # (n+1, C)
    parents_at: list[torch.Tensor]  # depth d: node ids (at depth d-1) whose children are sampled
    nodes_at: list[torch.Tensor]  # depth d: node ids at depth d
    row_of: list[torch.Tensor]  # depth d: index into parents_at[d] of each node's parent
    rank_of: list[torch.Tensor]  # depth d: child rank of each node
    expand_at: list[torch.Tensor]  # depth d: node ids at depth d that have children
    width_at: list[int]  # depth d: most children any depth d-1 node has
    levels: list["ExpandLevel"]  # depth d: the constant indices of expanding expand_at[d]
    paths: torch.Tensor | None = None  # (n+1, depth+1) node ids from the root to each node, -1 padded
    law_nodes: torch.Tensor | None = None  # the nodes with children, level by level (the rows of `log_q` drafted)
    steps: torch.Tensor | None = None  # (max(n, depth),) 0, 1, ...: the drafter frame's offsets


@dataclass(frozen=True)
class ExpandLevel:
    """What a static tree's drafter level indexes with, made once per plan rather than every iteration."""

    parents: torch.Tensor  # (T,) the parent node of each expanded node
    rows: torch.Tensor  # (T,) each expanded node's row in the ancestry over nodes 1..n (node id - 1)
    positions: torch.Tensor  # (T,) its offset from the root's image-token index (1 + depth)
    in_level: torch.Tensor | None  # (T,) its place among nodes_at[d] (None: the first T, in order)
    parent_rows: torch.Tensor | None  # (T,) its parent's place among expand_at[d - 1], the previous level's
    # outputs (None: one parent each, in order)
    contiguous: bool = False  # `rows` is a run of consecutive rows (taken as a slice)
    first_row: int = 0  # its first row when contiguous


def plan_static_tree(spec: TreeSpec, device: torch.device) -> StaticPlan:
    b = build_tree_buffers(spec)
    n1 = b.parents.shape[0]
    widths = torch.bincount(b.parents[1:], minlength=n1)
    children = torch.full((n1, max(int(widths.max()), 1)), -1, dtype=torch.long)
    for node in range(1, n1):
        children[b.parents[node], b.ranks[node]] = node
    parents_at, nodes_at, row_of, rank_of, expand_at = [torch.empty(0)], [torch.zeros(1, dtype=torch.long)], [], [], []
    row_of.append(torch.empty(0)), rank_of.append(torch.empty(0))
    for d in range(1, spec.depth + 1):
        nodes = torch.nonzero(b.depths == d)[:, 0]
        parent_ids = torch.unique(b.parents[nodes])
        lookup = {int(p): i for i, p in enumerate(parent_ids)}
        parents_at.append(parent_ids)
        nodes_at.append(nodes)
        row_of.append(torch.tensor([lookup[int(b.parents[x])] for x in nodes], dtype=torch.long))
        rank_of.append(b.ranks[nodes])
    for d in range(spec.depth + 1):
        nodes = nodes_at[d]
        expand_at.append(nodes[widths[nodes] > 0])
    width_at = [0] + [int(r.max()) + 1 for r in rank_of[1:]]
    move = lambda xs: [x.to(device) for x in xs]  # noqa: E731
    levels = []
    for d, grow in enumerate(expand_at):
        in_level = torch.searchsorted(nodes_at[d], grow)  # nodes_at[d] is ascending
        parent_rows = row_of[d][in_level] if d else torch.zeros_like(grow)
        rows = (grow - 1).clamp(min=0)
        contiguous = rows.numel() > 0 and torch.equal(rows, torch.arange(int(rows[0]), int(rows[0]) + rows.numel()))
        levels.append(ExpandLevel(*move([b.parents[grow], rows, 1 + b.depths[grow]]),
                                  _unless_identity(in_level, device), _unless_identity(parent_rows, device),
                                  contiguous, int(rows[0]) if contiguous else 0))
    if not torch.equal(torch.cat(nodes_at), torch.arange(n1)):  # `TreeSpec` sorts its paths by depth
        raise ValueError(f"tree '{spec.name}': node ids must run depth by depth")
    paths = torch.full((n1, spec.depth + 1), -1, dtype=torch.long)
    for node in range(n1):
        for ancestor in torch.nonzero(b.mask[node])[:, 0].tolist():
            paths[node, int(b.depths[ancestor])] = ancestor
    buffers = TreeBuffers(*(t.to(device) for t in (b.parents, b.depths, b.ranks, b.mask, b.retrieve)))
    return StaticPlan(spec, buffers, children.to(device), move(parents_at), move(nodes_at), move(row_of),
                      move(rank_of), move(expand_at), width_at, levels, paths.to(device),
                      torch.cat(expand_at).to(device), torch.arange(max(n1 - 1, spec.depth), device=device))


def _unless_identity(index: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """None where taking `index` along a dimension would take its first len(index) entries in order (a slice)."""
    return None if torch.equal(index, torch.arange(index.numel())) else index.to(device)


def index_tensor(index: int | torch.Tensor, device: torch.device) -> torch.Tensor:
    """An image-token index (a Python int, or a () / (1,) device tensor) as a (1,) long tensor; per tree
    (G,) indices (trees of a batch at different positions) as (G, 1), so index + depths is (G, T)."""
    index = torch.as_tensor(index, device=device)
    return index.reshape(1) if index.numel() == 1 else index.reshape(-1, 1)


def draft_static(session: DrafterSession, target: ImageTransformer, plan: StaticPlan, root_tokens: torch.Tensor,
                 root_index: int | torch.Tensor, distribution: NodeDistribution, greedy: bool,
                 generator: torch.Generator | None, noise: list[torch.Tensor] | None = None,
                 window: int | None = None, keep_laws: bool = True) -> DraftTree:
    """Fill G static trees (root_tokens (G,)): children of each node sampled without replacement from its
    drafter distribution (top-c when greedy). root_index = image-token index of the root tokens (an int or
    a device tensor). `noise` (one (G, P_d, V) Exp(1) table per depth, P_d the depth's parents) replaces the
    per-depth draws from `generator`;
    `window` is the drafter's static attention extent (see `DrafterSession.expand`).

    Level by level: a level's parents are the previous level's expanded nodes in the same order, so each level
    reads the previous level's features and scores directly, and the tokens are stacked once at the end. With
    `keep_laws` (the residual and relaxed walks read them) a level races the drafter's log-probabilities and
    the laws are laid out per node once (`DraftTree.log_q`); without (greedy runs and the AR-identical walk) it
    races the filtered logits, whose normalisation never changes a race, and keeps no laws."""
    b = plan.buffers
    rows = session.root_feature.shape[0]
    G = root_tokens.shape[0]
    laws = keep_laws and not greedy
    score = distribution.log_probs if laws else distribution.filtered
    root_index = index_tensor(root_index, root_tokens.device)
    scores = score(target.logits(session.root_feature[:, None]), root_index + 1)  # (G, 1, V)
    kept = [scores]  # laws of the expanded nodes, level by level (root first)
    feats = session.root_feature[:, None]  # (rows, parents, dim): the previous level's outputs
    ancestry = b.mask[1:, 1:]  # (n, n) over nodes 1..n
    frame = session.frame(ancestry.shape[-1], plan.spec.depth, window, plan.steps)
    # (rows, 1, n, keys), additive: built once, each level takes its rows
    masks = additive_mask(session.tree_mask(ancestry, window), session.root_feature.dtype)
    pieces = [root_tokens[:, None]]
    for d in range(1, plan.spec.depth + 1):
        P, width = plan.parents_at[d].numel(), plan.width_at[d]
        flat = scores.reshape(G * P, -1)  # (G*P, V)
        drawn = flat.topk(width, dim=-1).indices if greedy else sample_without_replacement(
            flat, width, generator, None if noise is None else noise[d - 1])
        level_tokens = drawn.view(G, P, width)[:, plan.row_of[d], plan.rank_of[d]]  # (G, nodes at depth d)
        pieces.append(level_tokens)
        grow = plan.expand_at[d]
        if grow.numel():
            level = plan.levels[d]
            T = grow.numel()
            if level.parent_rows is None:
                parents = feats[:, :T]
            elif feats.shape[1] == 1:  # one parent for all (the root): a broadcast, no copy
                parents = feats.expand(-1, T, -1)
            else:
                parents = feats[:, level.parent_rows]
            fed = level_tokens[:, :T] if level.in_level is None else level_tokens[:, level.in_level]
            if level.contiguous:
                rows_at = slice(level.first_row, level.first_row + T)
                mask, slots = masks[:, :, rows_at], frame.slots[:, rows_at]
            else:
                mask, slots = masks[:, :, level.rows], frame.slots[:, level.rows]
            feats = session.expand(parents, per_row(fed, rows), frame, d, slots, mask)
            scores = score(target.logits(feats), root_index + level.positions)
            kept.append(scores)
    tokens = torch.cat(pieces, 1)  # (G, n+1): node ids run depth by depth (`plan_static_tree` checks)
    log_q = None
    if laws:  # -inf for leaves: they have no children
        log_q = scores.new_full((G, tokens.shape[1], scores.shape[-1]), float("-inf"))
        log_q.index_copy_(1, plan.law_nodes, torch.cat(kept, 1))
    return DraftTree(tokens, b.parents, b.depths, b.mask, plan.children, plan.spec.depth, log_q,
                     tuple(plan.width_at[1:]), plan.paths)


@dataclass(frozen=True)
class DynamicShape:
    depth: int = 5  # drafted levels (EAGLE-2's `depth` + 1)
    top_k: int = 10  # children per expanded node and frontier width
    nodes: int = 58  # drafted nodes kept for verification (EAGLE-2's total_token - 1)


@dataclass(frozen=True)
class DynamicPlan:
    """The constant index tensors of an EAGLE-2 shape on one device, made once, outside any captured step.

    The candidate pool is laid out level by level: level 1 holds the root's top-k (ids 0 .. K-1); level L >= 2
    the top-k children of each of the K frontier nodes it expands, parent by parent (ids K + (L-2) K^2 + k K + c).
    So an entry's depth, and the row of its parent in the table of frontier paths (row 0 the root, row
    1 + (L-2) K + k the k-th node expanded at level L), follow from its id alone."""

    shape: DynamicShape
    steps: torch.Tensor  # (D K,) 0, 1, ...: tree slots (also the depth offsets)
    pool_depth: torch.Tensor  # (pool,) each entry's depth
    parent_row: torch.Tensor  # (pool,) its parent's row in the table of frontier paths
    first_paths: torch.Tensor  # (1, K, D) the pool-id paths of level 1's entries: own id at depth 1, -1 after
    root_path: torch.Tensor  # (1, 1, D) the root's: -1 (the root is no pool entry)
    zero: torch.Tensor  # (1, 1) long 0: the root's node id, depth and path start
    no_parent: torch.Tensor  # (1, 1) long -1
    node_ids: torch.Tensor  # (n+1,) 0 .. n


def plan_dynamic_tree(shape: DynamicShape, device: torch.device) -> DynamicPlan:
    K, D = shape.top_k, shape.depth
    pool = torch.arange(K + (D - 1) * K * K)
    later = (pool - K).clamp(min=0)  # (pool,) place past level 1
    first = torch.full((1, K, D), -1, dtype=torch.long)
    first[0, :, 0] = torch.arange(K)
    consts = (torch.arange(max(D * K, D + 1)), torch.where(pool < K, 1, 2 + later // (K * K)),
              torch.where(pool < K, 0, 1 + later // K), first, torch.full((1, 1, D), -1, dtype=torch.long),
              torch.zeros(1, 1, dtype=torch.long), torch.full((1, 1), -1, dtype=torch.long),
              torch.arange(shape.nodes + 1))
    return DynamicPlan(shape, *(t.to(device) for t in consts))


def draft_dynamic(session: DrafterSession, target: ImageTransformer, plan: DynamicPlan, root_tokens: torch.Tensor,
                  root_index: int | torch.Tensor, distribution: NodeDistribution, window: int | None = None,
                  with_children: bool = True) -> DraftTree:
    """EAGLE-2 for G trees (root_tokens (G,)): expand the top-k frontier by cumulative log-probability, then
    keep the best `nodes` of every tree. `root_index` and `window` as in `draft_static`; `with_children` builds
    the child table (the walks that read it: sampled residual and relaxed rules).

    Per level the frontier's attention mask is its parents' plus its own slots (additive masks, one `maximum`),
    and each frontier node's path of pool ids is its parent's plus itself; the kept nodes' paths then give
    depths, parents and ancestry in a few gathers, with no loop over depth."""
    shape = plan.shape
    K, D, n = shape.top_k, shape.depth, shape.nodes
    rows, dim = session.root_feature.shape
    G = root_tokens.shape[0]
    c = rows // G  # rows are [cond trees; uncond trees] with CFG
    frame = session.frame(D * K, D, window, plan.steps)
    W = frame.kv_len
    # (1 | G, D): the image-token index a node at depth d predicts (root_index + d + 1)
    indices = index_tensor(root_index, root_tokens.device) + plan.steps[1:D + 1]
    keys = torch.arange(W, device=root_tokens.device)
    prefix = session.key_valid[:, :W] & (keys < session.length[:, None])  # (rows, W)
    # (rows, D K, W): each tree slot sees the valid prefix and itself; a frontier adds its parents' ancestry
    visible = additive_mask((keys == frame.slots[:, :, None]) | prefix[:, None], session.root_feature.dtype)
    logq = distribution.log_probs(target.logits(session.root_feature[:, None]), indices[..., :1])[:, 0]  # (G, V)
    score, tok = logq.topk(K, dim=-1)  # (G, K)
    pool_tok, pool_score = [tok], [score]
    feats = session.root_feature[:, None].expand(rows, K, dim)
    mask = visible[:, None, :K]  # (rows, 1, K, W) the first frontier's
    paths = plan.first_paths.expand(G, K, D)  # (G, K, D) pool ids from depth 1 to each frontier node
    tables = [plan.root_path.expand(G, 1, D)]  # the root's and each expanded frontier's paths
    created = K
    for level in range(2, D + 1):
        lo = (level - 2) * K  # this frontier's tree slots
        out = session.expand(feats, per_row(tok, rows), frame, level - 1, frame.slots[:, lo:lo + K], mask)
        tables.append(paths)
        at = indices[..., level - 1:level].expand(*indices.shape[:-1], K)  # (K,) or (G, K)
        child = distribution.log_probs(target.logits(out), at)  # (G, K, V)
        c_score, c_tok = child.topk(K, dim=-1)  # (G, K, K) log-probabilities
        c_score = (score[..., None] + c_score).reshape(G, K * K)  # cumulative
        c_tok = c_tok.reshape(G, K * K)
        pool_tok.append(c_tok), pool_score.append(c_score)
        if level == D:  # the last level's frontier is never expanded
            break
        score, best = c_score.topk(K, dim=-1)  # the next frontier (G, K)
        tok = c_tok.gather(1, best)
        parent = best // K  # (G, K) each one's place in this frontier
        feats = out.view(c, G, K, dim).gather(2, parent[None, ..., None].expand(c, G, K, dim)).view(rows, K, dim)
        inherited = mask.view(c, G, K, W).gather(2, parent[None, ..., None].expand(c, G, K, W)).view(rows, 1, K, W)
        mask = torch.maximum(inherited, visible[:, None, lo + K:lo + 2 * K])
        paths = paths.gather(1, parent[..., None].expand(G, K, D))
        paths[:, :, level - 1] = created + best
        created += K * K
    all_tok, all_score = torch.cat(pool_tok, 1), torch.cat(pool_score, 1)  # (G, pool)
    # keep the best `nodes`; a stable sort puts a parent (created first, score >= child) before its children
    keep = torch.sort(all_score, dim=1, descending=True, stable=True).indices[:, :n]
    keep = torch.sort(keep, dim=1).values  # (G, n) creation order: parents precede children
    depth = plan.pool_depth[keep]  # (G, n)
    column = (depth - 1)[..., None]  # (G, n, 1) a node's own column in a path over depths 1 .. D
    parent_paths = torch.cat(tables, 1).gather(1, plan.parent_row[keep][..., None].expand(G, n, D))  # (G, n, D)
    ids = parent_paths.scatter_(2, column, keep[..., None])  # each kept node's path of pool ids
    # pool ids -> node ids 1 .. n (every ancestor is kept, and `keep` is ascending); -1 past the node's depth
    nodes = torch.where(ids >= 0, torch.searchsorted(keep, ids.view(G, n * D)).view(G, n, D) + 1, ids)
    node_paths = torch.cat([plan.zero.expand(G, n + 1, 1),
                            torch.cat([plan.root_path.expand(G, 1, D), nodes], 1)], 2)  # (G, n+1, D+1) root first
    depths = torch.cat([plan.zero.expand(G, 1), depth], 1)  # (G, n+1)
    parents = torch.cat([plan.no_parent.expand(G, 1), node_paths[:, 1:].gather(2, column)[..., 0]], 1)  # (G, n+1)
    # node i is an ancestor-or-self of node j iff j's path holds i at i's depth
    mask = node_paths.gather(2, depths[:, None, :].expand(G, n + 1, n + 1)) == plan.node_ids  # (G, n+1, n+1)
    tokens = torch.cat([root_tokens[:, None], all_tok.gather(1, keep)], 1)
    children = children_by_rank(parents, all_score.gather(1, keep), K) if with_children else None
    return DraftTree(tokens, parents, depths, mask, children, D, None, paths=node_paths)


def children_by_rank(parents: torch.Tensor, score: torch.Tensor, width: int) -> torch.Tensor:
    """(G, n+1, width) node ids of each node's children, best cumulative score first, -1 padded, from per-tree
    parents (G, n+1) (root -1) and the scores (G, n) of nodes 1..n."""
    device = parents.device
    G, n = score.shape
    gi = torch.arange(G, device=device)[:, None]
    by_score = torch.sort(score, dim=1, descending=True, stable=True).indices
    par = parents[:, 1:]
    order = by_score.gather(1, torch.sort(par.gather(1, by_score), dim=1, stable=True).indices)  # (G, n)
    sp = par.gather(1, order)
    counts = torch.zeros(G, n + 1, dtype=torch.long, device=device).scatter_add_(1, par, torch.ones_like(par))
    starts = counts.cumsum(1) - counts
    rank = torch.arange(n, device=device) - starts.gather(1, sp)
    children = torch.full((G, n + 1, width), -1, dtype=torch.long, device=device)
    children[gi, sp, rank] = order + 1
    return children
