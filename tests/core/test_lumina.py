"""Lumina-mGPT on the shared Chameleon trunk: a tiny Chameleon folder written by transformers with
Lumina's vocabulary and config (recognised from config.json, never from the folder's name) loads as
Lumina (end-of-row token as the last image code,
size tokens in the prompt, image-start-triggered unconditional row); greedy images equal a reference
loop that follows Lumina's generator step by step (CFG on raw logits, forced end-of-row tokens, non-image
tokens suppressed) over transformers' own model; every decoder keeps the row layout when sampling."""
from __future__ import annotations

import pytest
import torch

from lantern_core.config import SamplingConfig
from lantern_core.errors import ConfigError
from lantern_core.image_sizes import lumina_sizes
from lantern_core.loading.families import is_lumina, load_prompted
from lantern_core.prompts import lumina_format, lumina_size_token
from lantern_core.decoding.generate import generate
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.layout import image_codes
from lantern_core.models.drafter import EagleDrafter
from lantern_core.config import DrafterConfig
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding.acceptance.neighbors import build_neighbors
from lantern_core.decoding.acceptance.relaxation import Relaxation
from lantern_core.decoding.trees.specs import NAIVE_EXTEND_57
from tests.tiny_families import (IMAGE_CODES, chameleon_vocab, lumina_reference_greedy, save_chameleon_folder,
                                 save_chameleon_vqgan)

GRID = 4  # 4 rows of 4 codes + an end-of-row token: 20 image tokens


