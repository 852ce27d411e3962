"""Batched speculative and Jacobi decoding: B images drafted, verified and judged in the same forwards, each
advancing on its own. Image i of a batch equals a single run with seed + i in every mode (sampled and
greedy), with batches that mix classes and left-padded prompts of different lengths (t2i, Anole, Janus-Pro)
and images that finish at different iterations; greedy exact modes equal greedy AR for every image; the
stats carry per-image figures; `auto` plans for the batch it will run."""
from __future__ import annotations

import pytest
import torch

import lantern_core.decoding.trees.auto as tree_auto
from lantern_core.conditioning import Condition
from lantern_core.config import GPTConfig, SamplingConfig
from lantern_core.decoding.trees.drafting import DynamicShape
from lantern_core.decoding.generate import generate
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.acceptance.neighbors import build_neighbors
from lantern_core.decoding.acceptance.relaxation import Relaxation
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding.trees.specs import NAIVE_EXTEND_57, chain_tree
from lantern_core.loading.families import load_prompted
from tests.tiny_families import save_chameleon_folder, save_chameleon_vqgan, save_janus_folder
from tiny_models import TINY_T2I, random_drafter, random_gpt

C2I = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=48, model_type="c2i", num_classes=5, cls_token_num=1,
                grid_size=6)
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)
DYNAMIC = DynamicShape(depth=4, top_k=4, nodes=12)
# every mode the nodes offer besides ar: (tree spec or Jacobi config, neighbour k)
MODES = {
    "eagle2": (SpeculativeConfig(tree="dynamic", dynamic=DYNAMIC), 0),
    "static_tree": (SpeculativeConfig(static_tree=NAIVE_EXTEND_57), 0),
    "lantern": (SpeculativeConfig(static_tree=NAIVE_EXTEND_57, relaxation=Relaxation(k=8, delta=0.6)), 8),
    "lantern_pp": (SpeculativeConfig(static_tree=NAIVE_EXTEND_57, relaxation=Relaxation(k=8, lam=6.0)), 8),
    "sjd": (JacobiConfig(window=6), 0),
    "sjd_coupled": (JacobiConfig(window=6, coupled=True), 0),
    "sjd_relaxed": (JacobiConfig(window=6, coupled=True, relaxation=Relaxation(k=8, lam=6.0)), 8),
}


@pytest.fixture(scope="module")
def c2i():
    model = random_gpt(C2I, seed=4)
    table = build_neighbors(torch.randn(C2I.vocab_size, 3, generator=torch.Generator().manual_seed(2)), 8)
    return model, random_drafter(model, seed=3), table


def decode(model, drafter, condition, sampling, name, table, seed):
    config, k = MODES[name]
    generators = make_generators(seed, condition.batch)
    with torch.no_grad():
        if isinstance(config, JacobiConfig):
            return jacobi_generate(model, condition, sampling, config, generators, table if k else None, compile="off")
        return speculative_generate(model, drafter, condition, sampling, config, generators, table if k else None,
                                    compile="off")


@pytest.mark.parametrize("name", sorted(MODES))
def test_each_image_of_a_batch_is_its_single_run(c2i, name):
    """Mixed classes (one repeated with another seed): each image equals a single run with seed + i, and the
    images finish at different iterations (rows that are done ride along without changing the others)."""
    model, drafter, table = c2i
    labels = [0, 3, 3, 1]
    batch = decode(model, drafter, Condition.classes(labels), SAMPLED, name, table, seed=40)
    for i, label in enumerate(labels):
        alone = decode(model, drafter, Condition.classes([label]), SAMPLED, name, table, seed=40 + i)
        assert torch.equal(batch.tokens[i], alone.tokens[0]), (name, i)
        assert torch.equal(batch.accepted_per_cell[i], alone.accepted_per_cell[0]), (name, i)
        assert batch.stats.per_image[i] == alone.stats.per_image[0], (name, i)
    iterations = [p["iterations"] for p in batch.stats.per_image]
    assert len(set(iterations)) > 1, (name, iterations)  # images finished at different iterations
    assert batch.stats.batch_forwards == 1 + max(iterations)  # the batch ran until its slowest image
    assert batch.stats.iterations == sum(iterations)


