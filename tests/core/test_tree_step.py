"""The static-shape speculative iteration (`decoding/trees/iteration.py`): the same tokens as the step-by-step
decoder it replaced (tests/reference_speculative.py), for static trees, chains and EAGLE-2, exact, greedy,
LANTERN (delta) and LANTERN++ (lambda), c2i and left-padded t2i; the same tokens through the window bands a
capturing device uses (stand-in graphs on the CPU, with warm-up and reuse across images); and an
iteration that traces with `torch.compile(fullgraph=True)` and decodes a second image without recompiling."""
from __future__ import annotations

import pytest
import torch

import lantern_core.decoding.trees.batch as speculative_module
from lantern_core.conditioning import Condition
from lantern_core.config import GPTConfig, SamplingConfig
from lantern_core.decoding import step_graphs
from lantern_core.decoding.trees.drafting import DynamicShape
from lantern_core.decoding.acceptance.neighbors import build_neighbors
from lantern_core.decoding.acceptance.relaxation import Relaxation
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding.trees.specs import MC_SIM_7B_63, NAIVE_EXTEND_57, chain_tree
from lantern_core.decoding.trees.iteration import TreeShape, band_windows, tree_iteration, tree_windows
from reference_speculative import reference_tokens
from stand_in_graphs import assert_capture_matches_eager, use_stand_in_graphs
from tiny_models import TINY_T2I, random_drafter, random_gpt

# 10 x 10 = 100 tokens: the iteration crosses several 64-slot window bands
WIDE_C2I = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=48, model_type="c2i", num_classes=5,
                     cls_token_num=1, grid_size=10)
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)
GREEDY = SamplingConfig(cfg_scale=3.0, cfg_interval=40, temperature=0.0)
DYNAMIC = DynamicShape(depth=4, top_k=4, nodes=12)
MODES = {  # name: (spec, sampling, neighbour k)
    "static_exact": (SpeculativeConfig(static_tree=MC_SIM_7B_63), SAMPLED, 0),
    "static_greedy": (SpeculativeConfig(static_tree=NAIVE_EXTEND_57), GREEDY, 0),
    "chain_exact": (SpeculativeConfig(static_tree=chain_tree(5)), SAMPLED, 0),
    "eagle2_exact": (SpeculativeConfig(tree="dynamic", dynamic=DYNAMIC), SAMPLED, 0),
    "eagle2_greedy": (SpeculativeConfig(tree="dynamic", dynamic=DYNAMIC), GREEDY, 0),
    "lantern_delta": (SpeculativeConfig(static_tree=MC_SIM_7B_63, relaxation=Relaxation(k=8, delta=0.6)), SAMPLED, 8),
    "lantern_pp_greedy": (SpeculativeConfig(static_tree=NAIVE_EXTEND_57, relaxation=Relaxation(k=8, lam=4.0)), GREEDY, 8),
    "eagle2_delta": (SpeculativeConfig(tree="dynamic", dynamic=DYNAMIC, relaxation=Relaxation(k=8, delta=0.6)),
                     SAMPLED, 8),
}


@pytest.fixture(scope="module")
def wide():
    model = random_gpt(WIDE_C2I, seed=7)
    table = build_neighbors(torch.randn(WIDE_C2I.vocab_size, 3, generator=torch.Generator().manual_seed(2)), 8)
    return model, random_drafter(model, seed=3), table


def run(model, drafter, labels, name, table, seed, compile="off"):
    spec, sampling, k = MODES[name]
    return speculative_generate(model, drafter, Condition.classes(labels), sampling, spec,
                                make_generators(seed, len(labels)), table if k else None, compile=compile)


@pytest.mark.parametrize("name", sorted(MODES))
def test_iteration_loop_matches_the_step_by_step_decoder(wide, name):
    model, drafter, table = wide
    spec, sampling, k = MODES[name]
    labels = [1, 3]
    got = run(model, drafter, labels, name, table, seed=5)
    for i, label in enumerate(labels):
        expected = reference_tokens(model, drafter, Condition.classes([label]), sampling, spec,
                                    make_generators(5 + i, 1)[0], table if k else None)
        assert torch.equal(got.tokens[i], expected), (name, i)
    if spec.relaxation is not None:  # long accepted paths happened, so the padded path was exercised
        assert len(got.stats.accepted_histogram) >= 3


@pytest.mark.parametrize("name", ["static_exact", "eagle2_greedy"])
def test_left_padded_prompts_match_the_step_by_step_decoder(name):
    model = random_gpt(TINY_T2I, seed=5)
    drafter = random_drafter(model)
    caption = torch.randn(2, 6, 24, generator=torch.Generator().manual_seed(9))
    mask = torch.tensor([[False, False, True, True, True, True], [True] * 6])
    spec, sampling, _ = MODES[name]
    got = speculative_generate(model, drafter, Condition(caption=caption, caption_mask=mask), sampling, spec,
                               make_generators(2, 2), compile="off")
    for i in range(2):
        row = Condition(caption=caption[i:i + 1], caption_mask=mask[i:i + 1])
        assert torch.equal(got.tokens[i], reference_tokens(model, drafter, row, sampling, spec,
                                                           make_generators(2 + i, 1)[0])), i