@pytest.fixture(scope="module")
def lumina(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-xllmx")
    reference = save_chameleon_folder(folder, seed=12, lumina=True)
    save_chameleon_vqgan(folder / "vqgan.ckpt")
    return folder, reference, load_prompted(folder, grid_size=GRID, max_prompt_tokens=48)


def test_lumina_folder_is_recognised_with_its_layout_and_prompt(lumina):
    folder, _, loaded = lumina
    config, vocab = loaded.config, chameleon_vocab(12)
    assert loaded.source_format == "hf-lumina" and config.row_end and config.vocab_size == IMAGE_CODES + 1
    assert config.num_image_tokens == GRID * (GRID + 1)
    assert int(loaded.model.image.token_ids[-1]) == loaded.encoder.tokenizer.token_to_id("<reserved08799>")
    cond = loaded.encoder.encode(["a red cat"])
    size = loaded.encoder.tokenizer.token_to_id("<reserved08802>")  # 4 tokens x 16 px = 64 px: 8800 + 64 / 32
    start = vocab["<racm3:break>"]
    assert cond.prompt_ids[0, -4:].tolist() == [vocab["<reserved08706>"], start, size, size]
    assert cond.prompt_ids[0, 0] == vocab["<s>"]
    assert cond.uncond_ids[0][cond.uncond_mask[0]].tolist() == [start, size, size]  # no BOS
    text = loaded.encoder.format.template.format(prompt="x")
    assert text.startswith("Generate an image of 64x64 according to the following prompt:\n")
    assert not is_lumina(folder.parent / "Lumina-mGPT-7B-768", {})  # a folder's name is no evidence


def test_lumina_is_recognised_from_its_files_not_its_folder_name(tmp_path):
    """A hub-cache snapshot is named by a commit hash: Lumina there loads as Lumina, from its config.json
    (ChameleonXLLMX architectures, or the z_loss_weight field that Alpha-VLLM's config class writes, which
    stays when someone renames the architectures to transformers' class); Anole in a folder named
    "lumina-mgpt" loads as Anole."""
    import json

    published = {"architectures": ["ChameleonXLLMXForConditionalGeneration"], "model_type": "chameleon"}
    anole = {"architectures": ["ChameleonForConditionalGeneration"], "model_type": "chameleon"}  # leloy/Anole-7b
    assert is_lumina(tmp_path, published) and not is_lumina(tmp_path / "Lumina-mGPT-7B-768", anole)
    assert is_lumina(tmp_path, {**anole, "z_loss_weight": 1e-5})
    snapshot = tmp_path / "models--Alpha-VLLM--Lumina-mGPT-7B-768" / "snapshots"
    snapshot = snapshot / "4f1c0e9b2d7a63e5c8f1a0b4d6e2c9f7a1b3d5e8"
    save_chameleon_folder(snapshot, seed=12, lumina=True)
    assert load_prompted(snapshot, grid_size=GRID).source_format == "hf-lumina"
    cfg = json.loads((snapshot / "config.json").read_text())
    cfg["architectures"] = ["ChameleonForConditionalGeneration"]
    (snapshot / "config.json").write_text(json.dumps(cfg))
    renamed = load_prompted(snapshot, grid_size=GRID)
    assert renamed.source_format == "hf-lumina" and renamed.config.row_end
    copy = tmp_path / "lumina-mgpt"
    save_chameleon_folder(copy, seed=3)
    loaded = load_prompted(copy, grid_size=GRID)
    assert loaded.source_format == "hf-chameleon" and not loaded.config.row_end
    assert "Generate an image" not in loaded.encoder.format.template.format(prompt="x")  # Anole's template


def reference_greedy(reference, loaded, prompt: str, cfg: float) -> list[int]:
    """Lumina's generator, step by step, on transformers' model at the loaded size (lumina_reference_greedy)."""
    return lumina_reference_greedy(reference, loaded.encoder, loaded.config, loaded.model.image.token_ids[:-1],
                                   prompt, cfg)


def test_greedy_lumina_image_equals_the_reference_generator(lumina):
    _, reference, loaded = lumina
    for prompt in ("a red cat", "a painting of the sky"):
        condition = loaded.encoder.encode([prompt])
        with torch.no_grad():
            ours = generate(loaded.model, condition, SamplingConfig(cfg_scale=3.0, temperature=0.0),
                            make_generators(0, 1, "cpu")).tokens[0]
        expected = reference_greedy(reference, loaded, prompt, 3.0)
        assert loaded.model.image.token_ids[ours].tolist() == expected
        assert len(set(expected)) > 4


def layout_ok(config, tokens: torch.Tensor) -> bool:
    index = torch.arange(tokens.shape[1])
    row_end = (index + 1) % config.row_stride == 0
    eol = config.vocab_size - 1
    return bool((tokens[:, row_end] == eol).all() and (tokens[:, ~row_end] != eol).all())


@pytest.mark.parametrize("shape", [(GRID, GRID), (4, 6), (6, 2)], ids=["square", "wide", "tall"])
def test_every_decoder_keeps_the_row_layout_and_greedy_modes_equal_ar(lumina, shape):
    """On square and non-square grids (a view of the same weights: Lumina-mGPT's other sizes)."""
    _, _, loaded = lumina
    model = loaded.model.with_grid(*shape)
    config = model.config
    assert config.grid_shape == shape and config.num_image_tokens == shape[0] * (shape[1] + 1)
    encoder = loaded.encoder.with_format(lumina_format(*shape))
    condition = encoder.encode(["a red cat", "a photo of a dog on the grass", "the sky"])
    drafter = EagleDrafter(DrafterConfig.for_target(config)).eval()
    drafter.init_from_target(model, torch.Generator().manual_seed(2), std=0.2)
    runs = {
        "ar": lambda s, g: generate(model, condition, s, g),
        "sjd": lambda s, g: jacobi_generate(model, condition, s, JacobiConfig(window=4), g),
        "sjd_coupled": lambda s, g: jacobi_generate(model, condition, s, JacobiConfig(window=4, coupled=True), g),
        "static_tree": lambda s, g: speculative_generate(
            model, drafter, condition, s, SpeculativeConfig(tree="static", static_tree=NAIVE_EXTEND_57), g),
    }
    # relaxed modes read a (codebook, k) neighbour table; the end-of-row code is appended as its own neighbour
    neighbors = build_neighbors(loaded.vq.quantize.embedding.weight, 4)
    relaxed = {
        "sjd_relaxed": lambda s, g: jacobi_generate(model, condition, s, JacobiConfig(
            window=4, relaxation=Relaxation(k=4, lam=1.0)), g, neighbors),
        "lantern_pp": lambda s, g: speculative_generate(model, drafter, condition, s, SpeculativeConfig(
            tree="static", static_tree=NAIVE_EXTEND_57, relaxation=Relaxation(k=4, lam=1.0)), g, neighbors),
        "lantern": lambda s, g: speculative_generate(model, drafter, condition, s, SpeculativeConfig(
            tree="dynamic", relaxation=Relaxation(k=4, delta=0.0)), g, neighbors),
    }
    greedy = SamplingConfig(cfg_scale=3.0, temperature=0.0)
    sampled = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)
    with torch.no_grad():
        base = runs["ar"](greedy, make_generators(0, 3, "cpu")).tokens
        for name, run in {**runs, **relaxed}.items():  # lambda 1 / delta 0: relaxed modes are exact
            assert torch.equal(run(greedy, make_generators(0, 3, "cpu")).tokens, base), name
            tokens = run(sampled, make_generators(5, 3, "cpu")).tokens
            assert layout_ok(config, tokens), name
            assert tokens.unique().numel() > 8, name
        proactive = JacobiConfig(window=4, coupled=True, proactive=3, proactive_depth=2)
        assert torch.equal(jacobi_generate(model, condition, greedy, proactive, make_generators(0, 3, "cpu")).tokens,
                           base)  # leaves at an end-of-row position hold no mass and are never accepted
        tokens = jacobi_generate(model, condition, sampled, proactive, make_generators(5, 3, "cpu")).tokens
        assert layout_ok(config, tokens) and tokens.unique().numel() > 8
        rows = JacobiConfig(window=4, coupled=True, rows=3, row_window=3, row_commit=True, row_lead=0)
        for sampling in (greedy, sampled):  # relaxed 2-D: each row's end-of-row token is its last column
            tokens = jacobi_generate(model, condition, sampling, rows, make_generators(5, 3, "cpu")).tokens
            assert layout_ok(config, tokens) and tokens.unique().numel() > 8
    codes, grid = image_codes(config, base)
    assert grid == shape and codes.shape == (3, shape[0] * shape[1]) and int(codes.max()) < IMAGE_CODES
    assert loaded.vq.decode(codes, grid).shape == (3, 3, shape[0] * loaded.vq.config.downsample,
                                                   shape[1] * loaded.vq.config.downsample)
    rows = generate(model, condition, greedy, make_generators(0, 3, "cpu")).acceptance_grid(0)
    assert len(rows) == shape[0] and all(len(r) == shape[1] + 1 for r in rows)  # the heat map's rows


