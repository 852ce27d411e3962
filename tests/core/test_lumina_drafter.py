"""The released Lumina-mGPT drafter (`sihwanpark/LANTERN-Lumina-mGPT-7B-768`) as downloaded: config.json with
its published field set + model.safetensors in LANTERN's training layout (QK-norm rows per model-parallel
shard). It loads strictly from its folder next to a Lumina-mGPT target, computes what that Chameleon layer
computes (float64 reference from transformers' layer), honours an `embed_upscale` a config declares the
way LANTERN's code applies it, refuses config fields our layer does not implement, and drafts for
Lumina-mGPT in every drafter mode: greedy runs equal greedy AR, sampled runs keep the row layout."""
from __future__ import annotations

import json

import pytest
import torch

from lantern_core.config import SamplingConfig
from lantern_core.decoding.trees.drafting import DynamicShape
from lantern_core.decoding.generate import generate
from lantern_core.decoding.acceptance.neighbors import build_neighbors
from lantern_core.decoding.acceptance.relaxation import Relaxation
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding.trees.specs import NAIVE_EXTEND_57
from lantern_core.errors import CheckpointError
from lantern_core.loading.drafter_io import load_drafter, save_drafter
from lantern_core.loading.families import load_prompted
from lantern_core.models.gpt import ForwardStep
from tests.tiny_families import (LUMINA_DRAFTER_CONFIG, save_chameleon_folder, save_chameleon_vqgan,
                                 write_released_lumina_drafter)
from tests.tolerances import assert_close_to_reference, float64_copy, transformer_tolerance

GRID = 4


@pytest.fixture(scope="module")
def lumina(tmp_path_factory):
    root = tmp_path_factory.mktemp("lumina")
    folder = root / "snapshots" / "0f3c2a9e"  # a hub-cache snapshot: the name says nothing
    reference = save_chameleon_folder(folder, seed=12, lumina=True)
    save_chameleon_vqgan(folder / "vqgan.ckpt")
    loaded = load_prompted(folder, grid_size=GRID, max_prompt_tokens=48)
    drafter_folder = root / "LANTERN-Lumina-mGPT-7B-768"
    parts = write_released_lumina_drafter(drafter_folder, reference)
    return loaded, reference, drafter_folder, parts


def load(folder, loaded):
    target = loaded.model
    return load_drafter(folder, target.config, image_token_ids=target.image.token_ids)


def test_the_fixture_has_the_published_field_set(lumina):
    _, _, folder, _ = lumina
    cfg = json.loads((folder / "config.json").read_text())
    assert set(cfg) == set(LUMINA_DRAFTER_CONFIG) and cfg["dropout"] == 0.05 and cfg["model_parallel_size"] == 1
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]


def drafter_reference(parts, target, codes: torch.Tensor, features: torch.Tensor, scale: float = 1.0):
    """transformers' ChameleonDecoderLayer over fc([scale * emb; feature]), in float64, causal."""
    from transformers.models.chameleon.modeling_chameleon import ChameleonRotaryEmbedding

    layer, fc, embedding, config = parts
    B, T = codes.shape
    positions = torch.arange(T)
    with torch.no_grad():
        emb = embedding[target.image.token_ids[codes]].double() * scale
        h = float64_copy(fc)(torch.cat([emb, features.double()], -1))
        rope = ChameleonRotaryEmbedding(config)(h, positions[None].expand(B, -1))
        causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        out = float64_copy(layer)(h, attention_mask=causal, position_ids=positions[None], position_embeddings=rope)
    return out[0] if isinstance(out, tuple) else out


def test_released_lumina_drafter_loads_strictly_and_matches_the_chameleon_layer(lumina):
    loaded, _, folder, parts = lumina
    target = loaded.model
    result = load(folder, loaded)
    drafter, c = result.model, result.config
    assert result.source_format == "released-folder"
    assert (c.family, c.qk_norm, c.input_norm, c.rope_dims, c.embed_scale) == ("chameleon", True, True, 1, 1.0)
    assert c.vocab_size == loaded.config.vocab_size  # the image codes and the end-of-row token
    assert int(target.image.token_ids[-1]) == loaded.encoder.tokenizer.token_to_id("<reserved08799>")
    g = torch.Generator().manual_seed(0)
    T = 10
    features = torch.randn(2, T, c.dim, generator=g)
    codes = torch.randint(0, c.vocab_size, (2, T), generator=g)
    codes[:, -1] = c.vocab_size - 1  # the end-of-row token's embedding row is the drafter's too
    with torch.no_grad():
        ours = drafter(features, codes, ForwardStep(torch.arange(T)))
    expected = drafter_reference(parts, target, codes, features)
    assert expected.abs().max() > 1
    assert_close_to_reference(ours, expected, transformer_tolerance(ours.dtype, 2 * c.dim, layers=1))
    # the (1, head_dim) QK-norm rows are shared by the heads: reading them per head would differ
    assert torch.equal(drafter.layers[0].attention.q_norm.weight[0], drafter.layers[0].attention.q_norm.weight[-1])


