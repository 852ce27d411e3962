"""Drafters for the prompted families: the released Anole drafter layout (one transformers Chameleon
decoder layer, 65,536-row embedding, rotate-half RoPE) loads strictly and computes what that layer
computes; our own family drafters round-trip through save/load; LANTERN / LANTERN++ / EAGLE-2 decode
Anole and Janus-Pro (greedy exact modes reproduce greedy AR token for token); and the training command
trains a drafter on a family target from self-distilled prompts, which then drafts better than an
untrained one."""
from __future__ import annotations

import json

import pytest
import torch

from lantern_core.config import DrafterConfig, SamplingConfig
from lantern_core.loading.drafter_io import load_drafter, save_drafter
from lantern_core.decoding.trees.drafting import DynamicShape
from lantern_core.errors import CheckpointError
from lantern_core.loading.families import load_prompted
from lantern_core.decoding.generate import generate
from lantern_core.models.drafter import EagleDrafter
from lantern_core.models.gpt import ForwardStep
from lantern_core.decoding.acceptance.neighbors import build_neighbors
from lantern_core.decoding.acceptance.relaxation import Relaxation
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding.trees.specs import NAIVE_EXTEND_57, chain_tree
from tests.tolerances import assert_close_to_reference, float64_copy, transformer_tolerance
from tests.tiny_families import (save_chameleon_folder, save_chameleon_vqgan, save_janus_folder,
                                 write_released_anole_drafter)

PROMPTS = ["a red cat", "a photo of the blue sky", "a painting of a dog on the grass"]


@pytest.fixture(scope="module")
def anole(tmp_path_factory):
    folder = tmp_path_factory.mktemp("anole")
    reference = save_chameleon_folder(folder, seed=5)
    save_chameleon_vqgan(folder / "vqgan.ckpt")
    return folder, reference, load_prompted(folder, grid_size=4, max_prompt_tokens=32)


@pytest.fixture(scope="module")
def janus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("janus")
    save_janus_folder(folder, seed=6, grid=4)
    return folder, load_prompted(folder, max_prompt_tokens=32)


def test_released_anole_drafter_loads_and_matches_a_chameleon_layer(anole, tmp_path):
    folder, reference, loaded = anole
    layer, fc, embedding, config = write_released_anole_drafter(tmp_path / "anole_drafter", reference)
    target = loaded.model
    with pytest.raises(CheckpointError, match="Chameleon target"):
        load_drafter(tmp_path / "anole_drafter", None)
    drafter = load_drafter(tmp_path / "anole_drafter", target.config, image_token_ids=target.image.token_ids).model
    c = drafter.config
    assert (c.family, c.qk_norm, c.input_norm, c.rope_dims, c.vocab_size) == ("chameleon", True, True, 1, 64)
    assert c.norm_eps == config.rms_norm_eps  # its effect (~1e-5) hides under float32's rounding below

    from transformers.models.chameleon.modeling_chameleon import ChameleonRotaryEmbedding

    g = torch.Generator().manual_seed(0)
    T = 12
    features = torch.randn(2, T, config.hidden_size, generator=g)
    codes = torch.randint(0, 64, (2, T), generator=g)
    positions = torch.arange(T)
    with torch.no_grad():  # transformers' layer in float64: the comparison needs no CPU's BLAS
        h = float64_copy(fc)(torch.cat([embedding[target.image.token_ids[codes]], features], -1).double())
        rope = ChameleonRotaryEmbedding(config)(h, positions[None].expand(2, -1))
        causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        expected = float64_copy(layer)(h, attention_mask=causal, position_ids=positions[None], position_embeddings=rope)
        expected = expected[0] if isinstance(expected, tuple) else expected
        ours = drafter(features, codes, ForwardStep(positions))
    assert expected.abs().max() > 1 and expected.dtype == torch.float64
    # fc (inner size 2 * hidden) then one decoder layer
    assert_close_to_reference(ours, expected, transformer_tolerance(ours.dtype, 2 * config.hidden_size, layers=1))
    # the prompt positions see the target's embeddings of the next prompt tokens
    assert torch.equal(drafter.embed_tokens.weight, target.embed_tokens(torch.arange(64)[None])[0])


