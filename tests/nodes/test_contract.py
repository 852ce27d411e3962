"""Node contract tests: the pack imported as ComfyUI imports it, nodes executed directly, with ComfyUI's
real model management, progress hook and interrupt flag."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
NODE_IDS = ["LanternModelLoader", "LanternDrafterLoader", "LanternConditioning", "LanternDecodingConfig", "LanternSampler",
            "LanternDecode", "LanternGenerate"]


SAMPLING = dict(cfg=3.0, temperature=1.0, top_k=0, top_p=1.0)


def test_schemas_are_prefixed_documented_and_tooltipped(node):
    assert sorted(node) == sorted(NODE_IDS)
    for node_id, cls in node.items():
        schema = cls.define_schema()
        assert schema.category.startswith("LANTERN"), node_id
        assert schema.display_name.startswith("Lantern: "), node_id
        assert len(schema.description) > 40, node_id
        for inp in schema.inputs:
            assert inp.tooltip and len(inp.tooltip) > 10, (node_id, inp.id)
        doc = REPO / "web" / "docs" / f"{node_id}.md"
        assert doc.is_file() and node_id in doc.read_text(), doc
    types = {o.io_type for cls in node.values() for o in cls.define_schema().outputs}
    assert {"LANTERN_MODEL", "LANTERN_DRAFTER", "LANTERN_COND", "LANTERN_DECODING", "LANTERN_TOKENS", "IMAGE",
            "STRING"} <= types


def test_loader_lists_the_embedded_model_first_and_shares_identical_loads(pack, node, model):
    options = node["LanternModelLoader"].define_schema().inputs[0].options
    assert options[0] == pack.nodes.paths.EMBEDDED
    again = node["LanternModelLoader"].execute(checkpoint=options[0], vq_tokenizer="auto", text_encoder="none",
                                               dtype="auto").args[0]
    assert again is model
    assert model.config.model_type == "c2i" and model.image_size == 128
    assert model.gpt is not model.vq  # separate ModelPatchers


@pytest.mark.parametrize("weights", ["int8", "fp8"])
def test_loader_quantizes_the_blocks_and_the_sampler_draws_with_them(pack, node, model, weights):
    """`weights` quantizes the target's blocks at load (a load of its own, shared by identical loads); the
    drafter loader and the sampler work with it, and a choice the node does not list is refused up front."""
    loader = node["LanternModelLoader"]
    kwargs = dict(checkpoint=pack.nodes.paths.EMBEDDED, vq_tokenizer="auto", text_encoder="none", dtype="fp32")
    quantized = loader.execute(**kwargs, weights=weights).args[0]
    assert quantized is not model and loader.execute(**kwargs, weights=weights).args[0] is quantized
    gpt = quantized.gpt.model
    assert gpt.layers[0].feed_forward.w13.weight.dtype == {"int8": torch.int8, "fp8": torch.float8_e4m3fn}[weights]
    assert gpt.output.weight.dtype == torch.float32  # the image head keeps the compute dtype
    assert quantized.gpt.model_size() < model.gpt.model_size() * 0.5  # ComfyUI's placement sees the smaller size
    drafter = node["LanternDrafterLoader"].execute(model=quantized, drafter=pack.nodes.paths.EMBEDDED).args[0]
    decoding = node["LanternDecodingConfig"].execute(
        mode="lantern", drafter=drafter, tree="auto", chain_length=4, custom_tree="[[0], [1], [0, 0]]", lantern_k=10,
        delta=0.1, lam=5.0, eagle_depth=4, eagle_top_k=4, eagle_nodes=12).args[0]
    tokens, text = run_sampler(node, quantized, seed=3, decoding=decoding).args
    assert tokens.tokens.shape == (1, 256) and "forward passes" in text
    assert "int4" in loader.validate_inputs(**kwargs, weights="int4")


def test_loader_keeps_an_8_bit_kv_cache_when_asked(pack, node, model):
    """`kv_cache` int8: a load of its own whose runs keep int8 keys and values (about a third of float32's bytes
    here), drawing with every mode the sampler offers; a choice the node does not list is refused up front."""
    loader = node["LanternModelLoader"]
    kwargs = dict(checkpoint=pack.nodes.paths.EMBEDDED, vq_tokenizer="auto", text_encoder="none", dtype="fp32")
    small = loader.execute(**kwargs, kv_cache="int8").args[0]
    assert small is not model and small.config.kv_cache == "int8" and model.config.kv_cache == "auto"
    cache, full = small.gpt.model.allocate_cache(1, 64), model.gpt.model.allocate_cache(1, 64)
    assert cache.int8 and cache.nbytes < 0.3 * full.nbytes
    tokens, text = run_sampler(node, small, seed=3).args
    assert tokens.tokens.shape == (1, 256) and "forward passes" in text
    assert "int4" in loader.validate_inputs(**kwargs, kv_cache="int4")


def test_loader_errors_name_the_folder(pack, node):
    from lantern_pack.lantern_core.errors import LanternError

    with pytest.raises(LanternError, match="lantern_checkpoints"):
        node["LanternModelLoader"].execute(checkpoint="c2i_B_256.pt", vq_tokenizer="auto", text_encoder="none",
                                           dtype="auto")


def test_conditioning_accepts_names_and_indices(node, model):
    cond = node["LanternConditioning"].execute(model=model, class_name="Cat, 3", prompt="").args[0]
    assert cond.labels.tolist() == [2, 3] and cond.description == ["cat", "rocket"]
    from lantern_pack.lantern_core.errors import ConfigError

    with pytest.raises(ConfigError, match="one of .*astronaut"):
        node["LanternConditioning"].execute(model=model, class_name="dog", prompt="")


def run_sampler(node, model, seed=0, batch_size=1, classes="rocket", **overrides):
    cond = node["LanternConditioning"].execute(model=model, class_name=classes, prompt="").args[0]
    kwargs = {**SAMPLING, **overrides}
    return node["LanternSampler"].execute(model=model, conditioning=cond, seed=seed, batch_size=batch_size, **kwargs)


def test_sampler_outputs_tokens_stats_and_heat_map(node, model):
    out = run_sampler(node, model, seed=5)
    tokens, text = out.args
    assert tokens.tokens.shape == (1, 256) and tokens.tokens.device.type == "cpu"
    assert "256 forward passes" in text and "tok/s" in text
    payload = out.ui["lantern_stats"][0]
    assert payload["mode"] == "ar" and payload["forward_passes"] == 256 and payload["conditions"] == ["rocket"]
    assert payload["heatmap"] == [[1] * 16] * 16
    assert payload["steps"] == {"graphs": "off", "replayed": 0, "eager": 255, "compile": "off", "fell_back": False,
                                "capture_error": ""}  # eager by choice on a CPU: no fallback, none said
    assert "fell back" not in text


def test_sampler_reserves_its_planned_run_and_refuses_one_that_does_not_fit(pack, node, model, monkeypatch):
    """The sampler tells ComfyUI's model management the dry run's peak for this very run (mode, batch, rows),
    and when the device has less free after placing the model it stops before the decoder allocates
    anything, saying what the run needs and what would fit."""
    sampler, runtime = pack.nodes.sampler, pack.nodes.runtime
    from lantern_pack.lantern_core.decoding.reservation import RunMemoryError

    asked = []
    place = runtime.place
    monkeypatch.setattr(runtime, "place", lambda patchers, memory_required=0: (
        asked.append(memory_required), place(patchers, memory_required))[1])
    decoding = node["LanternDecodingConfig"].execute(
        mode="sjd_coupled", drafter=None, tree="auto", chain_length=4, custom_tree="[[0]]", lantern_k=10, delta=0.1,
        lam=5.0, eagle_depth=4, eagle_top_k=4, eagle_nodes=12, jacobi_window=8, compile="off").args[0]
    run_sampler(node, model, seed=2, batch_size=2, decoding=decoding)
    plain = asked[-1]
    run_sampler(node, model, seed=2, batch_size=1)
    assert plain > asked[-1] * 1.5  # two images of coupled SJD (noise tables, laws) against one of AR

    room = asked[-1]
    monkeypatch.setattr(runtime, "free_memory", lambda device: room)  # room for one AR image only
    monkeypatch.setattr(sampler, "_decode", lambda *a, **k: pytest.fail("the decoder ran"))
    with pytest.raises(RunMemoryError) as caught:
        run_sampler(node, model, seed=2, batch_size=2, decoding=decoding)
    text = str(caught.value)
    assert "coupled jacobi w8" in text and "batch 2" in text and "mode 'ar' at batch_size 1" in text, text
    assert "free memory on the device" in text


def test_a_failing_memory_plan_never_blocks_a_run(pack, node, model, monkeypatch, caplog):
    """The dry run is an estimate: if it fails (a bug), the run goes ahead without a reservation and the log
    says why."""
    def broken(run):
        raise RuntimeError("no meta kernel")

    monkeypatch.setattr(pack.nodes.sampler, "plan_run_memory", broken)
    tokens, _ = run_sampler(node, model, seed=4).args
    assert tokens.tokens.shape == (1, 256)
    assert any("could not plan" in r.getMessage() and "no meta kernel" in (r.exc_text or "") for r in caplog.records)
    caplog.clear()  # the autouse check (tests/nodes/conftest.py) fails any other test that falls back


def test_same_seed_same_tokens_and_batch_matches_single_runs(node, model):
    a = run_sampler(node, model, seed=9).args[0].tokens
    b = run_sampler(node, model, seed=9).args[0].tokens
    assert torch.equal(a, b)
    batch = run_sampler(node, model, seed=8, batch_size=2).args[0].tokens
    assert torch.equal(batch[1], a[0])


def test_decode_gives_comfy_images(node, model):
    tokens = run_sampler(node, model, seed=1, batch_size=2, classes="cat").args[0]
    image = node["LanternDecode"].execute(tokens=tokens).args[0]
    assert image.shape == (2, 128, 128, 3) and image.dtype == torch.float32 and image.device.type == "cpu"
    assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0 and float(image.std()) > 0.02


def test_generate_node_equals_the_three_node_chain(node, model):
    out = node["LanternGenerate"].execute(model=model, class_name="coffee", prompt="", seed=4, batch_size=1,
                                          **SAMPLING)
    tokens = run_sampler(node, model, seed=4, classes="coffee").args[0]
    assert torch.equal(out.args[0], node["LanternDecode"].execute(tokens=tokens).args[0])
    assert out.ui["lantern_stats"][0]["image_tokens"] == 256


def test_progress_counts_image_tokens_and_previews_follow_the_setting(mm, node, model):
    import comfy.cli_args
    import comfy.utils
    from comfy.cli_args import LatentPreviewMethod

    calls = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: calls.append((value, total, preview)))
    try:
        run_sampler(node, model, seed=2)
        assert [c[0] for c in calls] == list(range(1, 257)) and {c[1] for c in calls} == {256}
        assert all(c[2] is None for c in calls)  # previews are off by default, like ComfyUI's
        calls.clear()
        comfy.cli_args.args.preview_method = LatentPreviewMethod.Auto
        run_sampler(node, model, seed=2)
        previews = [c for c in calls if c[2] is not None]
        assert 4 <= len(previews) <= 16
        fmt, image, size = previews[0][2]
        assert fmt == "JPEG" and image.size == (128, 128)
    finally:
        comfy.cli_args.args.preview_method = LatentPreviewMethod.NoPreviews
        comfy.utils.set_progress_bar_global_hook(None)


def test_cancel_stops_within_a_step_and_the_next_run_succeeds(mm, node, model):
    import comfy.utils

    seen = []

    def hook(value, total, preview, node_id=None):
        seen.append(value)
        if value == 10:
            mm.interrupt_current_processing(True)

    comfy.utils.set_progress_bar_global_hook(hook)
    try:
        with pytest.raises(mm.InterruptProcessingException):
            run_sampler(node, model, seed=3)
    finally:
        comfy.utils.set_progress_bar_global_hook(None)
    assert seen[-1] == 10  # stopped right after the step that saw the flag
    assert not mm.processing_interrupted()
    assert run_sampler(node, model, seed=3).args[0].tokens.shape == (1, 256)


def test_models_are_registered_with_model_management(mm, node, model):
    run_sampler(node, model, seed=0)
    loaded = [m.model for m in mm.current_loaded_models]
    assert model.gpt in loaded
    mm.unload_all_models()
    assert model.gpt not in [m.model for m in mm.current_loaded_models]
    assert run_sampler(node, model, seed=0).args[0].tokens.shape == (1, 256)  # reloads on demand


def test_loader_validation_names_the_folder_before_running(pack, node):
    loader = node["LanternModelLoader"]
    embedded = pack.nodes.paths.EMBEDDED
    assert loader.validate_inputs(checkpoint=embedded, vq_tokenizer="auto", text_encoder="none", dtype="auto") is True
    message = loader.validate_inputs(checkpoint="c2i_B_256.pt", vq_tokenizer="auto", text_encoder="none",
                                     dtype="auto")
    assert isinstance(message, str) and "c2i_B_256.pt" in message and "lantern_checkpoints" in message
    message = loader.validate_inputs(checkpoint=embedded, vq_tokenizer="vq_ds16_c2i.pt", text_encoder="none",
                                     dtype="auto")
    assert "lantern_vq" in message