@pytest.mark.parametrize("name", ["eagle2", "static_tree", "sjd", "sjd_coupled"])
def test_greedy_exact_modes_equal_greedy_ar_for_every_image(c2i, name):
    model, drafter, table = c2i
    condition = Condition.classes([2, 0, 4])
    with torch.no_grad():
        ar = generate(model, condition, GREEDY, make_generators(0, 3))
    got = decode(model, drafter, condition, GREEDY, name, table, seed=0)
    assert ar.tokens.unique().numel() > 4
    assert torch.equal(got.tokens, ar.tokens), name


@pytest.mark.parametrize("name", ["lantern", "sjd_relaxed"])
def test_relaxed_modes_keep_their_budget_per_image_in_a_batch(c2i, name):
    model, drafter, table = c2i
    batch = decode(model, drafter, Condition.classes([1, 2, 3, 4]), SAMPLED, name, table, seed=9)
    assert batch.stats.relaxed_tokens > 0
    rule = MODES[name][0].relaxation
    if rule.delta is not None:
        assert 0 < batch.stats.max_absorbed <= rule.delta + 1e-6


@pytest.mark.parametrize("name", ["static_tree", "eagle2", "sjd_coupled", "lantern_pp"])
def test_left_padded_captions_of_different_lengths(name):
    model = random_gpt(TINY_T2I, seed=5)
    drafter = random_drafter(model)
    table = build_neighbors(torch.randn(TINY_T2I.vocab_size, 3, generator=torch.Generator().manual_seed(2)), 8)
    caption = torch.randn(3, 6, 24, generator=torch.Generator().manual_seed(9))
    mask = torch.tensor([[False, False, True, True, True, True], [True] * 6, [False] * 5 + [True]])
    batch = decode(model, drafter, Condition(caption=caption, caption_mask=mask), SAMPLED, name, table, seed=2)
    for i in range(3):
        row = Condition(caption=caption[i:i + 1], caption_mask=mask[i:i + 1])
        assert torch.equal(batch.tokens[i], decode(model, drafter, row, SAMPLED, name, table, seed=2 + i).tokens[0])


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    anole = tmp_path_factory.mktemp("anole")
    save_chameleon_folder(anole, seed=5)
    save_chameleon_vqgan(anole / "vqgan.ckpt")
    janus = tmp_path_factory.mktemp("janus")
    save_janus_folder(janus, seed=6, grid=4)
    return {"anole": load_prompted(anole, grid_size=4, max_prompt_tokens=32),
            "janus": load_prompted(janus, max_prompt_tokens=32)}


@pytest.mark.parametrize("family", ["anole", "janus"])
@pytest.mark.parametrize("name", ["static_tree", "sjd_relaxed"])
def test_prompted_families_batch_prompts_of_different_lengths(families, family, name):
    loaded = families[family]
    target = loaded.model
    drafter = random_drafter(target) if name == "static_tree" else None
    table = build_neighbors(loaded.vq.quantize.embedding.weight, 8)
    prompts = ["a red cat", "a photo of the blue sky at noon", "a dog"]  # left padding differs per row
    condition = loaded.encoder.encode(prompts)
    batch = decode(target, drafter, condition, SAMPLED, name, table, seed=12)
    for i in range(len(prompts)):
        alone = decode(target, drafter, condition.row(i), SAMPLED, name, table, seed=12 + i)
        assert torch.equal(batch.tokens[i], alone.tokens[0]), (family, name, i)


def test_auto_tree_is_planned_at_the_batch_it_runs(c2i, monkeypatch):
    """The cost curve behind `auto` is measured at the batch's rows, and the choice is kept per batch size."""
    model, drafter, _ = c2i
    seen = []
    real = tree_auto.measure_costs
    monkeypatch.setattr(tree_auto, "measure_costs",
                        lambda m, d, rows, *a, **k: seen.append(rows) or real(m, d, rows, *a, **k))
    spec = SpeculativeConfig(tree="auto", static_tree=chain_tree(3))
    with torch.no_grad():
        one = speculative_generate(model, drafter, Condition.classes([1]), SAMPLED, spec, make_generators(0, 1),
                                   compile="off")
        four = speculative_generate(model, drafter, Condition.classes([1, 2, 3, 4]), SAMPLED, spec,
                                    make_generators(0, 4), compile="off")
        again = speculative_generate(model, drafter, Condition.classes([0, 1, 2, 3]), SAMPLED, spec,
                                     make_generators(5, 4), compile="off")
    assert seen == [2, 8]  # CFG rows of a batch of 1, then of 4; the second batch of 4 reuses its choice
    assert "calibrated in this run" in one.stats.tree and "calibrated in this run" in four.stats.tree
    assert "calibrated in this run" not in again.stats.tree and "at batch 4" in four.stats.tree


