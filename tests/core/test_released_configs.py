"""Janus-Pro's config.json as DeepSeek published it: Janus-Pro-7B's language_config names only
max_position_embeddings, model_type, num_hidden_layers, torch_dtype and vocab_size, and DeepSeek's loader
fills the rest from transformers.LlamaConfig's defaults, so ours does the same for that layout (and says
so in the load notes). A 4,096-wide model cannot be written in a test: the 7B field set is checked at the
config level (the sizes it gives, a model of ~7B parameters built on the meta device) and against tiny
weights (refused, naming the tensor, the field and Llama's default); the 1B field set (sizes spelled out,
no num_key_value_heads / rms_norm_eps / rope_theta) is loaded in full from a tiny folder and matches
transformers. Invalid values that are present, and the other layouts' missing sizes, stay errors."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from tests.tolerances import assert_close_to_reference, model_tolerance

from lantern_core.errors import CheckpointError, ConfigError
from lantern_core.loading.families import LLAMA_DEFAULTS, janus_config, llama_defaults, load_prompted
from lantern_core.models.gpt import ForwardStep
from tests.tiny_families import (IMAGE_CODES, JANUS_PRO_1B_LANGUAGE_FIELDS, JANUS_PRO_7B_LANGUAGE_CONFIG,
                                 janus_1b_style_language_config, janus_pro_7b_config, save_chameleon_folder,
                                 save_deepseek_janus_folder, save_janus_folder)

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def mha_janus(tmp_path_factory):
    """A tiny transformers Janus with as many key/value heads as heads (as Janus-Pro-1B)."""
    folder = tmp_path_factory.mktemp("janus-mha")
    return save_janus_folder(folder, seed=8, kv_heads=4), folder


def test_our_llama_defaults_are_transformers_llamaconfig_defaults():
    config = transformers.LlamaConfig()
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": getattr(config, "rope_theta", None)}
    for name, value in LLAMA_DEFAULTS.items():
        assert (rope["rope_theta"] if name == "rope_theta" else getattr(config, name)) == value, name
    assert transformers.LlamaConfig(num_attention_heads=16).num_key_value_heads == 16


def test_janus_pro_7b_published_config_gives_the_7b_decoder():
    cfg = janus_pro_7b_config()
    assert set(cfg) == {"aligner_config", "architectures", "gen_aligner_config", "gen_head_config",
                        "gen_vision_config", "language_config", "model_type", "torch_dtype",
                        "transformers_version", "vision_config"}
    assert cfg["language_config"] == JANUS_PRO_7B_LANGUAGE_CONFIG and len(cfg["language_config"]) == 5
    config = janus_config(cfg, "deepseek-janus", 24, 256)
    assert (config.dim, config.n_layer, config.n_head, config.n_kv_head, config.ffn_dim) == (4096, 30, 32, 32, 11008)
    assert (config.text_vocab_size, config.norm_eps, config.rope_base) == (102400, 1e-6, 10000.0)
    assert (config.vocab_size, config.image_embed_dim) == (16384, 8)
    assert llama_defaults(cfg["language_config"]) == {"hidden_size": 4096, "num_attention_heads": 32,
                                                      "intermediate_size": 11008, "rms_norm_eps": 1e-6,
                                                      "rope_theta": 10000.0, "num_key_value_heads": 32}
    from lantern_core.loading.checkpoints import build_on_meta
    from lantern_core.models.prompted import PromptedImageLM

    model = build_on_meta(PromptedImageLM, config, "Janus-Pro-7B", "")
    assert 6.5e9 < sum(p.numel() for p in model.parameters()) < 7.5e9  # the 7B, not a 1B or a 13B


def test_janus_pro_7b_field_set_with_other_weights_is_refused_naming_llamas_defaults(mha_janus, tmp_path):
    save_deepseek_janus_folder(tmp_path, mha_janus[0], language_config=JANUS_PRO_7B_LANGUAGE_CONFIG)
    assert json.loads((tmp_path / "config.json").read_text())["language_config"] == JANUS_PRO_7B_LANGUAGE_CONFIG
    with pytest.raises(CheckpointError) as err:
        load_prompted(tmp_path, grid_size=4)
    message = str(err.value)
    assert "language_model.model.embed_tokens.weight of shape (102400, 4096)" in message
    assert "hidden_size 4096: config.json language_config has none, so Llama's default" in message
    assert "vocab_size 102400 from config.json language_config" in message and "shape (48, 64)" in message
    assert "Fix: write the model's sizes" in message


def _logits(model, prompt: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    h = torch.cat([model.embed_prompt(prompt), model.embed_tokens(codes)], dim=1)
    return model.logits(model(h, ForwardStep(torch.arange(h.shape[1]))))


def test_janus_pro_1b_field_set_loads_with_llamas_defaults_and_matches_transformers(mha_janus, tmp_path, caplog):
    reference, hf_folder = mha_janus
    language = janus_1b_style_language_config(reference)
    assert tuple(language) == JANUS_PRO_1B_LANGUAGE_FIELDS and "num_key_value_heads" not in language
    save_deepseek_janus_folder(tmp_path, reference, language_config=language)
    with caplog.at_level("INFO", logger="lantern_core.loading"):
        loaded = load_prompted(tmp_path, grid_size=4)
    assert loaded.source_format == "deepseek-janus"
    config = loaded.config
    assert (config.dim, config.n_head, config.n_kv_head, config.norm_eps, config.rope_base) == (64, 4, 4, 1e-6, 1e4)
    note = ("config.json language_config has no rms_norm_eps, rope_theta, num_key_value_heads: took Llama's "
            "defaults, as DeepSeek's loader (transformers.LlamaConfig) does: rms_norm_eps 1e-06, rope_theta "
            "10000.0, num_key_value_heads 4 (= num_attention_heads)")
    assert loaded.notes == [note] and note in caplog.text
    g = torch.Generator().manual_seed(3)
    prompt, codes = torch.randint(0, 48, (2, 6), generator=g), torch.randint(0, IMAGE_CODES, (2, 16), generator=g)
    exact = copy.deepcopy(reference).double()  # transformers' model in float64: no CPU's rounding to allow for
    with torch.no_grad():
        ours = _logits(loaded.model, prompt, codes)
        torch.testing.assert_close(ours, _logits(load_prompted(hf_folder).model, prompt, codes))  # = the HF layout
        emb = torch.cat([exact.get_input_embeddings()(prompt), exact.prepare_embeddings_for_image_generation(codes)], 1)
        expected = exact.model.generation_head(exact.model.language_model(inputs_embeds=emb).last_hidden_state)
    scale = expected.abs().max().item()
    assert scale > 1.0
    # the embedding, the layers and a 2-layer generation head: a tolerance from float32's epsilon and the sizes
    assert_close_to_reference(ours, expected, model_tolerance(ours.dtype, loaded.config, extra=4))


def test_defaulted_key_value_heads_that_disagree_with_the_weights_are_named(tmp_path):
    """The 1B field set over GQA weights (2 key/value heads): the default (= 4 heads) is refused at k_proj,
    naming both head counts and where the default came from."""
    reference = save_janus_folder(tmp_path / "hf", seed=9)
    save_deepseek_janus_folder(tmp_path / "ds", reference, language_config=janus_1b_style_language_config(reference))
    with pytest.raises(CheckpointError) as err:
        load_prompted(tmp_path / "ds", grid_size=4)
    message = str(err.value)
    assert "language_model.model.layers.0.self_attn.k_proj.weight of shape (64, 64)" in message
    assert "num_key_value_heads 4: config.json language_config has none, so Llama's default" in message
    assert "num_attention_heads 4 from config.json language_config" in message and "shape (32, 64)" in message


@pytest.mark.parametrize("field, value", [("hidden_size", "4096"), ("hidden_size", -64), ("num_hidden_layers", 2.5),
                                          ("num_key_value_heads", 0), ("rms_norm_eps", "1e-6"),
                                          ("rope_theta", True), ("vocab_size", None)])
def test_invalid_present_values_are_still_errors_naming_the_field(field, value):
    cfg = janus_pro_7b_config()
    cfg["language_config"][field] = value
    with pytest.raises(ConfigError, match=f"config.json language_config.{field}"):
        janus_config(cfg, "deepseek-janus", 24, 256)


def test_other_layouts_still_require_their_sizes(tmp_path):
    """transformers' Janus text_config and Chameleon's config always carry their sizes: a missing one is
    an error naming it, not a default."""
    with pytest.raises(ConfigError, match="config.json text_config.num_attention_heads"):
        janus_config({"model_type": "janus", "text_config": dict(JANUS_PRO_7B_LANGUAGE_CONFIG)}, "hf-janus", 24, 256)
    save_chameleon_folder(tmp_path, seed=1)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="config.json.intermediate_size"):
        load_prompted(tmp_path)
