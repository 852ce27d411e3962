"""Trees against the vocabulary: a static tree with more children under one node than the
model has codes, or an EAGLE-2 top_k larger than the vocabulary, used to crash inside drafting with torch's
"selected index k out of range". Every (tree, vocabulary, sampling top-k) combination now either runs or is
refused before any forward with a ConfigError naming the tree, its widest node's child count and the
vocabulary size; trees of at most V children per node run, whatever the sampling top-k (a top-k larger than
the vocabulary keeps every code). Lumina-mGPT's forced end-of-row code is not a code a draft can pick."""
from __future__ import annotations

import pytest
import torch

from lantern_core.conditioning import Condition
from lantern_core.config import DrafterConfig, GPTConfig, SamplingConfig
from lantern_core.decoding.trees.drafting import DynamicShape
from lantern_core.decoding.generate import generate
from lantern_core.decoding.acceptance.neighbors import build_neighbors
from lantern_core.decoding.acceptance.relaxation import Relaxation
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding.trees.specs import MC_SIM_7B_63, NAIVE_EXTEND_57, TreeSpec, chain_tree
from lantern_core.errors import ConfigError
from lantern_core.models.drafter import EagleDrafter
from lantern_core.models.prompted import PromptedImageLM
from tests.tiny_models import random_drafter, random_gpt

WIDE_3 = TreeSpec("wide_3", ((0,), (1,), (2,), (0, 0), (0, 1), (0, 2), (1, 0)))
TREES = {  # name -> (config, widest node's child count)
    "naive_extend_57": (SpeculativeConfig(static_tree=NAIVE_EXTEND_57), 5),
    "mc_sim_7b_63": (SpeculativeConfig(static_tree=MC_SIM_7B_63), 4),
    "chain_4": (SpeculativeConfig(static_tree=chain_tree(4)), 1),
    "wide_3": (SpeculativeConfig(static_tree=WIDE_3), 3),
    "eagle2 d3 k3 n8": (SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(depth=3, top_k=3, nodes=8)), 3),
    "eagle2 d3 k4 n8": (SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(depth=3, top_k=4, nodes=8)), 4),
    "eagle2 d2 k6 n6": (SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(depth=2, top_k=6, nodes=6)), 6),
}
SAMPLINGS = {"top_k off": SamplingConfig(cfg_scale=2.0, top_k=0), "top_k 2": SamplingConfig(cfg_scale=2.0, top_k=2),
             "top_k 1000 (> V)": SamplingConfig(cfg_scale=2.0, top_k=1000),
             "greedy": SamplingConfig(cfg_scale=2.0, temperature=0.0)}
_MODELS: dict = {}


def tiny(vocab: int):
    if vocab not in _MODELS:
        config = GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=vocab, model_type="c2i", num_classes=3,
                           cls_token_num=1, grid_size=2)
        model = random_gpt(config, seed=vocab)
        _MODELS[vocab] = model, random_drafter(model, seed=vocab + 1)
    return _MODELS[vocab]


def assert_refused(exc: pytest.ExceptionInfo, tree: str, widest: int, vocab: int) -> None:
    text = str(exc.value)
    assert f"'{tree}'" in text and f"{widest} children" in text, text
    assert f"at most {vocab} children" in text and f"{vocab} image codes" in text, text
    assert "Fix:" in text and "larger vocabulary" in text, text


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
@pytest.mark.parametrize("tree", sorted(TREES))
@pytest.mark.parametrize("vocab", [3, 5])
def test_every_tree_vocabulary_and_top_k_runs_or_names_the_tree(vocab, tree, sampling):
    model, drafter = tiny(vocab)
    spec, widest = TREES[tree]
    config = SAMPLINGS[sampling]
    cond = Condition.classes([1, 2])
    if widest > vocab:
        with pytest.raises(ConfigError) as exc:
            speculative_generate(model, drafter, cond, config, spec, make_generators(0, 2), compile="off")
        assert_refused(exc, tree, widest, vocab)
        return
    out = speculative_generate(model, drafter, cond, config, spec, make_generators(0, 2), compile="off")
    assert out.tokens.shape == (2, 4) and 0 <= int(out.tokens.min()) and int(out.tokens.max()) < vocab
    if config.greedy:  # children beyond the codes the target keeps are never accepted: greedy AR's tokens
        assert torch.equal(out.tokens, generate(model, cond, config).tokens)


