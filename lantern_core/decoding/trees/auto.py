"""The `auto` static tree: pick the sub-tree of a base tree (LANTERN++'s naive_extend_57) that gives the
most tokens per second on this machine, from two measurements:

* the forward-cost curve: time of one target verification over n tree nodes, and of one drafter
  forward, measured on the actual model, rows and device (a GPU verifies 57 nodes for about the price
  of one; a CPU pays several single steps);
* the acceptance profile: how often each node of the base tree lies on the accepted path, measured on
  a real run. Siblings are tested in rank order and a node's chance depends only on its ancestors and
  lower-ranked siblings, so for any rank-closed sub-tree the expected accepted length is exactly
  1 + the sum of its nodes' rates.

Candidates grow greedily by rate (keeping every prefix and lower rank), and the best ratio
E[tokens] / (verify(n) + depth x drafter) wins. This module measures and chooses; decoding is elsewhere.
"""
from __future__ import annotations

import logging
import time
import weakref

import torch

from ...conditioning import Condition
from ...config import SamplingConfig
from ...errors import ConfigError
from ...models.drafter import EagleDrafter
from ...models.gpt import ForwardStep, ImageTransformer
from .. import auto_store
from ..auto_store import image_shape, weights_digest
from ..batching import BatchRequest, BatchSink, RunTally
from ..cost_curve import CostCurve, time_call, verify_times
from ..generate import generate, synchronize
from ..sampling import make_generators
from ..acceptance.seed_identity import image_follows_choice
from ..step_graphs import layout_for
from .batch import decode_batch
from .config import SpeculativeConfig
from .drafting import plan_static_tree
from .specs import TreeSpec

log = logging.getLogger(__name__)

SIZES = (1, 2, 4, 8, 16, 32, 64)


@torch.no_grad()
def measure_costs(model: ImageTransformer, drafter: EagleDrafter, rows: int, reps: int = 3) -> CostCurve:
    """Time target verification for SIZES tree tokens and one drafter level, on the model's device."""
    device = model.tok_embeddings.weight.device
    length = model.config.cls_token_num + model.config.num_image_tokens // 2  # a mid-image cache
    dcache = drafter.allocate_cache(rows, length + 8)
    feats = torch.zeros(rows, 8, model.config.dim, device=device, dtype=model.tok_embeddings.weight.dtype)
    dtokens = torch.zeros(rows, 8, dtype=torch.long, device=device)
    dmask = torch.ones(rows, 1, 8, length + 8, dtype=torch.bool, device=device)
    dslots = torch.arange(length, length + 8, device=device)
    dstep = ForwardStep(dslots.clamp(max=drafter.rope_table.shape[0] - 1), dcache, length + 8, dmask, dslots)
    draft = time_call(lambda: model.logits(drafter(feats, dtokens, dstep)), device, reps)
    dcache.release()
    return CostCurve(tuple(verify_times(model, rows, SIZES, reps)), draft)


def node_rates(base: TreeSpec, accepted_by_node: list[int], iterations: int) -> dict[tuple[int, ...], float]:
    """P(node on the accepted path) for every node of `base`, from a run's per-node acceptance counts."""
    return {path: accepted_by_node[i + 1] / max(iterations, 1) for i, path in enumerate(base.paths)}


def tree_rate(tree: TreeSpec, rates: dict[tuple[int, ...], float], costs: CostCurve) -> float:
    """Predicted tokens per second of `tree` (model forwards only)."""
    expected = 1.0 + sum(rates.get(p, 0.0) for p in tree.paths)
    return expected / (costs.verify(tree.num_nodes + 1) + tree.depth * costs.draft_s)


def choose_subtree(base: TreeSpec, rates: dict[tuple[int, ...], float], costs: CostCurve) -> tuple[TreeSpec, float]:
    """The rank-closed sub-tree of `base` with the most expected tokens per second, and that rate."""
    chosen: list[tuple[int, ...]] = []
    present: set[tuple[int, ...]] = set()
    best, best_rate = None, -1.0
    remaining = list(base.paths)
    expected = 1.0
    while remaining:
        ready = [p for p in remaining if (len(p) == 1 or p[:-1] in present)
                 and (p[-1] == 0 or p[:-1] + (p[-1] - 1,) in present)]
        pick = max(ready, key=lambda p: (rates.get(p, 0.0), -len(p)))
        remaining.remove(pick)
        present.add(pick)
        chosen.append(pick)
        expected += rates.get(pick, 0.0)
        depth = max(len(p) for p in chosen)
        seconds = costs.verify(len(chosen) + 1) + depth * costs.draft_s
        if expected / seconds > best_rate:
            best, best_rate = list(chosen), expected / seconds
    return TreeSpec(f"auto_{len(best)}", tuple(best)), best_rate



# Auto choices are remembered by the weights' digest, not the module object: a model unloaded
# (ComfyUI's /free) and loaded again gets the same tree, so the same seed keeps giving the same image.
_AUTO_CHOICES: dict[tuple, dict] = {}
_COSTS: "weakref.WeakKeyDictionary[EagleDrafter, dict]" = weakref.WeakKeyDictionary()


def _auto_key(sampling: SamplingConfig, spec: SpeculativeConfig) -> tuple:
    """What the best tree depends on besides the machine: sampling, acceptance rule and base tree."""
    return (sampling.uses_cfg, sampling.greedy, round(sampling.cfg_scale, 3), round(sampling.temperature, 3),
            sampling.top_k, round(sampling.top_p, 3), spec.relaxation, spec.exact_rule, spec.static_tree.paths)


def _auto_choice(model: ImageTransformer, drafter: EagleDrafter, sampling: SamplingConfig,
                 spec: SpeculativeConfig, batch: int) -> tuple[TreeSpec, str] | None:
    return _AUTO_CHOICES.get(_pair(model, drafter), {}).get((_auto_key(sampling, spec), batch))