def test_window_bands_cover_every_length_in_a_few_shapes():
    shape = TreeShape(2, 1 + 100 + 40, 100, SAMPLED, MC_SIM_7B_63)
    bands = band_windows(shape)
    assert [w.start for w in bands] == [0, 64]
    for length in range(1, 100):
        w = tree_windows(length, shape, exact=False)
        assert w in bands and w.start <= length
        assert w.verify >= length + MC_SIM_7B_63.num_nodes + 1 and w.draft >= length + MC_SIM_7B_63.num_nodes
        assert w.consume >= length + MC_SIM_7B_63.depth + 1 and max(w.draft, w.verify, w.consume) <= shape.slots
        exact = tree_windows(length, shape, exact=True)
        assert exact.verify == length + MC_SIM_7B_63.num_nodes + 1


@pytest.mark.parametrize("name", ["lantern_delta", "eagle2_greedy"])
def test_replayed_iterations_over_window_bands_give_the_eager_tokens(wide, monkeypatch, name):
    """The capturing path's control flow on the CPU (registry, warm-up from a reset state, one stand-in
    graph per band, replay), bucketed windows and padded caches: the same tokens as the exact eager loop,
    and one runner serves a second image."""
    model, drafter, table = wide
    use_stand_in_graphs(monkeypatch, step_graphs)
    monkeypatch.setattr(step_graphs, "uses_graphs", lambda choice, device: choice == "auto")
    runner = assert_capture_matches_eager(step_graphs, model,
                                          lambda seed, compile: run(model, drafter, [seed + 1], name, table, seed, compile))
    assert len(runner.graphs) >= 2 and sum(g.replays for g in runner.graphs.values()) > 0
    # unloading the drafter (ComfyUI detaches its patcher) drops the target's tree graphs that read it
    assert step_graphs.release(drafter) == 1 and step_graphs.cached_runners(model) == 0


@pytest.mark.parametrize("name", ["lantern_delta", "eagle2_greedy"])
def test_iteration_compiles_fullgraph_and_decodes_without_recompiling(wide, monkeypatch, name):
    """fullgraph=True raises on any graph break (a host read, a tensor-valued branch), so nothing in the
    iteration blocks capture; error_on_recompile on a second image proves its guards are static."""
    import torch._dynamo

    torch._dynamo.reset()
    model, drafter, table = wide
    eager = [run(model, drafter, [c], name, table, c, compile="off").tokens for c in (1, 4)]
    monkeypatch.setattr(step_graphs, "uses_graphs", lambda choice, device: choice == "auto")
    compiled = torch.compile(tree_iteration, fullgraph=True, backend="aot_eager", dynamic=False)
    monkeypatch.setattr(speculative_module, "tree_iteration", compiled)
    assert torch.equal(run(model, drafter, [1], name, table, 1, compile="off").tokens, eager[0])
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert torch.equal(run(model, drafter, [4], name, table, 4, compile="off").tokens, eager[1])
    torch._dynamo.reset()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["lantern_delta", "eagle2_greedy", "static_exact"])
def test_cuda_graph_iterations_equal_eager_and_are_reused(name, dtype):
    model = random_gpt(WIDE_C2I, seed=7).to("cuda", dtype)
    drafter = random_drafter(random_gpt(WIDE_C2I, seed=7), seed=3).to("cuda", dtype)
    table = build_neighbors(torch.randn(WIDE_C2I.vocab_size, 3, generator=torch.Generator().manual_seed(2)), 8).cuda()
    spec, sampling, k = MODES[name]

    def decode(seed, compile):
        return speculative_generate(model, drafter, Condition.classes([seed + 1], device="cuda"), sampling, spec,
                                    make_generators(seed, 1, "cuda"), table if k else None, compile=compile)

    assert_capture_matches_eager(step_graphs, model, decode)
    assert step_graphs.release(model) == 1


@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_static_drafting_draws_the_oracle_tree_with_and_without_laws(wide, greedy):
    """`draft_static` (level by level, no per-node tables) drafts the tokens and, with `keep_laws`, the laws of
    the per-node-table oracle (`reference_draft_static`) from the same noise; without laws (greedy runs and the
    AR-identical walk) it races filtered logits and still draws the same tree. A branching 63-node tree and a
    tree given out of order (`TreeSpec` numbers its nodes depth by depth)."""
    from lantern_core.decoding.trees.specs import TreeSpec
    model, drafter, _ = wide
    for spec in (MC_SIM_7B_63, TreeSpec("shuffled", ((0,), (0, 0), (1,), (0, 0, 0), (1, 0), (1, 0, 0), (2,)))):
        check_drafting(model, drafter, spec, greedy)


