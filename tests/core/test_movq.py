"""The MoVQ decoders (`models/movq.py`, `loading/movq_io.py`). Emu3's vision-tokenizer decoder against transformers'
`Emu3VQVAE`, the published implementation: a tiny random tokenizer in transformers' layout (its own `vq_config` field
names and key names, random BatchNorm statistics), both in float64, decode the same codes to the same image (frame 0,
what Emu3 returns for an image) within a tolerance derived from float64. Deliberately wrong variants (the first
temporal tap instead of the last, zq not passed through the temporal front, the codebook read with the grid
transposed) fail the same comparison, and the loader refuses missing, unknown and misshapen weights. MoVQGAN
(Lumina-mGPT 2.0's tokenizer) against a float64 decoder built as MoVQGAN's own code builds it
(`tests/reference_movqgan.py`), with its sizes read from the checkpoint's keys."""
from __future__ import annotations

import pytest
import torch

from lantern_core.errors import CheckpointError, ConfigError
from lantern_core.loading.movq_io import emu3_vq_config, load_emu3_vq, load_movqgan, movqgan_config
from lantern_core.models.movq import MoVQConfig

emu3 = pytest.importorskip("transformers.models.emu3.modeling_emu3")
from transformers import Emu3VQVAEConfig  # noqa: E402

from tiny_emu3 import check_close, randomise_norms  # noqa: E402
from tiny_lumina2 import MOVQGAN, reference_movqgan  # noqa: E402

VQ_CONFIG = {  # Emu3VQVAEConfig's field names, sizes shrunk (attention width = the attending channels)
    "codebook_size": 24, "embed_dim": 4, "latent_channels": 4, "base_channels": 32, "channel_multiplier": [1, 2],
    "num_res_blocks": 1, "attn_resolutions": [1], "hidden_size": 64, "num_attention_heads": 1,
    "temporal_downsample_factor": 4, "double_latent": False, "in_channels": 3, "out_channels": 3,
}
GRID = (3, 5)  # not square: a transposed lookup shows


def reference() -> torch.nn.Module:
    torch.manual_seed(0)  # transformers initialises with the global generator
    config = Emu3VQVAEConfig(**VQ_CONFIG)
    config._attn_implementation = "sdpa"  # eager attention takes its softmax in float32; sdpa stays in float64
    model = emu3.Emu3VQVAE(config).double().eval()
    randomise_norms(model, torch.Generator().manual_seed(1))
    return model


def published_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tokenizer's tensors under the prefix an Emu3-Gen-hf shard uses."""
    return {f"vqmodel.{k}": v for k, v in model.state_dict().items()}


