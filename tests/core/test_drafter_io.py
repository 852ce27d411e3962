"""Drafters load strictly from LANTERN's released layout (config.json + pytorch_model.bin with HF names,
or model.safetensors), round-trip through our writer, and are refused with a clear error when they do
not fit the target or their tensors are wrong."""
import json

import pytest
import torch

from lantern_core.config import DrafterConfig
from lantern_core.loading.drafter_io import internal_to_released, load_drafter, save_drafter
from lantern_core.errors import CheckpointError
from lantern_core.models.gpt import ForwardStep
from tests.tiny_models import TINY_C2I, TINY_T2I, random_drafter, random_gpt

RELEASED_KEYS = {
    "embed_tokens.weight", "fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
    "layers.0.post_attention_layernorm.weight",
}


def outputs(drafter, seed=0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(2, 5, drafter.config.dim, generator=g)
    tokens = torch.randint(0, drafter.config.vocab_size, (2, 5), generator=g)
    return drafter(feats, tokens, ForwardStep(torch.arange(5)))


def released_folder(tmp_path, drafter, input_type="t2i", fmt="bin"):
    """Write a folder exactly like jadohu/llamagen_drafter: HF config + pytorch_model.bin."""
    c = drafter.config
    folder = tmp_path / "llamagen_drafter"
    folder.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": c.dim, "intermediate_size": c.ffn_dim,
              "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_head, "num_hidden_layers": 1,
              "vocab_size": c.vocab_size, "rms_norm_eps": c.norm_eps, "max_position_embeddings": 2048,
              "hidden_act": "silu", "caption_dim": 24, "class_dropout_p": 0.0, "torch_dtype": "float16",
              "input_type": input_type}
    (folder / "config.json").write_text(json.dumps(config))
    state = {k: v.half() for k, v in internal_to_released(drafter.state_dict(), c).items()}
    assert set(state) == RELEASED_KEYS
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def test_released_layout_loads_exactly(tmp_path):
    target = random_gpt(TINY_T2I)
    drafter = random_drafter(target)
    folder = released_folder(tmp_path, drafter, input_type="t2i")
    with pytest.raises(CheckpointError, match="token grid 16"):  # LANTERN's t2i means a 16x16 grid
        load_drafter(folder, target.config)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["lantern"] = {"grid_size": 4, "cls_token_num": 5}
    (folder / "config.json").write_text(json.dumps(cfg))
    loaded = load_drafter(folder, target.config)
    assert loaded.config.cls_token_num == TINY_T2I.cls_token_num - 1 == 5
    assert loaded.source_format == "released-folder"
    torch.testing.assert_close(outputs(loaded.model), outputs(drafter.half().float()), rtol=0, atol=0)


def test_our_writer_round_trips_in_the_released_names(tmp_path):
    target = random_gpt(TINY_C2I)
    drafter = random_drafter(target)
    folder = save_drafter(drafter, tmp_path / "mine", extra={"target": "tiny"})
    from safetensors.torch import load_file

    assert set(load_file(str(folder / "model.safetensors"))) == RELEASED_KEYS
    for path in (folder, folder / "model.safetensors"):
        loaded = load_drafter(path, target.config)
        assert loaded.config == drafter.config
        torch.testing.assert_close(outputs(loaded.model), outputs(drafter), rtol=0, atol=0)
        assert not loaded.model.embed_tokens.weight.requires_grad


def test_a_drafter_for_another_target_is_refused(tmp_path):
    drafter = random_drafter(random_gpt(TINY_C2I))
    folder = save_drafter(drafter, tmp_path / "c2i")
    with pytest.raises(CheckpointError, match="prefix length") as info:
        load_drafter(folder, random_gpt(TINY_T2I).config)
    assert "drafter trained for the chosen target" in str(info.value) and "Fix:" in str(info.value)
    wide = DrafterConfig.for_target(TINY_C2I)
    with pytest.raises(CheckpointError, match="hidden size 64 \\(target: 128\\)"):
        load_drafter(folder, random_gpt(TINY_C2I.__class__(**{**TINY_C2I.to_dict(), "dim": 128})).config)
    assert wide.mismatches(TINY_C2I) == []


def test_missing_and_misshaped_tensors_are_refused(tmp_path):
    target = random_gpt(TINY_T2I)
    folder = released_folder(tmp_path, random_drafter(target))
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    del state["fc.bias"]
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"1 missing keys \(e.g. \['fc.bias'\]\)"):
        load_drafter(folder, None)  # config.json has no "bias": false, so fc has a bias (as in LANTERN)
    state["fc.bias"] = torch.zeros(7)
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="wrong shapes"):
        load_drafter(folder, None)
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(CheckpointError, match="pytorch_model.bin or model.safetensors"):
        load_drafter(folder, None)


def test_a_gpt_file_is_not_a_drafter(tmp_path):
    from lantern_core.loading.checkpoint_io import write_safetensors

    path = tmp_path / "gpt.safetensors"
    write_safetensors(path, random_gpt(TINY_C2I).state_dict(), {"kind": "gpt"})
    with pytest.raises(CheckpointError, match="a drafter file"):
        load_drafter(path, TINY_C2I)
