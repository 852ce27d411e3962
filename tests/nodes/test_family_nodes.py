"""Prompted families through the nodes: tiny Janus-Pro and Anole (Chameleon) folders, written by
transformers' own classes as downloaded model folders, placed in models/lantern/checkpoints, recognised
by Lantern: Load Model, prompted through Lantern: Conditioning with each family's template and CFG row,
sampled in AR and training-free Jacobi modes, and decoded to IMAGE."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.loading.families import load_prompted
from lantern_core.decoding.generate import generate
from lantern_core.decoding.sampling import make_generators
from tiny_emu3 import reference_emu3, write_hf_folder, write_original_folder
from tiny_lumina2 import save_lumina2_folder
from tiny_families import save_chameleon_folder, save_chameleon_vqgan, save_janus_folder, write_released_anole_drafter

JANUS, ANOLE, ANOLE_NO_VQ, LUMINA = "Janus-Pro-tiny", "Anole-tiny", "Anole-tiny-no-vqgan", "Lumina-mGPT-tiny"
EMU3_HF, EMU3, EMU3_NO_VQ = "Emu3-Gen-hf-tiny", "Emu3-Gen-tiny", "Emu3-Gen-tiny-no-vision-tokenizer"
LUMINA2, LUMINA2_NO_VQ = "Lumina-mGPT-2.0-tiny", "Lumina-mGPT-2.0-tiny-no-movqgan"


@pytest.fixture(scope="module")
def folders(pack):
    import folder_paths

    root = Path(folder_paths.get_folder_paths("lantern_checkpoints")[0])
    save_janus_folder(root / JANUS, seed=1, grid=4)
    reference = save_chameleon_folder(root / ANOLE, seed=2)
    save_chameleon_vqgan(root / ANOLE / "tokenizer" / "vqgan.ckpt")
    drafters = Path(folder_paths.get_folder_paths("lantern_drafters")[0])
    write_released_anole_drafter(drafters / "anole_drafter", reference)
    save_chameleon_folder(root / ANOLE_NO_VQ, seed=3)
    save_chameleon_folder(root / LUMINA, seed=4, lumina=True)
    save_chameleon_vqgan(root / LUMINA / "vqgan.ckpt")
    emu3 = reference_emu3()
    write_hf_folder(root / EMU3_HF, emu3, published_names=True)
    write_original_folder(root / EMU3, emu3)
    write_original_folder(root / EMU3_NO_VQ, emu3, with_vision_tokenizer=False)
    save_lumina2_folder(root / LUMINA2)
    save_lumina2_folder(root / LUMINA2_NO_VQ, with_movqgan=False)
    return root


def load(node, name, vq="auto"):
    return node["LanternModelLoader"].execute(checkpoint=name + "/", vq_tokenizer=vq, text_encoder="none",
                                              dtype="fp32").args[0]


def sample(node, model, prompt, decoding=None, **overrides):
    cond = node["LanternConditioning"].execute(model=model, class_name="0", prompt=prompt).args[0]
    kwargs = {**dict(cfg=5.0, temperature=0.0, top_k=0, top_p=1.0, seed=0, batch_size=2), **overrides}
    return node["LanternSampler"].execute(model=model, conditioning=cond, decoding=decoding, **kwargs)


def test_loader_lists_family_folders_and_names_missing_parts(node, folders):
    loader = node["LanternModelLoader"]
    options = {i.id: i.options for i in loader.define_schema().inputs if hasattr(i, "options")}
    assert {JANUS + "/", ANOLE + "/", ANOLE_NO_VQ + "/"} <= set(options["checkpoint"])
    assert loader.validate_inputs(checkpoint=JANUS + "/", vq_tokenizer="auto", text_encoder="none",
                                  dtype="auto") is True
    message = loader.validate_inputs(checkpoint=ANOLE_NO_VQ + "/", vq_tokenizer="auto", text_encoder="none",
                                     dtype="auto")
    assert "vqgan.ckpt" in message and ANOLE_NO_VQ in message
    (folders.parent / "vq").mkdir(parents=True, exist_ok=True)
    (folders.parent / "vq" / "other.safetensors").write_bytes(b"")
    message = loader.validate_inputs(checkpoint=JANUS + "/", vq_tokenizer="other.safetensors",
                                     text_encoder="none", dtype="auto")
    assert "'auto'" in message and "Janus" in message


def test_janus_folder_runs_through_the_nodes_like_the_library(node, folders):
    model = load(node, JANUS)
    assert model.family == "janus" and model.prompt_encoder is not None and model.text_encoder is None
    assert load(node, JANUS) is model  # identical loads share one copy
    from lantern_pack.lantern_core.errors import LanternError

    with pytest.raises(LanternError, match="prompt"):
        node["LanternConditioning"].execute(model=model, class_name="0", prompt="   ")
    cond = node["LanternConditioning"].execute(model=model, class_name="0", prompt="a red cat").args[0]
    ids, uncond = cond.prompt.prompt_ids[0], cond.prompt.uncond_ids[0]
    assert ids.shape == uncond.shape and ids[0] == uncond[0] and ids[-1] == uncond[-1]  # BOS ... <begin_of_image>
    assert (uncond[1:-1] == model.prompt_encoder.tokenizer.token_to_id("<｜▁pad▁｜>")).all()

    tokens, stats = sample(node, model, "a red cat").args[:2]
    other = sample(node, model, "a blue dog").args[0]
    assert tokens.tokens.shape == (2, 16) and torch.equal(tokens.tokens[0], tokens.tokens[1])
    assert not torch.equal(tokens.tokens, other.tokens) and "ar: 2 x 16 tokens" in stats
    # the same run straight through lantern_core gives the same tokens
    loaded = load_prompted(folders / JANUS)
    condition = loaded.encoder.encode(["a red cat"])
    expected = generate(loaded.model, Condition(**{f: getattr(condition, f).repeat(2, 1) for f in
                                                   ("prompt_ids", "prompt_mask", "uncond_ids", "uncond_mask")}),
                        SamplingConfig(cfg_scale=5.0, temperature=0.0), make_generators(0, 2, torch.device("cpu")))
    assert torch.equal(tokens.tokens, expected.tokens)

    image = node["LanternDecode"].execute(tokens=tokens).args[0]
    side = 4 * model.vq.model.config.downsample
    assert image.shape == (2, side, side, 3) and 0 <= float(image.min()) and float(image.max()) <= 1


@pytest.mark.parametrize("mode", ["sjd", "sjd_coupled"])
def test_training_free_modes_on_janus_match_greedy_ar(node, folders, mode):
    model = load(node, JANUS)
    ar = sample(node, model, "a photo of the sky").args[0]
    dec = node["LanternDecodingConfig"].execute(mode=mode, drafter=None, tree="auto", chain_length=4,
                                                custom_tree="[[0]]", lantern_k=10, delta=0.1, lam=5.0,
                                                eagle_depth=4, eagle_top_k=4, eagle_nodes=12).args[0]
    jac, stats = sample(node, model, "a photo of the sky", decoding=dec).args[:2]
    assert torch.equal(jac.tokens, ar.tokens) and stats.startswith(mode)


def test_anole_folder_with_its_vqgan_generates_images(node, folders):
    model = load(node, ANOLE)
    assert model.family == "chameleon" and model.config.grid_size == 32
    tokens = sample(node, model, "a painting of a dog", cfg=3.0, temperature=1.0, top_k=20, batch_size=1,
                    seed=7).args[0]
    again = sample(node, model, "a painting of a dog", cfg=3.0, temperature=1.0, top_k=20, batch_size=1,
                   seed=7).args[0]
    assert tokens.tokens.shape == (1, 1024) and torch.equal(tokens.tokens, again.tokens)
    assert tokens.tokens.unique().numel() > 8  # sampled, not collapsed
    image = node["LanternDecode"].execute(tokens=tokens).args[0]
    assert image.shape == (1, 32 * model.vq.model.config.downsample, 32 * model.vq.model.config.downsample, 3)


def test_released_anole_drafter_through_the_nodes(node, folders):
    """jadohu/anole_drafter's layout in models/lantern/drafters is listed, loads against the Anole folder
    (refused for Janus), and greedy LANTERN++ (static tree, lambda = 1) reproduces greedy AR."""
    from lantern_pack.lantern_core.errors import LanternError

    anole, janus = load(node, ANOLE), load(node, JANUS)
    loader = node["LanternDrafterLoader"]
    assert "anole_drafter/" in loader.define_schema().inputs[1].options
    with pytest.raises(LanternError, match="Chameleon target .* janus target"):
        loader.execute(model=janus, drafter="anole_drafter/")
    drafter = loader.execute(model=anole, drafter="anole_drafter/").args[0]
    assert drafter.config.family == "chameleon" and drafter.config.vocab_size == 64
    dec = node["LanternDecodingConfig"].execute(mode="lantern_pp", drafter=drafter, tree="naive_extend_57",
                                                chain_length=4, custom_tree="[[0]]", lantern_k=5, delta=0.1,
                                                lam=1.0, eagle_depth=4, eagle_top_k=4, eagle_nodes=12).args[0]
    kwargs = dict(cfg=3.0, batch_size=1)
    ar = sample(node, anole, "a painting of a dog", **kwargs).args[0]
    spec, stats = sample(node, anole, "a painting of a dog", decoding=dec, **kwargs).args[:2]
    assert torch.equal(spec.tokens, ar.tokens) and stats.startswith("lantern_pp")


def test_lumina_folder_draws_rows_with_end_tokens_and_decodes(node, folders):
    """Lumina-mGPT at its default 768 px: 48 rows of 48 codes + a forced end-of-row token each; the decode
    drops those tokens; coupled SJD keeps the layout."""
    model = load(node, LUMINA)
    assert model.family == "chameleon" and model.config.row_end and model.config.grid_size == 48
    dec = node["LanternDecodingConfig"].execute(mode="sjd_coupled", drafter=None, tree="auto", chain_length=4,
                                                custom_tree="[[0]]", lantern_k=10, delta=0.1, lam=5.0,
                                                eagle_depth=4, eagle_top_k=4, eagle_nodes=12).args[0]
    tokens = sample(node, model, "a red cat", decoding=dec, cfg=3.0, temperature=1.0, top_k=20, batch_size=1,
                    seed=3).args[0]
    assert tokens.tokens.shape == (1, 48 * 49)
    grid = tokens.tokens.view(48, 49)
    row_end = model.config.vocab_size - 1
    assert (grid[:, -1] == row_end).all() and (grid[:, :-1] != row_end).all()
    image = node["LanternDecode"].execute(tokens=tokens).args[0]
    side = 48 * model.vq.model.config.downsample
    assert image.shape == (1, side, side, 3)


def test_lumina_draws_the_size_chosen_on_the_conditioning_node_and_other_families_refuse_theirs(node, pack, folders):
    """image_size 1024x576 on Lumina-mGPT: 36 rows of 64 codes (+ end-of-row), the prompt with that size,
    the stats heat map in those rows, an image 1024 wide and 576 high; the model's own size needs no
    reload (the same weights). Janus-Pro draws only its 384x384 and says so."""
    model = load(node, LUMINA)
    cond = node["LanternConditioning"].execute(model=model, class_name="0", prompt="a red cat",
                                               image_size="1024x576").args[0]
    assert cond.grid == (36, 64)
    dec = node["LanternDecodingConfig"].execute(mode="sjd_coupled", drafter=None, tree="auto", chain_length=4,
                                                custom_tree="[[0]]", lantern_k=10, delta=0.1, lam=5.0,
                                                eagle_depth=4, eagle_top_k=4, eagle_nodes=12).args[0]
    out = node["LanternSampler"].execute(model=model, conditioning=cond, decoding=dec, cfg=3.0, temperature=1.0,
                                         top_k=20, top_p=1.0, seed=4, batch_size=1)
    tokens = out.args[0]
    assert tokens.tokens.shape == (1, 36 * 65)
    grid = tokens.tokens.view(36, 65)
    row_end = model.config.vocab_size - 1
    assert (grid[:, -1] == row_end).all() and (grid[:, :-1] != row_end).all()
    heatmap = out.ui["lantern_stats"][0]["heatmap"]
    assert len(heatmap) == 36 and {len(r) for r in heatmap} == {65}
    image = node["LanternDecode"].execute(tokens=tokens).args[0]
    step = model.vq.model.config.downsample  # 16 px per code for the real VQGAN, the tiny one's fewer
    assert image.shape == (1, 36 * step, 64 * step, 3)
    preview = pack.nodes.sampler._preview_decoder(model, model.config.with_grid(36, 64), torch.device("cpu"))
    _, picture, _ = preview(tokens.tokens, 65 * 10 + 3)  # ten rows and three codes done
    assert picture.size == (64 * step, 36 * step)  # the live preview is the wide image, its lower rows greyed
    assert model.config.grid_shape == (48, 48)  # the loaded model is untouched
    assert node["LanternConditioning"].execute(model=model, class_name="0", prompt="a red cat",
                                               image_size="768x768").args[0].grid is None  # its own size
    janus = load(node, JANUS)
    with pytest.raises(pack.lantern_core.errors.ConfigError, match="draws the one size its weights were trained") \
            as caught:
        node["LanternConditioning"].execute(model=janus, class_name="0", prompt="a cat", image_size="768x768")
    side = janus.config.grid_size * janus.vq.model.config.downsample
    assert f"auto or {side}x{side}" in str(caught.value)


def test_emu3_folders_in_both_layouts_draw_the_chosen_size_and_decode(node, folders):
    """Emu3-Gen-hf (the tokenizer inside) and the original Emu3-Gen (vision_tokenizer/ subfolder) load through
    Lantern: Load Model; a size from the Conditioning node (8-pixel codes: 32x24 is 3 rows of 4) names its grid in
    the prompt; coupled SJD keeps the end-of-line layout; the decode is that wide. The original layout without its
    vision tokenizer is refused before anything runs, naming the subfolder."""
    loader = node["LanternModelLoader"]
    message = loader.validate_inputs(checkpoint=EMU3_NO_VQ + "/", vq_tokenizer="auto", text_encoder="none",
                                     dtype="auto")
    assert "vision_tokenizer/" in message and EMU3_NO_VQ in message
    assert "comes with" in loader.validate_inputs(checkpoint=EMU3_HF + "/", vq_tokenizer="other.safetensors",
                                                  text_encoder="none", dtype="auto")
    dec = node["LanternDecodingConfig"].execute(mode="sjd_coupled", drafter=None, tree="auto", chain_length=4,
                                                custom_tree="[[0]]", lantern_k=10, delta=0.1, lam=5.0,
                                                eagle_depth=4, eagle_top_k=4, eagle_nodes=12).args[0]
    for name, layout in ((EMU3_HF, "hf-emu3"), (EMU3, "emu3")):
        model = load(node, name)
        assert model.family == "chameleon" and model.layout == layout and not model.config.qk_norm
        cond = node["LanternConditioning"].execute(model=model, class_name="0", prompt="a red cat",
                                                   image_size="32x24").args[0]
        assert cond.grid == (3, 4)
        bare = node["LanternConditioning"].execute(model=model, class_name="0", prompt="a red cat",
                                                   image_size="32x24", quality_suffix=False).args[0]
        typed = node["LanternConditioning"].execute(model=model, class_name="0",
                                                    prompt="a red cat masterpiece, film grained, best quality.",
                                                    image_size="32x24").args[0]
        ids = lambda c: c.prompt.prompt_ids[0][c.prompt.prompt_mask[0]].tolist()  # noqa: E731
        assert len(ids(bare)) < len(ids(cond)) and ids(typed) == ids(cond)  # optional, and never twice
        tokens = node["LanternSampler"].execute(model=model, conditioning=cond, decoding=dec, cfg=3.0,
                                                temperature=1.0, top_k=20, top_p=1.0, seed=4, batch_size=1).args[0]
        grid = tokens.tokens.view(3, 5)
        eol = model.config.vocab_size - 1
        assert (grid[:, -1] == eol).all() and (grid[:, :-1] != eol).all()
        image = node["LanternDecode"].execute(tokens=tokens).args[0]
        step = model.vq.model.config.downsample
        assert image.shape == (1, 3 * step, 4 * step, 3)


def test_lumina2_folder_draws_the_chosen_size_in_8_pixel_codes(node, folders):
    """Lumina-mGPT 2.0 through the nodes: its MoVQGAN from the folder (a folder without one is refused before
    anything runs, naming movqgan_270M.ckpt), a size from the Conditioning node in 32-pixel steps of 4 codes, its
    end-of-row layout under coupled SJD, and the decode at that size."""
    message = node["LanternModelLoader"].validate_inputs(checkpoint=LUMINA2_NO_VQ + "/", vq_tokenizer="auto",
                                                         text_encoder="none", dtype="auto")
    assert "movqgan_270M.ckpt" in message and LUMINA2_NO_VQ in message
    model = load(node, LUMINA2)
    assert model.layout == "hf-lumina2" and model.config.qk_norm and model.config.grid_shape == (96, 96)
    cond = node["LanternConditioning"].execute(model=model, class_name="0", prompt="a red cat",
                                               image_size="64x32").args[0]
    assert cond.grid == (4, 8)
    dec = node["LanternDecodingConfig"].execute(mode="sjd_coupled", drafter=None, tree="auto", chain_length=4,
                                                custom_tree="[[0]]", lantern_k=10, delta=0.1, lam=5.0,
                                                eagle_depth=4, eagle_top_k=4, eagle_nodes=12).args[0]
    tokens = node["LanternSampler"].execute(model=model, conditioning=cond, decoding=dec, cfg=4.0, temperature=1.0,
                                            top_k=20, top_p=1.0, seed=4, batch_size=1).args[0]
    grid = tokens.tokens.view(4, 9)
    eol = model.config.vocab_size - 1
    assert (grid[:, -1] == eol).all() and (grid[:, :-1] != eol).all()
    image = node["LanternDecode"].execute(tokens=tokens).args[0]
    step = model.vq.model.config.downsample
    assert image.shape == (1, 4 * step, 8 * step, 3)
