"""The static-shape speculative iteration over draft trees for a batch of G images: draft (one drafter
forward per level for all G trees), verify (one target forward over every tree), walk, commit each
accepted path, feed them to the drafter, all with every value that changes between iterations held in
device tensors.

`TreeState` holds what an iteration reads and writes (both KV caches, the committed length of every cache
row, the image tokens done per image, the output buffers padded by two tree paths, the noise the iteration
consumes and the run counters). Images advance independently; one that is done rides along with its length
frozen until the batch ends (or leaves the batch, `TreeState.select`, on devices that run eagerly). `tree_iteration` changes shapes only with `TreeShape` and the `TreeWindows` it is given,
never reads the host and never branches on a tensor value, so one call runs eagerly, under
`torch.compile(fullgraph=True)` or replayed from a CUDA graph (`step_graphs.py`). Accepted paths have a
fixed size (depth + 1, padded past the accepted count): the padded tail is written where the next
iteration overwrites it. The drafter's and the target's races hash the position noise of the image's seed
inside the step (`acceptance/position_noise.py`: a function of the seed, the image and the position alone); the
residual and relaxed walks' uniforms are drawn once per image before its first iteration
(`sampling.fill_per_image`: one row per iteration the image can take, picked inside the iteration by the image's
own counter), so no iteration calls a generator, the same seed gives the same tokens eagerly and captured, and
image g draws what a single run of it draws. The decode loop and prefill are in `trees/batch.py`, the tree choice in `trees/auto.py`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...config import SamplingConfig
from ...models.drafter import EagleDrafter
from ...models.gpt import ImageTransformer
from ...models.kv_cache import KVCache, keep_rows
from ..acceptance.relaxation import Relaxation, relaxes
from ..batching import per_row, row_list
from ..acceptance.position_noise import PositionNoise, race_dtype
from ..sampling import race
from ..acceptance.seed_identity import uses_same_as_ar
from ..step_graphs import SLOT_BUCKET, band_starts, band_window
from .attention import commit_padded_path, forward_tree
from .drafting import (DrafterSession, DraftTree, DynamicPlan, DynamicShape, NodeDistribution, StaticPlan,
                       draft_dynamic, draft_static, index_tensor, plan_dynamic_tree)
from .specs import TreeSpec
from .walk import WalkResult, walk_longest_path, walk_same_as_ar, walk_tree


@dataclass(frozen=True)
class TreeShape:
    """What fixes an iteration's tensor shapes and code: rows (G images, [cond G; uncond G] with CFG), cache
    slots, image tokens, the sampling settings and acceptance rule it bakes in, and the tree (a static
    `TreeSpec` or EAGLE-2's `DynamicShape`)."""

    rows: int
    slots: int
    image_tokens: int
    sampling: SamplingConfig
    tree: TreeSpec | DynamicShape
    relaxation: Relaxation | None = None
    exact_rule: str = "same_as_ar"

    @property
    def same_as_ar(self) -> bool:
        """Whether the iteration draws with position noise and accepts only AR's own draws (`uses_same_as_ar`)."""
        return uses_same_as_ar(self, self.sampling)

    @property
    def walk_uniforms(self) -> bool:
        """Whether the walk draws uniforms (the residual and relaxed rules when sampling): only then does the
        state hold a row of them per iteration."""
        return not self.sampling.greedy and not self.same_as_ar

    @property
    def dynamic(self) -> bool:
        return isinstance(self.tree, DynamicShape)

    @property
    def sampled_drafts(self) -> bool:
        """Whether the drafter samples its children (static trees, not greedy), racing with the position noise of
        each child's position under every rule: a position's noise decides drafts until the walk judges it,
        and a judged position is committed, so its noise never meets a verdict twice."""
        return not self.dynamic and not self.sampling.greedy

    @property
    def trees(self) -> int:
        """G: images decoded together, one tree each."""
        return self.rows // 2 if self.sampling.uses_cfg else self.rows

    @property
    def depth(self) -> int:
        return self.tree.depth

    @property
    def nodes(self) -> int:
        """Drafted nodes verified per iteration (root excluded)."""
        return self.tree.nodes if self.dynamic else self.tree.num_nodes

    @property
    def draft_slots(self) -> int:
        """Drafter cache slots the drafted tree occupies past the committed length."""
        return self.tree.depth * self.tree.top_k if self.dynamic else self.tree.num_nodes


@dataclass(frozen=True)
class TreeWindows:
    """Keys each forward of one iteration attends over; one captured graph per distinct value. `start` is
    the smallest committed length these windows serve (capture warms up there)."""

    start: int
    draft: int  # drafter over the tree: >= length + draft_slots
    verify: int  # target over the tree: >= length + nodes + 1
    consume: int  # drafter over the accepted path: >= length + depth + 1


def tree_windows(length: int, shape: TreeShape, exact: bool, whole: bool = False) -> TreeWindows:
    """Windows for an iteration at committed `length`: exactly the keys each forward needs (`exact`, for
    devices that never capture: the step-by-step decoder's own shapes), the whole cache (`whole`: one variant
    for an Inductor-compiled iteration), or those rounded so that one variant serves every length of a
    `SLOT_BUCKET`-wide band (a few graphs per image)."""
    extents = (shape.draft_slots, shape.nodes + 1, shape.depth + 1)
    if exact:
        return TreeWindows(length, *(length + e for e in extents))
    if whole:
        return TreeWindows(0, shape.slots, shape.slots, shape.slots)
    return TreeWindows(length // SLOT_BUCKET * SLOT_BUCKET, *(band_window(length, e, shape.slots) for e in extents))


def band_windows(shape: TreeShape) -> list[TreeWindows]:
    """Every bucketed variant an iteration in a cache of `shape.slots` slots can use (one graph each),
    whatever the prefix length: one per band up to the last length at which the largest forward fits."""
    last = shape.slots - max(shape.draft_slots, shape.nodes + 1, shape.depth + 1)
    return [tree_windows(start, shape, exact=False) for start in band_starts(last)]


@dataclass
class TreeState:
    """The static tensors of one tree run shape (G images), allocated once and reused across batches. Each
    image advances on its own: its rows' committed length, its tokens done, its tree and counters. An image
    that is done keeps running in the batch (static shapes) with its length frozen where its last
    iteration started, so its writes stay inside the cache; nothing it computes is kept or counted."""

    cache: KVCache  # target (L, rows, H_kv, slots, D)
    key_valid: torch.Tensor  # (rows, slots) bool: False on padded prefix slots
    session: DrafterSession  # drafter cache, its per-row length and root feature
    length: torch.Tensor  # (rows,) long: committed target slots per row (= the drafter's)
    done: torch.Tensor  # (G,) long: image tokens decoded (the root of the next tree is tokens[g, done - 1])
    tokens: torch.Tensor  # (G, N + 2 (depth + 1)) long: the images, padded by two paths
    per_cell: torch.Tensor  # (G, N + 2 (depth + 1)) int32: tokens accepted by the forward that produced each cell
    position: PositionNoise  # each image's position noise (bases (G, N + 2 (depth + 1))), filled per run
    uniforms: torch.Tensor  # (G, N, depth, C + 1) the walk's uniforms per image, row t for its iteration t (one row
    # when the walk draws none: `TreeShape.walk_uniforms`)
    iteration: torch.Tensor  # (G,) long iterations each image has taken (its row of `uniforms`)
    neighbors: torch.Tensor | None  # (V, k) relaxation table, copied in before each batch
    histogram: torch.Tensor  # (G, depth + 1) long: iterations by drafted tokens accepted, per image
    by_node: torch.Tensor  # (n + 1,) long: acceptances per static-tree node (unused for EAGLE-2)
    absorbed: torch.Tensor  # (2,) float32: relaxed mass summed and max over accepted tokens
    relaxed: torch.Tensor  # () long: accepted tokens that used absorbed mass
    forwards_per_iteration: int = 0  # drafter forwards one iteration runs

    @classmethod
    def allocate(cls, model: ImageTransformer, drafter: EagleDrafter, shape: TreeShape, plan: StaticPlan | None,
                 neighbors: torch.Tensor | None) -> "TreeState":
        device = model.tok_embeddings.weight.device
        key_valid = torch.ones(shape.rows, shape.slots, dtype=torch.bool, device=device)
        session = DrafterSession(drafter, shape.rows, shape.slots, key_valid)
        V, G = model.config.vocab_size, shape.trees
        width = shape.tree.top_k if shape.dynamic else plan.children.shape[-1]
        padded = shape.image_tokens + 2 * (shape.depth + 1)
        levels = shape.depth - 1 if shape.dynamic else sum(1 for g in plan.expand_at[1:] if g.numel())
        long = dict(dtype=torch.long, device=device)
        return cls(
            cache=model.allocate_cache(shape.rows, shape.slots), key_valid=key_valid, session=session,
            length=torch.zeros(shape.rows, **long), done=torch.ones(G, **long), tokens=torch.zeros(G, padded, **long),
            per_cell=torch.ones(G, padded, dtype=torch.int32, device=device),
            position=PositionNoise.allocate(G, padded, V, device),  # root + depth + 1 < N + 2 (depth + 1)
            uniforms=torch.full((G, shape.image_tokens if shape.walk_uniforms else 1, shape.depth, width + 1), 0.5,
                                device=device),
            iteration=torch.zeros(G, **long),
            neighbors=None if neighbors is None else torch.zeros_like(neighbors),
            histogram=torch.zeros(G, shape.depth + 1, **long), by_node=torch.zeros(shape.nodes + 1, **long),
            absorbed=torch.zeros(2, device=device), relaxed=torch.zeros((), **long),
            forwards_per_iteration=levels + 1)

    def reset_counters(self) -> None:
        for t in (self.histogram, self.by_node, self.absorbed, self.relaxed):
            t.zero_()

    def start_image(self, prefix_len: int, first: torch.Tensor) -> None:
        """State after the prefill and the first tokens `first` (G,) (the drafter's prefix is consumed by the
        caller)."""
        self.tokens.zero_()
        self.tokens[:, 0] = first.reshape(-1)
        self.per_cell.fill_(1)
        self.length.fill_(prefix_len)
        self.done.fill_(1)
        self.iteration.zero_()

    def reset_for_warmup(self, start: int) -> None:
        """A valid state for warm-up iterations at committed length `start` (capture runs real iterations)."""
        self.start_image(start, torch.zeros(self.done.shape, dtype=torch.long, device=self.tokens.device))
        self.session.reset(start)

    def select(self, images: list[int], guided: bool) -> "TreeState":
        """The state of images `images` (ascending) only (their rows of both caches, their tokens, position noise
        and counters; the run totals carried over): a smaller batch for devices that run eagerly, where an image
        that is done would otherwise still cost its share of every forward. The caches and uniforms are
        compacted in place (`kv_cache.keep_rows`), so no second copy of them is ever alive: this state must
        not be used after (its small tensors are copied)."""
        G, device = self.done.shape[0], self.done.device
        keep = torch.tensor(images, dtype=torch.long, device=device)
        rows = row_list(images, G, guided)
        index = torch.tensor(rows, dtype=torch.long, device=device)
        key_valid = self.key_valid.index_select(0, index)

        return TreeState(
            cache=self.cache.keep_rows(rows), key_valid=key_valid, session=self.session.keep_rows(rows, key_valid),
            length=self.length.index_select(0, index), done=self.done.index_select(0, keep),
            tokens=self.tokens.index_select(0, keep), per_cell=self.per_cell.index_select(0, keep),
            position=self.position.keep_rows(keep),
            uniforms=keep_rows(self.uniforms, images),
            iteration=self.iteration.index_select(0, keep),
            neighbors=self.neighbors, histogram=self.histogram.index_select(0, keep), by_node=self.by_node,
            absorbed=self.absorbed, relaxed=self.relaxed, forwards_per_iteration=self.forwards_per_iteration)

    def release(self) -> None:
        self.cache.release()
        self.session.cache.release()

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes + self.session.cache.nbytes


@dataclass
class TreeContext:
    """What an iteration reads besides its state: the two models, the tree's plan (a static tree's, or made
    here for EAGLE-2 when given None: its constants are made before any capture) and the run's CFG + filters."""

    model: ImageTransformer
    drafter: EagleDrafter
    shape: TreeShape
    plan: StaticPlan | DynamicPlan | None
    dist: NodeDistribution

    def __post_init__(self) -> None:
        if self.plan is None and self.shape.dynamic:
            self.plan = plan_dynamic_tree(self.shape.tree, self.model.tok_embeddings.weight.device)


@dataclass
class Verification:
    walk: WalkResult  # per tree: accepted path, count, bonus, relaxed mass
    hidden: torch.Tensor  # (rows, n+1, dim) target features at every node (the drafter's next inputs)


def walk_uniforms_shape(trees: int, tree: DraftTree) -> tuple[int, int, int]:
    """Shape of the uniforms one verification draws (`verify_tree`'s `uniforms`)."""
    return trees, tree.depth, tree.children.shape[-1] + 1


def verify_tree(model: ImageTransformer, cache, key_valid: torch.Tensor, length: int | torch.Tensor, tree: DraftTree,
                dist, spec, generator: torch.Generator | None, neighbors: torch.Tensor | None,
                root_index: int | torch.Tensor, uniforms: torch.Tensor | None = None,
                window: int | None = None, exp: torch.Tensor | None = None) -> Verification:
    """One target forward over G trees (rows = G, or 2G with CFG) at cache length `length`, then the walk
    under `spec.relaxation` and `spec.exact_rule`. `length` and `root_index` may be device tensors, with
    `window` the static key extent; `uniforms` (`walk_uniforms_shape`) replaces the draw from `generator`, and
    `exp` (G, depth+1, V) the position noise (Exp(1) values) of image tokens root+1 .. root+depth+1 the
    seeds of `generator` give (`position_noise.image_keys`)."""
    rows, G = key_valid.shape[0], tree.tokens.shape[0]
    hidden = forward_tree(model, cache, key_valid, length, per_row(tree.tokens, rows), tree, window)
    logits = model.logits(hidden)  # (rows, n+1, V)
    index = index_tensor(root_index, logits.device) + 1 + tree.depths  # (n+1,) or (G, n+1)
    greedy = dist.sampling.greedy
    if greedy and not relaxes(spec.relaxation):  # the argmax is the draw: AR's own rule
        draws = dist.combine(logits, index).argmax(-1)  # (G, n+1)
        walk = walk_same_as_ar(draws, tree.parents, tree.depths, tree.mask, tree.tokens, tree.depth, tree.paths)
        return Verification(walk, hidden)
    if uses_same_as_ar(spec, dist.sampling):
        combined = dist.combine(logits, index)  # (G, n+1, V)
        if exp is None:  # eager callers with generators: a table for these positions only
            positions = tree_positions(root_index, tree.depth, logits.device)
            noise = PositionNoise.of(generator, G, int(positions.max()) + 1, combined.shape[-1], logits.device)
            exp = noise.exp_at(positions, race_dtype(combined))
        per_node = exp.take_along_dim(tree.depths.expand(G, -1)[..., None], dim=1)  # (G, n+1, V)
        draws = race(combined, dist.sampling, per_node)  # (G, n+1) the target's draw after each node
        walk = walk_same_as_ar(draws, tree.parents, tree.depths, tree.mask, tree.tokens, tree.depth, tree.paths)
        return Verification(walk, hidden)
    target = dist.combine(logits, index) if greedy else dist(logits, index)  # (G, n+1, V)
    if uniforms is None and not greedy:
        uniforms = torch.rand(walk_uniforms_shape(G, tree), generator=generator, device=logits.device)
    if greedy and spec.relaxation is not None and tree.parents.dim() == 2:  # relaxed greedy on dynamic trees
        walk = walk_longest_path(target, tree.parents, tree.depths, tree.mask, tree.tokens, tree.depth,
                                 spec.relaxation, neighbors)
    else:
        walk = walk_tree(target, tree.children, tree.tokens, tree.depth, uniforms, tree.log_q, greedy,
                         spec.relaxation, neighbors, tree.widths)
    return Verification(walk, hidden)


def tree_positions(root_index: int | torch.Tensor, depth: int, device: torch.device) -> torch.Tensor:
    """Image-token indices root+1 .. root+depth+1 ((1, depth+1), or (G, depth+1) for per-tree roots): the
    positions a tree's nodes at depths 0 .. depth draw for."""
    return index_tensor(root_index, device) + torch.arange(1, depth + 2, device=device)


def tree_iteration(ctx: TreeContext, state: TreeState, windows: TreeWindows) -> None:
    """Draft a tree per image from its last accepted token, verify all of them in one target forward, accept
    a path per image, and advance: tokens[g, done ..] get the accepted drafts and the bonus token, both caches
    the path, `done` and `length` the count of each image (images already done advance nothing). Shapes
    depend on `ctx.shape` and `windows` only; nothing reads the host."""
    shape, session = ctx.shape, state.session
    depth, rows, N = shape.depth, shape.rows, shape.image_tokens
    active = state.done < N  # (G,) images still decoding before this iteration
    root_index = state.done - 1  # (G,) image-token index of each root
    root = state.tokens.gather(1, root_index[:, None])[:, 0]  # (G,)
    uniforms = None
    if shape.walk_uniforms:
        table = state.uniforms
        row = state.iteration.clamp(max=table.shape[1] - 1)[:, None, None, None].expand(-1, 1, *table.shape[2:])
        uniforms = table.gather(1, row)[:, 0]  # (G, depth, C + 1) this iteration's
    noise, exp = None, None
    if shape.same_as_ar or shape.sampled_drafts:  # Exp(1) values of positions root+1 .. root+depth+1 (G, depth+1, V)
        exp = state.position.exp_at(tree_positions(root_index, depth, root.device))
        if not shape.dynamic:  # a depth-d sibling race uses its position's values, shared by all its parents
            noise = [exp[:, d - 1:d].expand(-1, ctx.plan.parents_at[d].numel(), -1) for d in range(1, depth + 1)]
    if shape.dynamic:
        tree = draft_dynamic(session, ctx.model, ctx.plan, root, root_index, ctx.dist, windows.draft,
                             with_children=not (shape.same_as_ar or shape.sampling.greedy))
    else:
        tree = draft_static(session, ctx.model, ctx.plan, root, root_index, ctx.dist, shape.sampling.greedy, None,
                            noise, windows.draft, keep_laws=not (shape.same_as_ar or shape.sampling.greedy))
    check = verify_tree(ctx.model, state.cache, state.key_valid, state.length, tree, ctx.dist, shape, None,
                        state.neighbors, root_index, uniforms, windows.verify, exp)
    walk = check.walk
    accepted = walk.accepted  # (G,) drafted tokens accepted
    count = accepted + 1  # (G,) tokens each image adds (drafts + bonus)
    path = walk.path  # (G, depth+1) node ids root first, -1 past the accepted nodes
    node = path.clamp(min=0)
    k = torch.arange(depth + 1, device=path.device)
    drafted = tree.tokens.gather(1, node[:, 1:])  # (G, depth)
    new = torch.where(k == accepted[:, None], walk.bonus[:, None], torch.cat([drafted, drafted[:, -1:]], 1))  # (G, depth+1)
    # an image finishing now (or done before) keeps its length: its later writes stay inside the cache
    advance = count * (state.done + count < N)  # (G,)
    commit_padded_path(state.cache, state.length, per_row(path, rows))
    slots = state.done[:, None] + k  # (G, depth+1) image-token indices written (the tail past count is stale)
    state.tokens.scatter_(1, slots, new)
    state.per_cell.scatter_(1, slots, count.to(torch.int32)[:, None].expand(-1, depth + 1))
    picked = check.hidden.gather(1, per_row(node, rows)[..., None].expand(-1, -1, check.hidden.shape[-1]))
    session.consume(picked, per_row(new, rows), count=per_row(count, rows), window=windows.consume,
                    advance=per_row(advance, rows))
    state.length.add_(per_row(advance, rows))
    state.done.add_(count * active)
    state.iteration.add_(active.long())
    # run counters of the images still decoding, on the device
    state.histogram.scatter_add_(1, accepted[:, None], active.long()[:, None])
    if not shape.dynamic:  # node ids name the same place in every static tree only
        state.by_node.index_add_(0, node.reshape(-1), ((path >= 0) & active[:, None]).long().reshape(-1))
    if relaxes(shape.relaxation):  # an exact rule absorbs nothing
        absorbed = walk.absorbed * active[:, None]  # (G, depth) zero past the accepted drafts and for done images
        state.absorbed.copy_(torch.stack([state.absorbed[0] + absorbed.sum(),
                                          torch.maximum(state.absorbed[1], absorbed.max())]))
        state.relaxed.add_((absorbed > 0).sum())
