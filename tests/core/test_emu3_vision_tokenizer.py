"""Emu3's vision tokenizer in its original layout (`BAAI/Emu3-VisionTokenizer`: remote-code `Emu3VisionVQModel`,
config.json with model_type "Emu3VisionVQ" beside model.safetensors), read by `load_emu3_vision_tokenizer`.

A tiny random transformers `Emu3VQVAE` (random norms and BatchNorm statistics) is written to disk under the original
key names, its config as a config.json with the published file's exact field set (sizes shrunk). The inverse renaming
used here is written from transformers' conversion script (`convert_emu3_weights_to_hf.py`, KEYS_TO_MODIFY_MAPPING
and its squeeze of the 1x1 attention kernels), independently of the loader's own renaming. In float64 the loaded
decoder turns the same codes into the same image as transformers' `Emu3VQVAE.decode`, within a tolerance derived
from float64 (as tests/core/test_movq.py). Missing and unknown weights are refused naming model.safetensors, and a
config.json without a field that sizes the decoder is refused naming that field."""
from __future__ import annotations

import json

import pytest
import torch

from lantern_core.errors import CheckpointError, ConfigError
from lantern_core.loading.movq_io import emu3_original_vq_config, emu3_vq_config, load_emu3_vision_tokenizer

emu3 = pytest.importorskip("transformers.models.emu3.modeling_emu3")
from tiny_emu3 import (PUBLISHED, TINY, check_close, original_state,  # noqa: E402
                       reference_vision_tokenizer as reference, write_folder)

SIZING = ("codebook_size", "embed_dim", "z_channels", "ch", "ch_mult", "num_res_blocks", "attn_resolutions",
          "temporal_downsample_factor")
GRID = (3, 5)  # not square: a transposed lookup shows


@pytest.fixture(scope="module")
def ref_and_image():
    model = reference()
    indices = torch.randint(0, TINY["codebook_size"], (2, GRID[0] * GRID[1]),
                            generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        image = model.decode(indices.view(2, *GRID))  # frame 0 of the frames it decodes
    return model, indices, image


def test_the_published_field_set_is_592_bytes_and_the_release_sizes():
    assert len(json.dumps(PUBLISHED, indent=2, sort_keys=True) + "\n") == 592  # as transformers writes config.json
    assert emu3_original_vq_config(PUBLISHED) == emu3_vq_config({})  # = transformers' defaults, the release


def test_the_original_layout_decodes_like_transformers_emu3vqvae(ref_and_image, tmp_path):
    model, indices, image = ref_and_image
    tensors = original_state(model)
    assert "decoder.mid.attn_1.q.weight" in tensors and "decoder.up.2.attn.1.norm.conv_y.weight" in tensors
    assert "encoder.down.2.attn.0.norm.weight" in tensors and "quant_conv.conv.weight" in tensors  # left out
    folder = write_folder(tmp_path / "Emu3-VisionTokenizer", tensors)
    for path in (folder, folder / "model.safetensors"):
        ours = load_emu3_vision_tokenizer(path, torch.float64)
        assert next(ours.parameters()).dtype == torch.float64
        with torch.no_grad():
            check_close(ours.decode(indices, GRID), image)
    assert image.shape == (2, 3, GRID[0] * ours.downsample, GRID[1] * ours.downsample)
    with torch.no_grad():  # and a wrong weight anywhere shows
        ours.decoder.up[2].attn[1].proj_out.weight.mul_(1.5)
        with pytest.raises(AssertionError):
            check_close(ours.decode(indices, GRID), image)


def test_missing_and_unknown_weights_are_refused_naming_the_file(ref_and_image, tmp_path):
    tensors = original_state(ref_and_image[0])
    folder = write_folder(tmp_path / "missing", {k: v for k, v in tensors.items() if k != "decoder.conv_out.weight"})
    with pytest.raises(CheckpointError, match=r"missing \['decoder\.conv_out\.weight'\]") as error:
        load_emu3_vision_tokenizer(folder)
    assert error.value.path == str(folder / "model.safetensors")
    folder = write_folder(tmp_path / "unknown", {**tensors, "decoder.extra.weight": torch.zeros(1)})
    with pytest.raises(CheckpointError, match=r"unexpected \['decoder\.extra\.weight'\]") as error:
        load_emu3_vision_tokenizer(folder)
    assert error.value.path == str(folder / "model.safetensors")
    folder = write_folder(tmp_path / "stray", {**tensors, "loss.discriminator.weight": torch.zeros(1)})
    with pytest.raises(CheckpointError, match=r"unexpected \['loss\.discriminator\.weight'\]"):
        load_emu3_vision_tokenizer(folder)
    folder = write_folder(tmp_path / "hf", {f"vqmodel.{k}": v for k, v in ref_and_image[0].state_dict().items()})
    with pytest.raises(CheckpointError, match="transformers' layout"):
        load_emu3_vision_tokenizer(folder)
    folder = write_folder(tmp_path / "bigger", tensors, {**TINY, "ch": 64})
    with pytest.raises(CheckpointError, match=r"decoder\.conv_in\.(weight|bias) of shape"):
        load_emu3_vision_tokenizer(folder)


@pytest.mark.parametrize("field", SIZING)
def test_a_config_without_a_sizing_field_is_refused_naming_it(ref_and_image, tmp_path, field):
    folder = write_folder(tmp_path / field, original_state(ref_and_image[0]),
                          {k: v for k, v in TINY.items() if k != field})
    with pytest.raises(ConfigError, match=rf"config\.json\.{field}: .*no such field") as error:
        load_emu3_vision_tokenizer(folder)
    assert error.value.name == f"{folder / 'config.json'}.{field}"


@pytest.mark.parametrize("change, field", [
    ({"ch_mult": []}, "ch_mult"), ({"ch": "32"}, "ch"), ({"num_res_blocks": True}, "num_res_blocks"),
    ({"attn_resolutions": [3]}, "attn_resolutions"), ({"temporal_downsample_factor": 3}, "temporal_downsample_factor"),
    ({"out_channels": 4}, "out_channels"), ({"model_type": "emu3"}, "model_type")])
def test_invalid_config_values_are_refused_naming_the_field(change, field):
    with pytest.raises(ConfigError, match=rf"config\.json\.{field}:"):
        emu3_original_vq_config({**TINY, **change})
