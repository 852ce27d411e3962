"""Lumina-mGPT 2.0 on the shared Chameleon trunk: a tiny folder laid out as Alpha-VLLM's release (QK-norm rows
per model-parallel shard, `<MOVQGAN...>` image tokens in the vocabulary map, a null BOS, MoVQGAN's flat
checkpoint) is told from Lumina-mGPT 1 by its files, gives transformers' logits (float64 reference, QK-norm rows
repeated over the heads as its ChameleonLayerNorm does), greedy images equal to its generator's recipe step by
step (prompt and forced size tokens, image-start CFG, row ends), MoVQGAN images equal to MoVQGAN's own decoder,
and every training-free decoder keeps the layout with greedy = AR. Wrong variants (no QK-norm, q/k left in
rotate-half order) are caught."""
from __future__ import annotations

import copy

import pytest
import torch

from lantern_core.config import SamplingConfig
from lantern_core.decoding.generate import generate
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.sampling import make_generators
from lantern_core.errors import CheckpointError
from lantern_core.layout import image_codes
from lantern_core.loading.families import folder_layout, format_for_grid, load_prompted
from lantern_core.models.gpt import ForwardStep
from tests.tolerances import assert_close_to_reference, float64_copy, model_tolerance
from tiny_families import lumina_reference_greedy
from tiny_lumina2 import CODES, lumina2_vocab, reference_movqgan, save_lumina2_folder

pytest.importorskip("transformers")
GRID = 4  # one 32-pixel step: 4 rows of 4 codes, each row closed by the end-of-row token


@pytest.fixture(scope="module")
def lumina2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("snapshot-9c1e")  # a hub-cache snapshot: the name says nothing
    reference = save_lumina2_folder(folder)
    return folder, reference, load_prompted(folder, grid_size=GRID, max_prompt_tokens=64)


def test_the_folder_is_lumina_2_from_its_files_with_its_token_layout(lumina2):
    folder, _, loaded = lumina2
    vocab = lumina2_vocab()
    assert folder_layout(folder) == ("chameleon", "hf-lumina2") and loaded.source_format == "hf-lumina2"
    config = loaded.config
    assert config.qk_norm and config.row_end and config.vocab_size == CODES + 1 and config.n_kv_head == 4
    ids = loaded.model.image.token_ids.tolist()
    assert ids == [vocab[f"<MOVQGAN_{c:05d}>"] for c in range(CODES)] + [vocab["<reserved08799>"]]
    cond = loaded.encoder.encode(["a red cat"])
    size = vocab["<reserved08801>"]  # 4 codes of 8 px = 32 px = one step: 8800 + 1
    prompt = cond.prompt_ids[0][cond.prompt_mask[0]].tolist()
    assert prompt[0] == vocab["</s>"]  # tokenizer_config.json's BOS is null: the EOS, as its tokenizer wrapper
    assert prompt[-4:] == [vocab["<reserved08706>"], vocab["<racm3:break>"], size, size]
    assert cond.uncond_ids[0][cond.uncond_mask[0]].tolist() == [vocab["<racm3:break>"], size, size]
    assert loaded.encoder.format.template.startswith("Generate an image of 32x32 according to the following prompt:\n")


def test_logits_match_transformers_and_greedy_images_match_its_generator(lumina2):
    _, reference, loaded = lumina2
    exact = float64_copy(reference)
    ids = loaded.model.image.token_ids
    g = torch.Generator().manual_seed(0)
    prompt = torch.tensor([loaded.encoder.token_ids("a red cat")])
    codes = torch.randint(0, CODES + 1, (1, 9), generator=g)

    def ours(model) -> torch.Tensor:
        h = torch.cat([model.embed_prompt(prompt), model.embed_tokens(codes)], dim=1)
        return model.logits(model(h, ForwardStep(torch.arange(h.shape[1]))))

    with torch.no_grad():
        expected = exact.lm_head(exact.model(input_ids=torch.cat([prompt, ids[codes]], 1)).last_hidden_state)[..., ids]
        got = ours(loaded.model)
        unnormed = copy.deepcopy(loaded.model)
        for layer in unnormed.layers:  # a missing QK-norm
            layer.attention.q_norm = layer.attention.k_norm = None
        wrong = ours(unnormed)
    tol = model_tolerance(got.dtype, loaded.config)
    assert expected.abs().max() > 1.0
    assert_close_to_reference(got, expected, tol)
    with pytest.raises(AssertionError):
        assert_close_to_reference(wrong, expected, tol)
    for prompt_text in ("a red cat", "a painting of the sky"):
        with torch.no_grad():
            tokens = generate(loaded.model, loaded.encoder.encode([prompt_text]),
                              SamplingConfig(cfg_scale=4.0, temperature=0.0), make_generators(0, 1, "cpu")).tokens[0]
        want = lumina_reference_greedy(exact, loaded.encoder, loaded.config, ids[:-1], prompt_text, 4.0)
        assert ids[tokens].tolist() == want
        assert len(set(want)) > 4