@pytest.mark.parametrize("family", ["anole", "janus"])
def test_family_drafters_round_trip_through_save_and_load(family, anole, janus, tmp_path):
    target = (anole[2] if family == "anole" else janus[1]).model
    drafter = EagleDrafter(DrafterConfig.for_target(target.config)).eval()
    drafter.init_from_target(target, torch.Generator().manual_seed(1), std=0.2)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() <= 2 and p.requires_grad:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    save_drafter(drafter, tmp_path / "d")
    hf = json.loads((tmp_path / "d" / "config.json").read_text())
    assert hf["lantern"]["family"] == target.config.family
    again = load_drafter(tmp_path / "d", target.config,
                         image_token_ids=getattr(target.image, "token_ids", None)).model
    feats = torch.randn(1, 9, target.config.dim, generator=torch.Generator().manual_seed(2))
    codes = torch.randint(0, target.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(again(feats, codes, ForwardStep(torch.arange(9))),
                                   drafter(feats, codes, ForwardStep(torch.arange(9))))
    other = anole[2].model if family == "janus" else janus[1].model
    with pytest.raises(CheckpointError, match="model family"):
        load_drafter(tmp_path / "d", other.config)


def drafter_for(target, seed=1):
    drafter = EagleDrafter(DrafterConfig.for_target(target.config)).eval()
    drafter.init_from_target(target, torch.Generator().manual_seed(seed), std=0.2)
    return drafter


@pytest.mark.parametrize("family", ["anole", "janus"])
@pytest.mark.parametrize("mode", ["static", "chain", "eagle2", "lantern_pp_lambda1", "sjd_relaxed_lambda1"])
def test_greedy_speculative_modes_equal_greedy_ar_on_the_families(family, mode, anole, janus):
    loaded = anole[2] if family == "anole" else janus[1]
    target, encoder = loaded.model, loaded.encoder
    drafter = drafter_for(target)
    condition = encoder.encode(PROMPTS)  # prompts of different lengths: left padding in the prefix
    sampling = SamplingConfig(cfg_scale=3.0, temperature=0.0)
    neighbors = None
    if mode == "static":
        spec = SpeculativeConfig(tree="static", static_tree=NAIVE_EXTEND_57)
    elif mode == "chain":
        spec = SpeculativeConfig(tree="static", static_tree=chain_tree(4))
    elif mode in ("eagle2", "sjd_relaxed_lambda1"):
        spec = SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(depth=3, top_k=4, nodes=12))
    else:
        spec = SpeculativeConfig(tree="static", static_tree=NAIVE_EXTEND_57,
                                 relaxation=Relaxation(k=5, lam=1.0))
        neighbors = build_neighbors(loaded.vq.quantize.embedding.weight, 5)
    if mode == "sjd_relaxed_lambda1":  # relaxed Jacobi (LANTERN++ rule on the window), exact at lambda 1
        from lantern_core.decoding.jacobi.config import JacobiConfig
        from lantern_core.decoding.jacobi.driver import jacobi_generate

        neighbors = build_neighbors(loaded.vq.quantize.embedding.weight, 5)
        window = JacobiConfig(window=4, relaxation=Relaxation(k=5, lam=1.0))
        run = lambda g: jacobi_generate(target, condition, sampling, window, g, neighbors)  # noqa: E731
    else:
        run = lambda g: speculative_generate(target, drafter, condition, sampling, spec, g, neighbors)  # noqa: E731
    with torch.no_grad():
        ar = generate(target, condition, sampling, make_generators(0, 3, torch.device("cpu")))
        spec_out = run(make_generators(0, 3, torch.device("cpu")))
    assert ar.tokens.unique().numel() > 4
    assert torch.equal(spec_out.tokens, ar.tokens)
    assert spec_out.stats.forward_passes < 3 * target.config.num_image_tokens or mode == "chain"


def test_training_command_trains_a_family_drafter_that_drafts_better(janus, tmp_path):
    """`python -m lantern_core.training.train_drafter --target <Janus folder> --prompts F --self-distill N` trains on
    self-distilled sequences; the loss falls and the trained drafter is accepted more often than the
    untrained one under the same seeds."""
    from lantern_core.training.train_drafter import main

    folder, loaded = janus
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS + ["the sky on the grass", "a cat on a dog"]) + "\n")
    out = tmp_path / "drafter"
    code = main(["--target", str(folder), "--prompts", str(prompts), "--self-distill", "24", "--cfg", "3",
                 "--out", str(out), "--epochs", "20", "--batch", "8", "--lr", "3e-3", "--checkpoint-every", "1000"])
    assert code == 0
    log = json.loads((out / "training_log.json").read_text())
    assert log["samples"] == 120 and log["finished"]
    target = loaded.model
    trained = load_drafter(out, target.config).model
    # the loss on a batch of the training data: trained vs a fresh drafter
    from lantern_core.training.train_drafter import Recipe, drafter_loss, self_distilled_data

    data = self_distilled_data(target, loaded.encoder.encode(PROMPTS), SamplingConfig(cfg_scale=3.0), seed=1)
    batch = data.batch(torch.arange(3), target, torch.zeros(3, dtype=torch.bool))
    losses = {name: drafter_loss(d, target, batch, data.tokens, Recipe(noise_std=0.0),
                                 torch.Generator().manual_seed(0))[1]
              for name, d in (("trained", trained), ("untrained", drafter_for(target, seed=4)))}
    assert losses["trained"]["loss"] < 0.7 * losses["untrained"]["loss"], losses
    assert losses["trained"]["top1"] > losses["untrained"]["top1"] + 0.2, losses
    condition = loaded.encoder.encode(PROMPTS * 2)
    sampling = SamplingConfig(cfg_scale=3.0, temperature=1.0)
    spec = SpeculativeConfig(tree="static", static_tree=NAIVE_EXTEND_57)
    with torch.no_grad():
        runs = {name: speculative_generate(target, d, condition, sampling, spec,
                                           make_generators(11, 6, torch.device("cpu")))
                for name, d in (("trained", trained), ("untrained", drafter_for(target, seed=4)))}
    accepted = {k: v.stats.mean_accepted_length for k, v in runs.items()}
    assert accepted["trained"] > accepted["untrained"] + 0.3, accepted