def test_a_declared_embed_upscale_scales_the_input_embeddings(lumina, tmp_path):
    """LANTERN's `embed_upscale` (a constructor argument of its Lumina drafter, applied only above 1.0,
    after the embedding's cast to the features' dtype): declared in config.json, it equals a drafter whose
    embedding rows were multiplied by hand; 1.0 and values below it change nothing (LANTERN skips them)."""
    loaded, reference, _, _ = lumina
    target = loaded.model
    g = torch.Generator().manual_seed(1)
    features = torch.randn(1, 8, target.config.dim, generator=g)
    codes = torch.randint(0, target.config.vocab_size - 1, (1, 8), generator=g)
    outputs = {}
    for scale in (1.0, 2.5, 0.5):
        folder = tmp_path / f"scale{scale}"
        parts = write_released_lumina_drafter(folder, reference, embed_upscale=scale)
        result = load(folder, loaded)
        assert result.config.embed_scale == max(scale, 1.0)
        with torch.no_grad():
            outputs[scale] = result.model(features, codes, ForwardStep(torch.arange(8)))
        expected = drafter_reference(parts, target, codes, features, scale=max(scale, 1.0))
        assert_close_to_reference(outputs[scale], expected, transformer_tolerance(torch.float32, 2 * target.config.dim, 1))
    # by hand: the same drafter with 2.5 x its embedding rows and no declared scale
    by_hand = load(tmp_path / "scale1.0", loaded).model
    with torch.no_grad():
        by_hand.embed_tokens.weight.mul_(2.5)
        torch.testing.assert_close(by_hand(features, codes, ForwardStep(torch.arange(8))), outputs[2.5])
    assert (outputs[2.5] - outputs[1.0]).abs().max() > 0.1
    assert torch.equal(outputs[0.5], outputs[1.0])
    # our writer keeps the scale
    again = load(save_drafter(load(tmp_path / "scale2.5", loaded).model, tmp_path / "saved"), loaded)
    assert again.config.embed_scale == 2.5


@pytest.mark.parametrize("field, value, match", [
    ("num_hidden_layers", 2, "num_hidden_layers 1"),
    ("attention_bias", True, "attention_bias False"),
    ("mlp_bias", True, "mlp_bias False"),
    ("hidden_act", "gelu", "hidden_act 'silu'"),
    ("rope_scaling", {"type": "linear", "factor": 2.0}, "rope_scaling None"),
    ("hidden_size", 128, "hidden_size 128 to match the weights"),
    ("num_key_value_heads", 4, "num_key_value_heads 4 to match"),
    ("model_parallel_size", 3, "model_parallel_size a positive divisor"),
    ("embed_upscale", "2", "embed_upscale a finite number"),
])
def test_config_fields_our_layer_does_not_implement_are_refused(lumina, tmp_path, field, value, match):
    loaded, reference, _, _ = lumina
    folder = tmp_path / "d"
    write_released_lumina_drafter(folder, reference, **{field: value})
    with pytest.raises(CheckpointError, match=match) as info:
        load(folder, loaded)
    assert str(folder) in str(info.value) and "Fix:" in str(info.value)


def test_a_lumina_drafter_without_its_target_is_refused(lumina):
    _, _, folder, _ = lumina
    with pytest.raises(CheckpointError, match="Chameleon target"):
        load_drafter(folder, None)


def layout_ok(config, tokens: torch.Tensor) -> bool:
    index = torch.arange(tokens.shape[1])
    row_end = (index + 1) % config.row_stride == 0
    eol = config.vocab_size - 1
    return bool((tokens[:, row_end] == eol).all() and (tokens[:, ~row_end] != eol).all())


MODES = {
    "eagle2": lambda: (SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(depth=3, top_k=4, nodes=12)), None),
    "static_tree": lambda: (SpeculativeConfig(tree="static", static_tree=NAIVE_EXTEND_57), None),
    "lantern": lambda: (SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(depth=3, top_k=4, nodes=12),
                                          relaxation=Relaxation(k=4, delta=0.0)), 4),
    "lantern_pp": lambda: (SpeculativeConfig(tree="static", static_tree=NAIVE_EXTEND_57,
                                             relaxation=Relaxation(k=4, lam=1.0)), 4),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_released_drafter_drafts_for_lumina_in_every_drafter_mode(lumina, mode):
    """Greedy (and delta 0 / lambda 1, where the relaxed rules are exact) equals greedy AR token for token;
    sampled runs keep Lumina's rows (end-of-row token exactly at every row end) and accept drafts."""
    loaded, _, folder, _ = lumina
    target, config = loaded.model, loaded.config
    drafter = load(folder, loaded).model
    spec, k = MODES[mode]()
    neighbors = build_neighbors(loaded.vq.quantize.embedding.weight, k) if k else None
    condition = loaded.encoder.encode(["a red cat", "a photo of a dog on the grass"])
    greedy = SamplingConfig(cfg_scale=3.0, temperature=0.0)
    sampled = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)
    with torch.no_grad():
        ar = generate(target, condition, greedy, make_generators(0, 2, "cpu"))
        got = speculative_generate(target, drafter, condition, greedy, spec, make_generators(0, 2, "cpu"), neighbors)
        assert torch.equal(got.tokens, ar.tokens) and layout_ok(config, ar.tokens)
        run = speculative_generate(target, drafter, condition, sampled, spec, make_generators(3, 2, "cpu"), neighbors)
    assert layout_ok(config, run.tokens) and run.tokens.unique().numel() > 8
    assert run.stats.forward_passes < 2 * config.num_image_tokens  # two images: fewer forwards than AR's