@pytest.mark.parametrize("vocab", [3, 5])
def test_auto_refuses_a_base_tree_wider_than_the_vocabulary_before_calibrating(vocab, monkeypatch):
    from lantern_core.decoding.trees import auto as tree_auto

    model, drafter = tiny(vocab)
    calls = []
    monkeypatch.setattr(tree_auto, "_calibrate", lambda *a, **k: calls.append(a) or (chain_tree(1), "stub"))
    spec = SpeculativeConfig(tree="auto", static_tree=NAIVE_EXTEND_57)
    if vocab < 5:
        with pytest.raises(ConfigError) as exc:
            speculative_generate(model, drafter, Condition.classes([0]), SamplingConfig(), spec, compile="off")
        assert_refused(exc, "naive_extend_57", 5, vocab)
        assert "auto" in str(exc.value) and not calls  # refused before any (calibration) forward
    else:
        out = speculative_generate(model, drafter, Condition.classes([0]), SamplingConfig(), spec, compile="off")
        assert out.tokens.shape == (1, 4)


def test_a_refused_tree_runs_no_forward(monkeypatch):
    model, drafter = tiny(3)
    forwards = []
    monkeypatch.setattr(type(model), "forward", lambda *a, **k: forwards.append(1))
    with pytest.raises(ConfigError, match="naive_extend_57"):
        speculative_generate(model, drafter, Condition.classes([0]), SamplingConfig(), TREES["naive_extend_57"][0])
    assert not forwards


@pytest.mark.parametrize("k,runs", [(2, True), (3, False)])
def test_relaxed_neighbour_count_against_the_codebook(k, runs):
    model, drafter = tiny(3)
    table = build_neighbors(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), 2)
    spec = SpeculativeConfig(static_tree=WIDE_3, relaxation=Relaxation(k=k, lam=4.0))
    call = lambda: speculative_generate(model, drafter, Condition.classes([0]), SamplingConfig(), spec,  # noqa: E731
                                        make_generators(0, 1), table.repeat(1, 2), compile="off")
    if runs:
        assert call().tokens.shape == (1, 4)
    else:
        with pytest.raises(ConfigError, match=r"lantern_k.*at most 2 latent neighbours.*Fix: lower lantern_k"):
            call()