def test_a_non_square_lumina_image_equals_the_reference_generator_at_that_size(lumina, tmp_path):
    """Loaded at a wide size: the prompt names width x height and carries the height's and the width's size
    tokens, rows close after `cols` codes, and greedy tokens equal Lumina's generator step by step (on a
    vocabulary that holds those size tokens)."""
    folder, reference, _ = lumina
    loaded = load_prompted(folder, image_size=(96, 64), max_prompt_tokens=64)  # 4 rows of 6 codes
    assert loaded.config.grid_shape == (4, 6) and loaded.model.config.row_stride == 7
    fmt = loaded.encoder.format
    assert fmt.template.startswith("Generate an image of 96x64 ")
    assert fmt.suffix[-2:] == (lumina_size_token(64), lumina_size_token(96))  # height, then width
    for prompt in ("a red cat", "a painting of the sky"):
        condition = loaded.encoder.encode([prompt])
        with torch.no_grad():
            ours = generate(loaded.model, condition, SamplingConfig(cfg_scale=3.0, temperature=0.0),
                            make_generators(0, 1, "cpu")).tokens[0]
        expected = lumina_reference_greedy(reference, loaded.encoder, loaded.config,
                                           loaded.model.image.token_ids[:-1], prompt, 3.0)
        assert loaded.model.image.token_ids[ours].tolist() == expected
    with pytest.raises(ConfigError, match="32-pixel steps"):
        load_prompted(folder, image_size=(80, 64))
    with pytest.raises(ConfigError, match="aspect ratio"):
        load_prompted(folder, image_size=(320, 64))


def test_lumina_sizes_follow_alpha_vllms_bucket_list():
    sizes = lumina_sizes(768)
    assert len(sizes) == 73 and sizes[0] == (1536, 384) and sizes[-1] == (384, 1536)
    assert {(768, 768), (1024, 576), (576, 1024), (1408, 416)} <= set(sizes)
    assert all(w % 32 == 0 and h % 32 == 0 and w * h <= 768 * 768 and max(w, h) <= 4 * min(w, h) for w, h in sizes)
    assert len(lumina_sizes(512)) == 49 and (512, 512) in lumina_sizes(512)


def test_full_vocabularies_must_put_luminas_tokens_at_its_hard_coded_ids(tmp_path):
    """Lumina's generator uses raw ids (end-of-row 8803, sizes 8804 + px / 32); on a full 65,536-token
    vocabulary the names we look up must sit there, else the folder is refused with the ids named."""
    from lantern_core.errors import CheckpointError
    from lantern_core.loading.families import check_lumina_ids
    from lantern_core.prompts import load_tokenizer
    from tests.tiny_families import write_tokenizer

    def vocabulary(shift: int) -> dict[str, int]:
        names = {i: f"tok{i}" for i in range(65536)}
        names[8197], names[8710] = "<racm3:break>", "<reserved08706>"
        for i in range(8799, 8833):
            names[i + 4 + shift] = f"<reserved{i:05d}>"  # reserved number = id - 4 (Chameleon's vocabulary)
        return {name: i for i, name in names.items()}

    write_tokenizer(tmp_path / "good.json", vocabulary(0), [])
    check_lumina_ids(load_tokenizer(tmp_path / "good.json"), tmp_path / "good.json", 48)
    write_tokenizer(tmp_path / "bad.json", vocabulary(1), [])
    with pytest.raises(CheckpointError, match="8803"):
        check_lumina_ids(load_tokenizer(tmp_path / "bad.json"), tmp_path / "bad.json", 48)