def test_q_and_k_left_in_rotate_half_order_are_caught(lumina2, monkeypatch):
    folder, reference, loaded = lumina2
    import lantern_core.loading.family_io as family_io

    monkeypatch.setattr(family_io, "permute_rotate_half", lambda weight, heads: weight)
    wrong = load_prompted(folder, grid_size=GRID, max_prompt_tokens=64)
    greedy = SamplingConfig(cfg_scale=4.0, temperature=0.0)
    cond = loaded.encoder.encode(["a red cat"])
    with torch.no_grad():
        a = generate(loaded.model, cond, greedy, make_generators(0, 1, "cpu")).tokens
        b = generate(wrong.model, cond, greedy, make_generators(0, 1, "cpu")).tokens
    assert not torch.equal(a, b)


def test_movqgan_decodes_as_its_own_decoder(lumina2):
    _, _, loaded = lumina2
    codes = torch.randint(0, CODES, (1, GRID * GRID), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = reference_movqgan().decode_code(codes, (GRID, GRID)).float()
        got = loaded.vq.decode(codes, (GRID, GRID))
    assert got.shape == want.shape and (got - want).abs().max() < 1e-4 * want.abs().max()


@pytest.mark.parametrize("shape", [(GRID, GRID), (4, 8)], ids=["square", "wide"])
def test_training_free_decoders_keep_the_layout_and_greedy_equals_ar(lumina2, shape):
    _, _, loaded = lumina2
    model = loaded.model.with_grid(*shape)
    encoder = loaded.encoder.with_format(format_for_grid("hf-lumina2", *shape, loaded.encoder.format))
    condition = encoder.encode(["a red cat", "a photo of a dog on the grass"])
    greedy = SamplingConfig(cfg_scale=4.0, temperature=0.0)
    sampled = SamplingConfig(cfg_scale=4.0, temperature=1.0, top_k=20)
    runs = {"sjd": JacobiConfig(window=4), "sjd_coupled": JacobiConfig(window=4, coupled=True),
            "continuation": JacobiConfig(window=4, continuation=True),
            "proactive": JacobiConfig(window=4, coupled=True, proactive=3, proactive_depth=2),
            "lossless_2d": JacobiConfig(window=4, coupled=True, rows=2, row_window=4, row_offset=-1)}
    config = model.config
    row_end = (torch.arange(config.num_image_tokens) + 1) % config.row_stride == 0
    with torch.no_grad():
        base = generate(model, condition, greedy, make_generators(0, 2, "cpu")).tokens
        for name, jacobi in runs.items():
            assert torch.equal(jacobi_generate(model, condition, greedy, jacobi, make_generators(0, 2, "cpu")).tokens,
                               base), name
            tokens = jacobi_generate(model, condition, sampled, jacobi, make_generators(5, 2, "cpu")).tokens
            eol = config.vocab_size - 1
            assert (tokens[:, row_end] == eol).all() and (tokens[:, ~row_end] != eol).all(), name
    codes, grid = image_codes(config, base)
    step = loaded.vq.config.downsample
    assert grid == shape and loaded.vq.decode(codes, grid).shape == (2, 3, shape[0] * step, shape[1] * step)


def test_sizes_and_missing_parts(lumina2, tmp_path):
    folder, reference, _ = lumina2
    wide = load_prompted(folder, image_size=(64, 32), max_prompt_tokens=64)  # 1 step high, 2 wide: 4 x 8 codes
    assert wide.config.grid_shape == (4, 8)
    vocab = lumina2_vocab()
    assert wide.encoder.format.suffix[-2:] == ("<reserved08801>", "<reserved08802>")  # height, then width
    assert vocab["<reserved08802>"] == wide.encoder.token_ids("x")[-1]
    bare = tmp_path / "no-movqgan"
    save_lumina2_folder(bare, with_movqgan=False)
    loaded = load_prompted(bare, grid_size=GRID)
    assert loaded.vq is None and any("movqgan_270M.ckpt" in note for note in loaded.notes)
    import json

    cfg = json.loads((bare / "config.json").read_text())
    cfg["vocabulary_map"]["<MOVQGAN_00003>"] = 3  # a hole in the image-token block
    (bare / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="contiguous"):
        load_prompted(bare, grid_size=GRID)


def test_drafter_and_relaxed_modes_with_a_trained_drafter(lumina2, tmp_path):
    """No drafter is released for Lumina-mGPT 2.0: one distilled by `train_drafter` (a few steps) drafts in every
    drafter mode; greedy equals AR (LANTERN at delta 0, LANTERN++ and relaxed SJD at lambda 1 over MoVQGAN's
    codebook neighbours are exact), sampled runs keep the row layout."""
    from lantern_core.decoding.acceptance.neighbors import build_neighbors
    from lantern_core.decoding.acceptance.relaxation import Relaxation
    from lantern_core.decoding.trees.config import SpeculativeConfig
    from lantern_core.decoding.trees.driver import speculative_generate
    from lantern_core.decoding.trees.specs import NAIVE_EXTEND_57
    from lantern_core.training.train_drafter import Recipe, self_distilled_data, train_drafter

    _, _, loaded = lumina2
    model, config = loaded.model, loaded.config
    prompts = loaded.encoder.encode(["a red cat", "the sky", "a dog on the grass", "a painting"] * 2)
    data = self_distilled_data(model, prompts, SamplingConfig(cfg_scale=4.0, temperature=1.0), seed=3)
    drafter, _ = train_drafter(model, data, Recipe(epochs=1, batch=4), tmp_path / "drafter", max_steps=4)
    drafter.eval()
    neighbors = build_neighbors(loaded.vq.embedding.weight, 4)
    static = dict(tree="static", static_tree=NAIVE_EXTEND_57)
    trees = {"static_tree": SpeculativeConfig(**static), "eagle2": SpeculativeConfig(tree="dynamic"),
             "lantern_pp": SpeculativeConfig(**static, relaxation=Relaxation(k=4, lam=1.0)),
             "lantern": SpeculativeConfig(tree="dynamic", relaxation=Relaxation(k=4, delta=0.0))}
    condition = loaded.encoder.encode(["a red cat", "a photo of a dog on the grass"])
    greedy = SamplingConfig(cfg_scale=4.0, temperature=0.0)
    sampled = SamplingConfig(cfg_scale=4.0, temperature=1.0, top_k=20)
    row_end = (torch.arange(config.num_image_tokens) + 1) % config.row_stride == 0
    eol = config.vocab_size - 1
    with torch.no_grad():
        base = generate(model, condition, greedy, make_generators(0, 2, "cpu")).tokens
        relaxed_sjd = JacobiConfig(window=4, relaxation=Relaxation(k=4, lam=1.0))
        assert torch.equal(jacobi_generate(model, condition, greedy, relaxed_sjd, make_generators(0, 2, "cpu"),
                                           neighbors).tokens, base)
        for name, spec in trees.items():
            table = neighbors if spec.relaxation is not None else None
            run = speculative_generate(model, drafter, condition, greedy, spec, make_generators(0, 2, "cpu"), table)
            assert torch.equal(run.tokens, base), name
            tokens = speculative_generate(model, drafter, condition, sampled, spec, make_generators(5, 2, "cpu"),
                                          table).tokens
            assert (tokens[:, row_end] == eol).all() and (tokens[:, ~row_end] != eol).all(), name


def test_logits_match_a_float64_decoder_written_from_its_source(lumina2):
    """Independently of transformers: the released tensors (QK-norm as (1, head_dim) rows) through a float64
    re-implementation of its modeling_chameleon.py give our logits at the image tokens."""
    import json

    from safetensors.torch import load_file

    import reference_lumina2

    folder, _, loaded = lumina2
    cfg = json.loads((folder / "config.json").read_text())
    tensors = {k: v for f in sorted(folder.glob("model*.safetensors")) for k, v in load_file(str(f)).items()}
    assert tensors["model.layers.0.self_attn.q_norm.weight"].shape == (1, loaded.config.head_dim)
    ids = loaded.model.image.token_ids
    prompt = torch.tensor([loaded.encoder.token_ids("a painting of the sky")])
    codes = torch.randint(0, CODES + 1, (1, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = reference_lumina2.logits(tensors, cfg, torch.cat([prompt, ids[codes]], 1))[..., ids]
        h = torch.cat([loaded.model.embed_prompt(prompt), loaded.model.embed_tokens(codes)], dim=1)
        got = loaded.model.logits(loaded.model(h, ForwardStep(torch.arange(h.shape[1]))))
    assert expected.abs().max() > 1.0
    assert_close_to_reference(got, expected, model_tolerance(got.dtype, loaded.config))
