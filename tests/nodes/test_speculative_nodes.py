"""The speculative modes through the nodes, in process with ComfyUI's real model management: the drafter
loader (embedded first, fit checks, shared loads), decoding-config validation that names the parameter,
and sampler runs in every mode on the embedded model with stats and the heat map, including the
training-free Jacobi modes (sjd, sjd_coupled, sjd_relaxed) that need no drafter."""
from __future__ import annotations


import pytest
import torch


@pytest.fixture(scope="module")
def drafter(pack, node, model):
    return node["LanternDrafterLoader"].execute(model=model, drafter=pack.nodes.paths.EMBEDDED).args[0]


DEFAULTS = dict(tree="mc_sim_7b_63", chain_length=4, custom_tree="[[0], [1], [0, 0]]", lantern_k=10, delta=0.1,
                lam=5.0, eagle_depth=4, eagle_top_k=4, eagle_nodes=12)


def decoding(node, drafter, mode, **overrides):
    return node["LanternDecodingConfig"].execute(mode=mode, drafter=drafter, **{**DEFAULTS, **overrides}).args[0]


def run(node, model, dec, seed=3, batch_size=1, classes="rocket", temperature=1.0):
    cond = node["LanternConditioning"].execute(model=model, class_name=classes, prompt="").args[0]
    return node["LanternSampler"].execute(model=model, conditioning=cond, decoding=dec, cfg=3.0,
                                          temperature=temperature, top_k=0, top_p=1.0, seed=seed,
                                          batch_size=batch_size)


def test_drafter_loader_lists_the_embedded_drafter_and_shares_loads(pack, node, model, drafter):
    schema = node["LanternDrafterLoader"].define_schema()
    assert schema.inputs[1].options[0] == pack.nodes.paths.EMBEDDED
    again = node["LanternDrafterLoader"].execute(model=model, drafter=pack.nodes.paths.EMBEDDED).args[0]
    assert again is drafter and drafter.config.dim == model.config.dim
    assert node["LanternDrafterLoader"].validate_inputs(drafter="nope/") != True  # noqa: E712


def test_a_drafter_for_another_model_is_refused(pack, node, model, drafter):
    from lantern_pack.lantern_core.errors import LanternError

    other = node["LanternModelLoader"].execute(checkpoint=pack.nodes.paths.EMBEDDED, vq_tokenizer="auto",
                                               text_encoder="none", dtype="bf16").args[0]
    dec = decoding(node, drafter, "static_tree")
    with pytest.raises(LanternError, match="connect the same model"):
        run(node, other, dec)


@pytest.mark.parametrize("overrides,fragment", [
    (dict(mode="lantern_pp", drafter=None), "needs a drafter"),
    (dict(mode="lantern_pp", tree="custom", custom_tree="[[0], [0, 0"), "custom_tree"),
    (dict(mode="lantern_pp", tree="custom", custom_tree="[[0, 0]]"), "parent"),
    (dict(mode="lantern", lantern_k=5000), "lantern_k"),
    (dict(mode="sjd", jacobi_init="sideways"), "jacobi_init"),
    (dict(mode="sjd_relaxed", sjd_relaxation="loose"), "sjd_relaxation"),
    (dict(mode="sjd_relaxed", sjd_relaxation="gsd", gsd_gap=2.0), "group gap"),
])
def test_decoding_config_errors_name_the_parameter(node, drafter, overrides, fragment):
    from lantern_pack.lantern_core.errors import LanternError

    args = {**DEFAULTS, "drafter": drafter, **overrides}
    with pytest.raises(LanternError, match=fragment):
        node["LanternDecodingConfig"].execute(**args)


def test_exact_greedy_modes_reproduce_greedy_ar_through_the_nodes(node, model, drafter):
    ar = run(node, model, decoding(node, drafter, "ar"), temperature=0.0).args[0].tokens
    for mode in ("static_tree", "eagle2", "sjd", "sjd_coupled"):
        out = run(node, model, decoding(node, drafter if not mode.startswith("sjd") else None, mode,
                                        jacobi_window=8), temperature=0.0)
        assert torch.equal(out.args[0].tokens, ar), mode
        assert out.ui["lantern_stats"][0]["forward_passes"] < 256  # drafting earned its keep


@pytest.mark.parametrize("mode", ["eagle2", "static_tree", "lantern", "lantern_pp"])
def test_every_mode_samples_with_stats_and_heat_map(node, model, drafter, mode):
    out = run(node, model, decoding(node, drafter, mode), batch_size=2)
    tokens, text = out.args
    payload = out.ui["lantern_stats"][0]
    assert tokens.tokens.shape == (2, 256)
    assert payload["mode"] == mode and payload["speculative"] and payload["drafter"].endswith("(embedded)")
    assert payload["forward_passes"] < 2 * 256 and payload["mean_accepted_length"] > 1.2
    heat = torch.tensor(payload["heatmap"])
    assert heat.shape == (16, 16) and int(heat.max()) > 1 and int(heat.min()) >= 1
    assert payload["acceptance_by_depth"] and all(0 <= a <= 1 for a in payload["acceptance_by_depth"])
    assert "acceptance by depth" in text and payload["tree"] in text
    if mode == "lantern":
        assert 0 < payload["max_tvd_spent"] <= 0.1 + 1e-6 and payload["relaxed_tokens"] > 0
    if mode in ("eagle2", "static_tree"):
        assert payload["relaxed_tokens"] == 0