@pytest.mark.parametrize("name", ["lantern", "eagle2", "sjd_coupled", "sjd"])
def test_replayed_batches_over_window_bands_give_the_eager_tokens(monkeypatch, name):
    """The capturing path (stand-in graphs on the CPU): bucketed windows follow the furthest image still
    decoding, per-row lengths inside them; the same tokens as the exact eager loop for a whole batch."""
    from lantern_core.decoding import step_graphs
    from stand_in_graphs import assert_capture_matches_eager, use_stand_in_graphs

    model = random_gpt(GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=48, model_type="c2i", num_classes=5,
                                 cls_token_num=1, grid_size=10), seed=7)  # 100 tokens: several 64-slot bands
    drafter = random_drafter(model, seed=3)
    table = build_neighbors(torch.randn(48, 3, generator=torch.Generator().manual_seed(2)), 8)
    use_stand_in_graphs(monkeypatch, step_graphs)
    monkeypatch.setattr(step_graphs, "uses_graphs", lambda choice, device: choice == "auto")
    config, k = MODES[name]

    def run(seed, compile):
        condition = Condition.classes([seed % 5, 3, 1])
        with torch.no_grad():
            if isinstance(config, JacobiConfig):
                return jacobi_generate(model, condition, SAMPLED, config, make_generators(seed, 3),
                                       table if k else None, compile=compile)
            return speculative_generate(model, drafter, condition, SAMPLED, config, make_generators(seed, 3),
                                        table if k else None, compile=compile)

    runner = assert_capture_matches_eager(step_graphs, model, run)
    assert len(runner.graphs) >= 2 and sum(g.replays for g in runner.graphs.values()) > 0
    step_graphs.release(model)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["lantern", "eagle2", "sjd_relaxed"])
def test_cuda_graph_batches_equal_eager_and_single_runs(c2i, name):
    from lantern_core.decoding import step_graphs

    model, drafter, table = (x.to("cuda") for x in c2i)
    config, k = MODES[name]

    def run(labels, seed, compile):
        condition = Condition.classes(labels, device="cuda")
        gens = make_generators(seed, len(labels), "cuda")
        with torch.no_grad():
            if isinstance(config, JacobiConfig):
                return jacobi_generate(model, condition, SAMPLED, config, gens, table if k else None, compile=compile)
            return speculative_generate(model, drafter, condition, SAMPLED, config, gens, table if k else None,
                                        compile=compile)

    captured, eager = run([0, 3, 3, 1], 40, "auto"), run([0, 3, 3, 1], 40, "off")
    assert torch.equal(captured.tokens, eager.tokens)
    for i, label in enumerate([0, 3, 3, 1]):
        assert torch.equal(captured.tokens[i], run([label], 40 + i, "auto").tokens[0]), i
    step_graphs.release(model)


def test_relaxed_2d_batch_image_is_its_single_run_in_float64():
    """The embedded model, relaxed 2-D Jacobi as the node builds it (coupled, `sample_left`, 6 rows of 4 drafts,
    lead 0), in float64: image 1 of a batch of 2 is its single run (seed + 1) to the last token. In float32 the
    lower rows' near-tie tests may flip with the batch's matmul rounding on some machines (the node-level
    determinism test allows it past a prefix); the batched logic itself must not."""
    from lantern_core.loading.embedded import load_embedded

    pipeline = load_embedded()
    model = pipeline.gpt.model.double()
    cat = list(pipeline.gpt.class_names).index("cat")
    config = JacobiConfig(window=8, coupled=True, init="sample_left", rows=6, row_window=4, row_commit=True, row_lead=0)
    sampling = SamplingConfig(cfg_scale=3.0, temperature=1.0)
    with torch.no_grad():
        batch = jacobi_generate(model, Condition.classes([cat, cat]), sampling, config, make_generators(70, 2),
                                compile="off").tokens
        single = jacobi_generate(model, Condition.classes([cat]), sampling, config, make_generators(71, 1),
                                 compile="off").tokens
    assert torch.equal(batch[1], single[0])