def codes() -> torch.Tensor:
    return torch.randint(0, VQ_CONFIG["codebook_size"], (2, GRID[0] * GRID[1]),
                         generator=torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def ref_and_image():
    model = reference()
    indices = codes()
    with torch.no_grad():
        image = model.decode(indices.view(2, *GRID))  # (B, 3, 8h, 8w): frame 0 of the 4 it decodes
    return model, indices, image


def test_the_decoder_matches_transformers_emu3vqvae(ref_and_image):
    model, indices, image = ref_and_image
    ours = load_emu3_vq(published_tensors(model), VQ_CONFIG, "tiny-emu3", torch.float64)
    with torch.no_grad():
        check_close(ours.decode(indices, GRID), image)
    assert image.shape == (2, 3, GRID[0] * ours.downsample, GRID[1] * ours.downsample)


def test_the_keys_transformers_saves_today_load_too(ref_and_image):
    model, indices, image = ref_and_image
    tensors = {f"model.{k}": v for k, v in published_tensors(model).items()}
    tensors["model.text_model.embed_tokens.weight"] = torch.zeros(3, 3)  # the language model's: not ours to read
    ours = load_emu3_vq(tensors, VQ_CONFIG, "tiny-emu3", torch.float64)
    with torch.no_grad():
        check_close(ours.decode(indices, GRID), image)


def wrong_first_tap(model, ours):
    state = model.state_dict()
    with torch.no_grad():
        for i, block in enumerate(ours.front.res):
            block.conv1.weight.copy_(state[f"decoder.time_res_stack.{i}.conv1.conv.weight"][:, :, 0])
        for i, conv in enumerate(ours.front.up):
            conv.weight.copy_(state[f"decoder.time_conv.{i}.conv.conv.weight"][:, :, 0])


def wrong_raw_zq(model, ours):
    front = ours.front

    def only_latents(x):
        half = x.shape[0] // 2
        return torch.cat([type(front).forward(front, x[:half]), x[half:]])
    front.forward = only_latents


def wrong_transposed_lookup(model, ours):
    lookup = ours.lookup
    ours.lookup = lambda indices, grid: lookup(indices.view(-1, grid[1], grid[0]).transpose(1, 2).reshape(
        indices.shape[0], -1), grid)


@pytest.mark.parametrize("wrong", [wrong_first_tap, wrong_raw_zq, wrong_transposed_lookup],
                         ids=lambda f: f.__name__)
def test_each_wrong_variant_fails_the_comparison(ref_and_image, wrong):
    model, indices, image = ref_and_image
    ours = load_emu3_vq(published_tensors(model), VQ_CONFIG, "tiny-emu3", torch.float64)
    wrong(model, ours)
    with torch.no_grad(), pytest.raises(AssertionError):
        check_close(ours.decode(indices, GRID), image)


def test_the_loader_refuses_missing_unknown_and_misshapen_weights(ref_and_image):
    model = ref_and_image[0]
    tensors = published_tensors(model)
    missing = {k: v for k, v in tensors.items() if "conv_out" not in k}
    with pytest.raises(CheckpointError, match=r"missing \['decoder\.conv_out"):
        load_emu3_vq(missing, VQ_CONFIG, "tiny-emu3")
    unknown = {**tensors, "vqmodel.decoder.extra.weight": torch.zeros(1)}
    with pytest.raises(CheckpointError, match=r"unexpected \['decoder\.extra\.weight'\]"):
        load_emu3_vq(unknown, VQ_CONFIG, "tiny-emu3")
    with pytest.raises(CheckpointError, match="decoder.conv_in.weight of shape"):
        load_emu3_vq(tensors, {**VQ_CONFIG, "latent_channels": 4, "base_channels": 64, "hidden_size": 128},
                     "tiny-emu3")
    with pytest.raises(CheckpointError, match="Emu3 vision-tokenizer weights"):
        load_emu3_vq({"model.text_model.norm.weight": torch.ones(2)}, VQ_CONFIG, "tiny-emu3")


def test_the_config_follows_the_published_fields_and_refuses_odd_ones():
    config = emu3_vq_config({})  # every field left out: transformers' defaults, the released sizes
    assert config == MoVQConfig(codebook_size=32768, embed_dim=4, z_channels=4, ch=256, ch_mult=(1, 2, 2, 4),
                                num_res_blocks=2, attn_levels=(3,), temporal_blocks=2, temporal_upsamples=2)
    assert config.downsample == 8  # 720 px from 90 x 90 codes
    with pytest.raises(ConfigError, match="temporal_downsample_factor"):
        emu3_vq_config({"temporal_downsample_factor": 3})
    with pytest.raises(ConfigError, match="hidden_size"):
        emu3_vq_config({"hidden_size": 512})


@pytest.fixture(scope="module")
def movqgan_ref():
    model = reference_movqgan(3)
    generator = torch.Generator().manual_seed(5)
    indices = torch.randint(0, MOVQGAN["n_embed"], (2, GRID[0] * GRID[1]), generator=generator)
    with torch.no_grad():
        image = model.decode_code(indices, GRID)
    return model, indices, image


def test_movqgan_matches_a_float64_decoder_built_as_its_code_builds_it(movqgan_ref):
    """Lumina-mGPT 2.0's tokenizer: sizes read from the flat checkpoint keys (attention at the coarsest level and
    the middle block, as attn_resolutions [8] at resolution 32 places it), the same image in float64."""
    model, indices, image = movqgan_ref
    state = model.state_dict()
    config = movqgan_config(state, "tiny-movqgan")
    assert (config.ch, config.ch_mult, config.num_res_blocks, config.attn_levels, config.codebook_size) == (
        32, (1, 2, 2), 1, (2,), 40)
    ours = load_movqgan(state, "tiny-movqgan", torch.float64)
    assert ours.front is None
    with torch.no_grad():
        check_close(ours.decode(indices, GRID), image)
        ours.decoder.up[2].attn[0].q.weight.mul_(1.5)  # a wrong weight anywhere shows
        with pytest.raises(AssertionError):
            check_close(ours.decode(indices, GRID), image)


def test_movqgan_loading_refuses_other_files(movqgan_ref):
    state = movqgan_ref[0].state_dict()
    with pytest.raises(CheckpointError, match="quantize.embedding.weight"):
        load_movqgan({k: v for k, v in state.items() if not k.startswith("quantize.")}, "x.ckpt")
    with pytest.raises(CheckpointError, match=r"unexpected \['decoder\.norm_extra\.weight'\]"):
        load_movqgan({**state, "decoder.norm_extra.weight": torch.ones(1)}, "x.ckpt")
    with pytest.raises(CheckpointError, match="up levels"):
        load_movqgan({"quantize.embedding.weight": torch.ones(2, 4)}, "x.ckpt")