def test_auto_tree_is_chosen_once_and_keeps_seeds_reproducible(node, model, drafter):
    dec = decoding(node, drafter, "lantern_pp", tree="auto")
    first = run(node, model, dec, seed=44)
    second = run(node, model, dec, seed=44)
    assert torch.equal(first.args[0].tokens, second.args[0].tokens)
    tree = second.ui["lantern_stats"][0]["tree"]
    assert tree.startswith("auto_") and "calibrated" not in tree


@pytest.mark.parametrize("mode,relaxation", [("sjd", "lantern_pp"), ("sjd_coupled", "lantern_pp"),
                                             ("sjd_relaxed", "lantern"), ("sjd_relaxed", "lantern_pp"),
                                             ("sjd_relaxed", "gsd"), ("sjd_2d_relaxed", "lantern_pp")])
def test_jacobi_modes_need_no_drafter_and_report_their_window(node, model, mode, relaxation):
    dec = decoding(node, None, mode, jacobi_window=10, jacobi_init="random", sjd_relaxation=relaxation,
                   lantern_k=16, delta=0.2)
    out = run(node, model, dec, batch_size=2)
    tokens, text = out.args
    payload = out.ui["lantern_stats"][0]
    assert tokens.tokens.shape == (2, 256) and payload["mode"] == mode and payload["speculative"]
    assert payload["drafter"] == "none (training-free)" and "jacobi w10 (random init)" in payload["tree"]
    assert payload["forward_passes"] < 2 * 256 and payload["mean_accepted_length"] > 1.2
    heat = torch.tensor(payload["heatmap"])
    assert heat.shape == (16, 16) and int(heat.max()) > 1 and int(heat.min()) >= 1
    assert payload["tree"] in text and all(0 <= a <= 1 for a in payload["acceptance_by_depth"])
    if mode == "sjd_relaxed" and relaxation == "lantern":
        assert 0 < payload["max_tvd_spent"] <= 0.2 + 1e-6 and payload["relaxed_tokens"] > 0
    if mode != "sjd_relaxed":
        coupled = mode in ("sjd_coupled", "sjd_2d_relaxed")
        assert payload["relaxed_tokens"] == 0 and ("coupled" in payload["tree"]) == coupled
    if mode == "sjd_2d_relaxed":  # jacobi_rows left at 1: a geometry chosen on this machine, labelled lossy
        assert "relaxed 2-D (lossy): " in payload["tree"] and "(auto geometry)" in payload["tree"]
        assert "auto; geometry " in payload["tree"] and sum(payload["row_commits"]) > 0


def test_jacobi_auto_window_is_measured_once_and_keeps_seeds_reproducible(node, model):
    dec = decoding(node, None, "sjd_coupled", jacobi_window=0)
    first = run(node, model, dec, seed=45)
    second = run(node, model, dec, seed=45)
    assert torch.equal(first.args[0].tokens, second.args[0].tokens)
    window = second.ui["lantern_stats"][0]["tree"]
    assert "(auto; about" in window and "tok/s for plain AR" in window


def test_jacobi_neighbour_count_beyond_the_codebook_names_lantern_k(node, model):
    from lantern_pack.lantern_core.errors import LanternError

    dec = decoding(node, None, "sjd_relaxed", jacobi_window=4, lantern_k=5000)
    with pytest.raises(LanternError, match="lantern_k"):
        run(node, model, dec)


def test_a_batch_decodes_together_with_whole_batch_progress_previews_and_cancel(mm, node, model, drafter):
    """Batch 3 in one speculative run: progress counts the whole batch's tokens, previews show image 0, the
    stats carry each image's accepted length and say the heat map is image 0's, image i equals the single
    run with seed + i, and Cancel stops the whole batch within an iteration."""
    import comfy.cli_args
    import comfy.utils
    from comfy.cli_args import LatentPreviewMethod

    dec = decoding(node, drafter, "lantern_pp", tree="mc_sim_7b_63")
    calls = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: calls.append((value, total, preview)))
    comfy.cli_args.args.preview_method = LatentPreviewMethod.Auto
    try:
        out = run(node, model, dec, seed=20, batch_size=3)
    finally:
        comfy.cli_args.args.preview_method = LatentPreviewMethod.NoPreviews
        comfy.utils.set_progress_bar_global_hook(None)
    values = [c[0] for c in calls]
    assert values == sorted(values) and values[-1] == 3 * 256 and {c[1] for c in calls} == {3 * 256}
    assert len(values) < 3 * 256 / 1.2  # several tokens per step: one batched iteration per update
    assert any(c[2] is not None for c in calls)  # previews of image 0 while the batch runs
    tokens, text = out.args
    payload = out.ui["lantern_stats"][0]
    assert len(payload["accepted_length_per_image"]) == 3 and payload["heatmap_image"] == 0
    assert payload["batch_forwards"] < payload["forward_passes"] and "decoded together" in text
    alone = run(node, model, dec, seed=21, batch_size=1).args[0].tokens
    assert torch.equal(tokens.tokens[1], alone[0])

    seen = []

    def hook(value, total, preview, node_id=None):
        seen.append(value)
        if value >= 100:
            mm.interrupt_current_processing(True)

    comfy.utils.set_progress_bar_global_hook(hook)
    try:
        with pytest.raises(mm.InterruptProcessingException):
            run(node, model, dec, seed=20, batch_size=3)
    finally:
        comfy.utils.set_progress_bar_global_hook(None)
    assert seen[-1] >= 100 and seen[-2] < 100  # stopped at the iteration that saw the flag
    assert not mm.processing_interrupted()