def check_drafting(model, drafter, spec, greedy):
    from lantern_core.conditioning import build_prefix
    from lantern_core.decoding.generate import prefill
    from lantern_core.decoding.sampling import NodeDistributions
    from lantern_core.decoding.trees.drafting import DrafterSession, draft_static, plan_static_tree
    from reference_speculative import reference_draft_static
    plan = plan_static_tree(spec, torch.device("cpu"))
    sampling = GREEDY if greedy else SAMPLED
    dist = NodeDistributions(sampling, True, model.constrain_logits)
    prefix = build_prefix(model, Condition.classes([1, 2]), True)
    rows, T = prefix.key_valid.shape
    drafts = []
    for how in ("oracle", "laws", "no laws"):
        cache = model.allocate_cache(rows, T + 80)
        key_valid = torch.ones(rows, T + 80, dtype=torch.bool)
        hidden = prefill(model, prefix, cache, key_valid)
        session = DrafterSession(drafter, rows, T + 80, key_valid)
        session.consume(hidden, torch.zeros(rows, T, dtype=torch.long))
        noise = [torch.empty(2, plan.parents_at[d].numel(), WIDE_C2I.vocab_size).exponential_(
            generator=torch.Generator().manual_seed(d)) for d in range(1, spec.depth + 1)]
        root = torch.tensor([3, 4])
        with torch.no_grad():
            if how == "oracle":
                drafts.append(reference_draft_static(session, model, plan, root, 0, dist, greedy, None, noise))
            else:
                tree = draft_static(session, model, plan, root, 0, dist, greedy, None, noise, keep_laws=how == "laws")
                drafts.append((tree.tokens, tree.log_q))
    (expected, laws), (with_laws, kept), (without, none) = drafts
    assert torch.equal(with_laws, expected) and torch.equal(without, expected)
    assert none is None and (kept is None if greedy else torch.equal(kept, laws))


@pytest.mark.parametrize("shape", [DYNAMIC, DynamicShape(depth=5, top_k=6, nodes=40), DynamicShape(depth=3, top_k=3, nodes=21)],
                         ids=["d4k4n12", "d5k6n40", "whole_pool"])
@pytest.mark.parametrize("ties", [False, True], ids=["drafter", "flat_drafter"])
def test_dynamic_drafting_builds_the_oracle_tree(wide, shape, ties):
    """`draft_dynamic` (frontier masks and pool-id paths carried level by level, the tree read off the kept
    nodes' paths) drafts the tree of the oracle that rebuilt masks per level and chased parents
    (`reference_draft_dynamic`): tokens, parents, depths, ancestry and child table, for two images at
    different positions. A drafter whose laws are flat ties every score, so the order of kept nodes rests on
    the stable sort alone. The paths it gives the walk agree with its ancestry."""
    from lantern_core.conditioning import build_prefix
    from lantern_core.decoding.generate import prefill
    from lantern_core.decoding.sampling import NodeDistributions
    from lantern_core.decoding.trees.drafting import DrafterSession, draft_dynamic, plan_dynamic_tree
    from reference_speculative import reference_draft_dynamic
    model, drafter, _ = wide
    if ties:
        drafter = random_drafter(model, seed=3)
        for p in drafter.fc.parameters():
            torch.nn.init.zeros_(p)
        model = random_gpt(WIDE_C2I, seed=7)
        torch.nn.init.zeros_(model.output.weight)
    dist = NodeDistributions(SAMPLED, True, model.constrain_logits)
    prefix = build_prefix(model, Condition.classes([1, 2]), True)
    rows, T = prefix.key_valid.shape
    trees = []
    for how in ("oracle", "new"):
        cache = model.allocate_cache(rows, T + 80)
        key_valid = torch.ones(rows, T + 80, dtype=torch.bool)
        key_valid[1, 0] = False  # a padded prefix slot in one row
        hidden = prefill(model, prefix, cache, key_valid)
        session = DrafterSession(drafter, rows, T + 80, key_valid)
        session.consume(hidden, torch.zeros(rows, T, dtype=torch.long))
        root, index = torch.tensor([3, 4]), torch.tensor([0, 5])
        with torch.no_grad():
            if how == "oracle":
                trees.append(reference_draft_dynamic(session, model, shape, root, index, dist, window=T + 70))
            else:
                trees.append(draft_dynamic(session, model, plan_dynamic_tree(shape, torch.device("cpu")), root, index,
                                           dist, window=T + 70))
    expected, tree = trees
    for field in ("tokens", "parents", "depths", "mask", "children"):
        assert torch.equal(getattr(tree, field), getattr(expected, field)), field
    G, n1, _ = tree.paths.shape
    for g in range(G):
        for node in range(n1):
            on_path = tree.paths[g, node][tree.paths[g, node] >= 0]
            assert torch.equal(on_path, torch.nonzero(tree.mask[g, node])[:, 0])
            assert torch.equal(tree.depths[g, on_path], torch.arange(on_path.numel()))