def _stored_key(model: ImageTransformer, drafter: EagleDrafter, sampling: SamplingConfig, spec: SpeculativeConfig,
                batch: int) -> str:
    weight = model.tok_embeddings.weight
    return auto_store.entry_key("tree", weights_digest(model), weights_digest(drafter),
                                auto_store.device_name(weight.device), str(weight.dtype), image_shape(model),
                                _auto_key(sampling, spec), batch)


def auto_tree(model: ImageTransformer, drafter: EagleDrafter, condition: Condition, sampling: SamplingConfig,
               spec: SpeculativeConfig, neighbors: torch.Tensor | None, compile: str) -> tuple[TreeSpec, str, str]:
    """The `auto` tree for this batch size (for one image, whatever the batch, where the tree can change a
    seed's image: `seed_identity.image_follows_choice`): remembered in this process, else kept in the store by
    an earlier process (`auto_store.py`), else calibrated now (and stored). Returns (tree, note, where it came
    from)."""
    B = 1 if image_follows_choice(spec, sampling, model.tok_embeddings.weight.dtype) else condition.batch
    cached = _auto_choice(model, drafter, sampling, spec, B)
    if cached is not None:
        return (*cached, "")
    key = _stored_key(model, drafter, sampling, spec, B)
    stored = auto_store.recall(key)
    if stored is not None:
        try:
            chosen = (TreeSpec(str(stored["name"]), tuple(tuple(p) for p in stored["paths"])), str(stored["note"]))
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            log.warning("ignoring a stored auto tree (%s); measuring again", exc)
        else:
            if set(chosen[0].paths) <= set(spec.static_tree.paths):
                _AUTO_CHOICES.setdefault(_pair(model, drafter), {})[(_auto_key(sampling, spec), B)] = chosen
                return (*chosen, "; measured in an earlier run")
    chosen, note = _calibrate(model, drafter, condition.row(0), sampling, spec, neighbors, compile, B)
    auto_store.remember(key, {"name": chosen.name, "paths": [list(p) for p in chosen.paths], "note": note},
                        f"tree for {type(model).__name__} at batch {B}")
    return chosen, note, "; calibrated in this run"


def _pair(model: ImageTransformer, drafter: EagleDrafter) -> tuple:
    weight = model.tok_embeddings.weight
    return weights_digest(model), weights_digest(drafter), str(weight.device), str(weight.dtype), image_shape(model)


def _costs(model: ImageTransformer, drafter: EagleDrafter, rows: int) -> CostCurve:
    per_drafter = _COSTS.setdefault(drafter, {})
    key = (id(model), rows, str(model.tok_embeddings.weight.device), str(model.tok_embeddings.weight.dtype))
    if key not in per_drafter:
        per_drafter[key] = measure_costs(model, drafter, rows)
    return per_drafter[key]


def _calibrate(model: ImageTransformer, drafter: EagleDrafter, condition: Condition, sampling: SamplingConfig,
               spec: SpeculativeConfig, neighbors: torch.Tensor | None, compile: str, batch: int) -> tuple[TreeSpec, str]:
    """Decode one scratch batch of `batch` copies of `condition` on the base tree (fixed seeds, output
    discarded) to measure each node's acceptance, measure the cost curve at the batch's rows, choose the
    sub-tree and remember it for that batch size. Seeds of the user's images are untouched, so every image
    of every run of that size uses the same tree: same seed, same image. The same scratch batch is also
    decoded with plain AR, so the stats can say when speculation does not pay on this machine (the
    model-forward cost model is scaled by the base tree's measured speed)."""
    device = model.tok_embeddings.weight.device
    N = model.config.num_image_tokens
    scratch_condition = condition.repeated(batch)
    scratch = RunTally(device, by_node=torch.zeros(spec.static_tree.num_nodes + 1, dtype=torch.long, device=device))
    plan = plan_static_tree(spec.static_tree, device)

    def decode_base(tally: RunTally) -> None:
        request = BatchRequest(scratch_condition, sampling, make_generators(0, batch, device), neighbors, compile)
        decode_batch(model, drafter, spec, plan, request, BatchSink.allocate(batch, N, tally))

    def decode_ar() -> None:
        generate(model, scratch_condition, sampling, make_generators(0, batch, device), compile=compile)

    if layout_for(compile, device).graphs:  # capture both outside the clock (users replay kept graphs)
        decode_base(RunTally(device, by_node=torch.zeros_like(scratch.by_node)))
        decode_ar()
    start = time.perf_counter()
    decode_base(scratch)
    synchronize(device)
    base_measured = batch * N / (time.perf_counter() - start)
    start = time.perf_counter()
    decode_ar()
    synchronize(device)
    ar_measured = batch * N / (time.perf_counter() - start)
    rows = batch * (2 if sampling.uses_cfg else 1)
    rates = node_rates(spec.static_tree, scratch.by_node.tolist(), scratch.iterations)
    costs = _costs(model, drafter, rows)
    chosen, predicted = choose_subtree(spec.static_tree, rates, costs)
    estimate = predicted * base_measured / tree_rate(spec.static_tree, rates, costs)
    at = f" at batch {batch}" if batch > 1 else ""
    note = (f"about {estimate:.0f} tok/s expected with {chosen.name} vs {ar_measured:.0f} tok/s for plain AR{at} "
            f"on this machine" + ("; plain AR (mode ar) is faster here" if estimate < ar_measured else ""))
    _AUTO_CHOICES.setdefault(_pair(model, drafter), {})[(_auto_key(sampling, spec), batch)] = (chosen, note)
    return chosen, note