def lumina_like():
    """A tiny Lumina-mGPT-shaped target: 3 image codes plus the forced end-of-row code (vocab_size 4)."""
    config = GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=4, model_type="prompt", family="chameleon",
                       rope_dims=1, row_end=True, text_vocab_size=16, grid_size=2, cls_token_num=4, qk_norm=True)
    model = PromptedImageLM(config)
    model.init_weights(torch.Generator().manual_seed(0), std=0.3)
    drafter = EagleDrafter(DrafterConfig.for_target(config, ffn_dim=48))
    drafter.init_from_target(model, torch.Generator().manual_seed(1), std=0.1)
    ids = torch.tensor([[1, 5, 6]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    return model.eval(), drafter.eval(), Condition(prompt_ids=ids, prompt_mask=mask, uncond_ids=ids[:, :1],
                                                   uncond_mask=mask[:, :1])


@pytest.mark.parametrize("width", [3, 4])
@pytest.mark.parametrize("dynamic", [False, True])
def test_lumina_counts_the_codes_a_draft_can_pick(width, dynamic):
    """vocab_size 4 = 3 codes + end-of-row: 3 children per node run (and keep the row layout), 4 are refused
    (the fourth would always be the end-of-row code, impossible at a code position)."""
    model, drafter, cond = lumina_like()
    tree = TreeSpec(f"root_{width}", tuple((r,) for r in range(width)))
    spec = (SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(depth=2, top_k=width, nodes=width)) if dynamic
            else SpeculativeConfig(static_tree=tree))
    name = f"eagle2 d2 k{width} n{width}" if dynamic else tree.name
    sampling = SamplingConfig(cfg_scale=2.0, top_k=1000)
    if width == 4:
        with pytest.raises(ConfigError) as exc:
            speculative_generate(model, drafter, cond, sampling, spec, make_generators(0, 1), compile="off")
        assert_refused(exc, name, 4, 3)
        assert "4 less the forced end-of-row code" in str(exc.value)
        return
    tokens = speculative_generate(model, drafter, cond, sampling, spec, make_generators(0, 1), compile="off").tokens
    assert tokens.shape == (1, 6) and tokens[0, 2] == 3 and tokens[0, 5] == 3  # end-of-row after each row of 2
    assert int(tokens[0, [0, 1, 3, 4]].max()) < 3


@pytest.fixture(scope="module")
def three_code_files(tmp_path_factory):
    """A 3-code c2i GPT, its VQ (3 codes) and a drafter, as the files the command line takes."""
    from lantern_core.config import VQConfig
    from lantern_core.loading.checkpoint_io import write_safetensors
    from lantern_core.loading.drafter_io import save_drafter
    from tests.tiny_models import random_vq

    folder = tmp_path_factory.mktemp("three_codes")
    model, drafter = tiny(3)
    vq = VQConfig(codebook_size=3, codebook_embed_dim=4, ch=32, encoder_ch_mult=(1, 1, 2), decoder_ch_mult=(1, 1, 2),
                  z_channels=32, num_res_blocks=1)
    write_safetensors(folder / "gpt.safetensors", model.state_dict(), {"kind": "gpt", "config": model.config.to_dict()})
    write_safetensors(folder / "vq.safetensors", random_vq(vq).state_dict(), {"kind": "vq", "config": vq.to_dict()})
    save_drafter(drafter, folder / "drafter")
    return folder


@pytest.mark.parametrize("args,refusal", [
    (["--decoding", "static_tree", "--tree", "naive_extend_57"], ("'naive_extend_57'", "5 children")),
    (["--decoding", "lantern_pp", "--tree", "auto", "--k", "2"], ("'naive_extend_57' (the base tree of 'auto')",
                                                                  "5 children")),
    (["--decoding", "eagle2", "--eagle-depth", "3", "--eagle-top-k", "4", "--eagle-nodes", "8"],
     ("'eagle2 d3 k4 n8'", "4 children", "--eagle-top-k")),
    (["--decoding", "static_tree", "--tree", "custom", "--custom-tree", "[[0], [1], [2], [0, 0]]"], None),
    (["--decoding", "eagle2", "--eagle-depth", "3", "--eagle-top-k", "3", "--eagle-nodes", "8", "--top-k", "50"],
     None),
])
def test_the_command_line_names_a_tree_wider_than_the_vocabulary(three_code_files, tmp_path, monkeypatch, capsys,
                                                                  args, refusal):
    from lantern_core import cli
    from lantern_core.decoding import auto_store

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    f = three_code_files
    try:
        rc = cli.main(["generate", "--gpt", str(f / "gpt.safetensors"), "--vq", str(f / "vq.safetensors"),
                       "--drafter", str(f / "drafter"), "--cls", "1", "--out", str(tmp_path / "out"), "--json", *args])
    finally:
        auto_store.use_store(None)
    err = capsys.readouterr().err
    if refusal is None:
        assert rc == 0, err
        assert (tmp_path / "out" / "lantern_00000.png").is_file()
        return
    assert rc == 2 and "Traceback" not in err and "index k out of range" not in err, err
    assert err.startswith("error: Invalid") and all(part in err for part in refusal), err
    assert "at most 3 children" in err and "3 image codes" in err and "larger vocabulary" in err, err
