"""Drafters see the prefix states they were trained on (issue 17 item 1).

LANTERN's released text-to-image drafters were trained on the hidden states of its HF port of LlamaGen,
where a left-padded caption row attends uniformly over the prefill and the drafter masks no prefix key.
Checked here: those features and the drafter's output over a left-padded caption equal a reference
built from transformers' own Llama decoder layers with HF's additive mask over the same weights; the
valid rows, the cache and every image logit are untouched (bit-identical, greedy output equal to AR);
batches equal single runs; the loader reads the convention from the drafter folder (released t2i
layout -> hf_port); and a drafter trained here with one convention loses acceptance when run with the
other, so the convention matters."""
from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch

from lantern_core.conditioning import Condition, build_prefix
from lantern_core.config import GPTConfig, SamplingConfig
from lantern_core.decoding.drafting import DrafterSession, prefix_inputs
from lantern_core.decoding.generate import generate, prefill
from lantern_core.decoding.prefix_states import drafter_features
from lantern_core.decoding.report import stats_payload, stats_text
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.speculative import SpeculativeConfig, speculative_generate
from lantern_core.decoding.tree import NAIVE_EXTEND_57, chain_tree
from lantern_core.errors import CheckpointError
from lantern_core.loading.drafter_io import load_drafter, save_drafter
from lantern_core.training.train_drafter import DrafterData, Recipe, teacher_features, train_drafter
from tests.core.test_drafter_io import released_folder
from tiny_models import TINY_T2I, random_drafter, random_gpt

GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)


def with_states(drafter, states: str):
    """A copy of `drafter` recorded as trained with prefix convention `states` (same weights)."""
    out = copy.deepcopy(drafter)
    out.config = replace(out.config, prefix_states=states)
    return out


def padded_condition(batch: int = 3, seed: int = 9) -> Condition:
    caption = torch.randn(batch, TINY_T2I.cls_token_num, TINY_T2I.caption_dim, generator=torch.Generator().manual_seed(seed))
    valid = torch.tensor([4, 1, 6, 2, 3][:batch])  # real caption tokens per row, left-padded
    mask = torch.arange(TINY_T2I.cls_token_num)[None] >= (TINY_T2I.cls_token_num - valid)[:, None]
    return Condition(caption=caption, caption_mask=mask)


# ------------------------------------------------------------------------ reference: transformers' Llama

def hf_layer(block, config: GPTConfig, drafter_layer: bool = False):
    """transformers' LlamaDecoderLayer (eager attention: scores + additive mask) holding `block`'s weights."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    hf = LlamaConfig(hidden_size=config.dim, intermediate_size=config.ffn_dim, num_attention_heads=config.n_head,
                     num_key_value_heads=config.n_kv_head, rms_norm_eps=config.norm_eps, hidden_act="silu",
                     attention_bias=False, mlp_bias=False)
    hf._attn_implementation = "eager"
    layer = LlamaDecoderLayer(hf, layer_idx=0).eval()
    q, k, v = block.attention.wqkv.weight.split([config.dim, config.dim, config.dim])
    with torch.no_grad():
        for mine, theirs in ((q, layer.self_attn.q_proj), (k, layer.self_attn.k_proj), (v, layer.self_attn.v_proj),
                             (block.attention.wo.weight, layer.self_attn.o_proj),
                             (block.feed_forward.w1.weight, layer.mlp.gate_proj),
                             (block.feed_forward.w3.weight, layer.mlp.up_proj),
                             (block.feed_forward.w2.weight, layer.mlp.down_proj)):
            theirs.weight.copy_(mine)
        layer.post_attention_layernorm.weight.copy_(block.ffn_norm.weight)
        if drafter_layer:  # LlamaGen's drafter layer has no input norm
            layer.input_layernorm = torch.nn.Identity()
        else:
            layer.input_layernorm.weight.copy_(block.attention_norm.weight)
    return layer


def hf_additive_mask(key_valid: torch.Tensor) -> torch.Tensor:
    """HF 4.45's 4-D mask: finfo.min above the diagonal, then finfo.min on every padded key column."""
    rows, T = key_valid.shape
    low = torch.finfo(torch.float32).min
    causal = torch.full((T, T), low).triu(1)[None, None].expand(rows, 1, T, T)
    return causal.masked_fill(~key_valid[:, None, None, :], low)


def hf_port_target(model, embeddings: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """LANTERN's HF port of LlamaGen-T2I over the caption prefill: Llama layers, the additive mask, and
    LlamaGen's zero RoPE rows on the prefix (cos = sin = 0), then the final RMSNorm."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    c = model.config
    rows, T, _ = embeddings.shape
    zeros = torch.zeros(rows, T, c.head_dim)
    mask = hf_additive_mask(key_valid)
    h = embeddings
    with torch.no_grad():
        for block in model.layers:
            h = hf_layer(block, c)(h, attention_mask=mask, position_embeddings=(zeros, zeros))
        norm = LlamaRMSNorm(c.dim, eps=c.norm_eps)
        norm.weight.copy_(model.norm.weight)
        return norm(h)


def hf_port_drafter(drafter, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """LANTERN's LlamaGen drafter over the prefix: fc([emb; feature]) then one Llama layer without input
    norm, plain causal mask (no padding mask). Its 2-D RoPE is zero on the first T-1 prefix slots and the
    identity (grid cell (0, 0)) on the last one."""
    c = drafter.config
    rows, T, _ = features.shape
    head = c.dim // c.n_head
    cos = torch.zeros(rows, T, head)
    cos[:, -1] = 1.0
    sin = torch.zeros(rows, T, head)
    with torch.no_grad():
        h = torch.nn.functional.linear(torch.cat([drafter.embed_tokens(tokens), features], -1),
                                       drafter.fc.weight, drafter.fc.bias)
        layer = hf_layer(drafter.layers[0], c.block_config(), drafter_layer=True)
        return layer(h, attention_mask=hf_additive_mask(torch.ones(rows, T, dtype=torch.bool)),
                     position_embeddings=(cos, sin))


def session_after_prefill(model, drafter, condition: Condition):
    """Our decode path up to the drafter's prefix: prefill, the features in the drafter's convention, one
    `consume`. Returns (prefix, prefill hidden, drafter features, session, the drafter's fed tokens)."""
    prefix = build_prefix(model, condition, guided=True)
    rows, T = prefix.key_valid.shape
    slots = T + 8
    cache = model.allocate_cache(rows, slots)
    key_valid = torch.ones(rows, slots, dtype=torch.bool)
    with torch.no_grad():
        hidden = prefill(model, prefix, cache, key_valid)
        feats = drafter_features(model, prefix.embeddings, prefix.key_valid, hidden, drafter.config.prefix_states)
        session = DrafterSession(drafter, rows, slots, key_valid)
        fed, _ = prefix_inputs(drafter, model, None, torch.tensor([7, 3, 11]), rows, T)
        session.consume(feats, fed)
    return prefix, hidden, feats, session, fed


def test_features_and_drafter_output_match_transformers_llama_with_an_additive_mask():
    model = random_gpt(TINY_T2I, seed=5)
    drafter = with_states(random_drafter(model, seed=2, std=0.3), "hf_port")
    condition = padded_condition()
    prefix, hidden, feats, session, fed = session_after_prefill(model, drafter, condition)
    valid = prefix.key_valid
    assert (~valid).sum() > 6 and valid.sum(1).min() >= 1
    reference = hf_port_target(model, prefix.embeddings, valid)
    torch.testing.assert_close(feats, reference, rtol=1e-5, atol=1e-5)  # every row: padded ones the port's
    # the padded rows are the uniform mean over the prefill: not what LlamaGen's own forward gives them
    assert (hidden - reference)[~valid].abs().max() > 0.3
    port = hf_port_drafter(drafter, reference, fed)[:, -1]  # values O(1): float32 rounding amplified by the layer
    torch.testing.assert_close(session.root_feature, port, rtol=1e-4, atol=1e-4)
    # the same weights in the native convention (padded rows and keys as LlamaGen's) differ from the port
    native = session_after_prefill(model, with_states(drafter, "native"), condition)[3]
    assert (native.root_feature - session.root_feature).abs().max() > 0.05


def test_valid_rows_cache_and_image_tokens_are_untouched():
    """Only the drafter's features change: valid rows are the prefill's own bits, greedy output equals AR,
    and a sampled lossless run differs from the native one only through the drafts (same first token)."""
    model = random_gpt(TINY_T2I, seed=5)
    drafter = random_drafter(model, seed=2, std=0.3)
    condition = padded_condition()
    prefix, hidden, feats, _, _ = session_after_prefill(model, with_states(drafter, "hf_port"), condition)
    valid = prefix.key_valid
    assert torch.equal(feats[valid], hidden[valid]) and not torch.equal(feats, hidden)
    assert torch.equal(model.logits(feats[:, -1]), model.logits(hidden[:, -1]))  # the first image token's logits
    with torch.no_grad():
        ar = generate(model, condition, GREEDY, make_generators(0, 3))
        for states in ("native", "hf_port"):
            for spec in (SpeculativeConfig(static_tree=NAIVE_EXTEND_57),
                         SpeculativeConfig(tree="dynamic")):
                got = speculative_generate(model, with_states(drafter, states), condition, GREEDY, spec,
                                           make_generators(0, 3), compile="off")
                assert torch.equal(got.tokens, ar.tokens), (states, spec.tree)
                payload = stats_payload(got, "eagle2", "t", "d", ["c"] * 3)  # what the node and --json report
                assert payload["drafter_prefix_states"] == states
                assert ("HF-port" in stats_text(payload)) == (states == "hf_port")


@pytest.mark.parametrize("states", ["native", "hf_port"])
def test_training_teaches_on_the_features_decoding_hands_over(states):
    """Drafter training's teacher pass gives the prefix rows the features decoding gives them, per convention."""
    model = random_gpt(TINY_T2I, seed=5)
    condition = padded_condition()
    _, _, feats, _, _ = session_after_prefill(model, with_states(random_drafter(model), states), condition)
    tokens = torch.randint(0, TINY_T2I.vocab_size, (3, TINY_T2I.num_image_tokens), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        teacher = teacher_features(model, condition, tokens, states)
    T = teacher.prefix_len
    torch.testing.assert_close(teacher.features[:, :T], feats[:3], rtol=1e-5, atol=1e-5)  # the conditional rows


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_batches_of_left_padded_captions_equal_single_runs(tree):
    """The drafter's own all-valid key mask survives batch row selection (finished images leave the batch)."""
    model = random_gpt(TINY_T2I, seed=5)
    drafter = with_states(random_drafter(model, seed=2, std=0.3), "hf_port")
    spec = SpeculativeConfig(static_tree=NAIVE_EXTEND_57) if tree == "static" else SpeculativeConfig(tree="dynamic")
    condition = padded_condition()
    with torch.no_grad():
        batch = speculative_generate(model, drafter, condition, SAMPLED, spec, make_generators(4, 3), compile="off")
        for i in range(3):
            row = Condition(caption=condition.caption[i:i + 1], caption_mask=condition.caption_mask[i:i + 1])
            alone = speculative_generate(model, drafter, row, SAMPLED, spec, make_generators(4 + i, 1), compile="off")
            assert torch.equal(batch.tokens[i], alone.tokens[0]), i
            assert torch.equal(batch.accepted_per_cell[i], alone.accepted_per_cell[0]), i
    assert len({p["iterations"] for p in batch.stats.per_image}) > 1  # images left the batch at different times


def test_a_selected_session_keeps_its_convention():
    """Row selection (an image leaving the batch) keeps the hf_port drafter's all-valid keys, and a native
    drafter's shared padding mask."""
    model = random_gpt(TINY_T2I, seed=5)
    drafter = random_drafter(model, seed=2, std=0.3)
    rows = torch.tensor([0, 2, 3, 5])
    for states in ("hf_port", "native"):
        prefix, _, _, session, _ = session_after_prefill(model, with_states(drafter, states), padded_condition())
        target_valid = torch.ones(6, 14, dtype=torch.bool)
        target_valid[:, :prefix.key_valid.shape[1]] = prefix.key_valid
        selected = target_valid.index_select(0, rows)
        chosen = session.select_rows(rows, selected)
        if states == "hf_port":
            assert chosen.key_valid.all() and chosen.key_valid.shape == selected.shape
        else:
            assert chosen.key_valid is selected and not selected.all()


# ------------------------------------------------------------------------------------------ the loader

def test_the_loader_reads_the_convention_from_the_drafter_folder(tmp_path):
    target = random_gpt(TINY_T2I)
    drafter = random_drafter(target)
    folder = released_folder(tmp_path, drafter, input_type="t2i")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["lantern"] = {"grid_size": 4, "cls_token_num": 5}  # sizes for the tiny target
    (folder / "config.json").write_text(json.dumps(cfg))
    assert load_drafter(folder, target.config).config.prefix_states == "hf_port"  # released t2i, sizes added
    cfg["input_type"] = "c2i"
    (folder / "config.json").write_text(json.dumps(cfg))
    assert load_drafter(folder, target.config).config.prefix_states == "native"
    cfg["input_type"] = "t2i"
    for states in ("hf_port", "native"):
        cfg["lantern"] = {"grid_size": 4, "cls_token_num": 5, "prefix_states": states}
        (folder / "config.json").write_text(json.dumps(cfg))
        assert load_drafter(folder, target.config).config.prefix_states == states
    cfg["lantern"]["prefix_states"] = "hf"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"prefix_states.*'hf'.*hf_port"):
        load_drafter(folder, target.config)
    # ours round-trips with the convention written into config.json
    mine = save_drafter(with_states(drafter, "hf_port"), tmp_path / "mine")
    assert json.loads((mine / "config.json").read_text())["lantern"]["prefix_states"] == "hf_port"
    assert load_drafter(mine, target.config).config.prefix_states == "hf_port"
    assert load_drafter(save_drafter(drafter, tmp_path / "plain"), target.config).config.prefix_states == "native"
    # a drafter saved before the convention was recorded (the embedded one) is ours: native
    from pathlib import Path

    embedded = Path(__file__).resolve().parents[2] / "lantern_core" / "assets" / "default" / "drafter"
    assert "prefix_states" not in json.loads((embedded / "config.json").read_text())["lantern"]
    assert load_drafter(embedded).config.prefix_states == "native"


def test_a_released_t2i_folder_is_read_as_the_hf_port():
    """LANTERN's released LlamaGen-T2I layout (input_type t2i, no entry of ours) means hf_port; a released
    c2i folder and a Chameleon drafter stay native (prefix_convention on their configs)."""
    from lantern_core.config import DrafterConfig
    from lantern_core.loading.drafter_io import prefix_convention

    llamagen, chameleon = DrafterConfig(), DrafterConfig(family="chameleon", input_norm=True, qk_norm=True, rope_dims=1)
    assert prefix_convention({"input_type": "t2i"}, llamagen) == "hf_port"
    assert prefix_convention({"input_type": "t2i2"}, llamagen) == "hf_port"
    assert prefix_convention({"input_type": "c2i"}, llamagen) == "native"
    assert prefix_convention({"model_type": "chameleon"}, chameleon) == "native"
    assert prefix_convention({}, llamagen) == "native"


# ------------------------------------------------------------------------------- the convention matters

PADDED_T2I = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=48, model_type="t2i", caption_dim=24,
                       cls_token_num=10, grid_size=4)
NO_CFG_GREEDY = SamplingConfig(cfg_scale=1.0, temperature=0.0)


def heavily_padded(count: int, seed: int) -> Condition:
    """Captions of 1-3 real tokens left-padded to 10."""
    g = torch.Generator().manual_seed(seed)
    caption = torch.randn(count, 10, 24, generator=g)
    valid = torch.randint(1, 4, (count,), generator=g)
    return Condition(caption=caption, caption_mask=torch.arange(10)[None] >= (10 - valid)[:, None])


def test_a_drafter_run_with_the_other_convention_loses_acceptance(tmp_path):
    """Two drafters trained on the same greedy sequences, one per convention: each accepts more when run
    with its own convention than with the other (128 held-out captions, greedy, chain of 4). Measured
    when written: native 1.35 vs 1.28 with hf_port; hf_port 1.34 vs 1.24 with native."""
    torch.set_flush_denormal(True)
    try:
        model = random_gpt(PADDED_T2I, seed=3)
        train = heavily_padded(256, seed=0)
        with torch.no_grad():
            tokens = generate(model, train, NO_CFG_GREEDY, make_generators(0, 256)).tokens
        data = DrafterData(tokens, caption=train.caption, caption_mask=train.caption_mask, sources=("greedy",))
        recipe = Recipe(epochs=80, batch=16, lr=3e-3, checkpoint_every=100_000, seed=1)
        held_out = heavily_padded(128, seed=5)
        rates = {}
        for trained in ("native", "hf_port"):
            drafter, _ = train_drafter(model, data, recipe, tmp_path / trained, prefix_states=trained)
            assert drafter.config.prefix_states == trained
            for run in ("native", "hf_port"):
                with torch.no_grad():
                    result = speculative_generate(model, with_states(drafter, run), held_out, NO_CFG_GREEDY,
                                                  SpeculativeConfig(static_tree=chain_tree(4)),
                                                  make_generators(0, 128), compile="off")
                rates[trained, run] = result.stats.mean_accepted_length
    finally:
        torch.set_flush_denormal(False)
    assert rates["native", "native"] > rates["native", "hf_port"] + 0.03, rates
    assert rates["hf_port", "hf_port"] > rates["hf_port", "native"] + 0.03, rates


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_gives_the_port_states_too(dtype):
    """finfo.min of bf16 / fp16 still makes a padded row uniform (its scores are exactly 0 on LlamaGen's
    prefix): the states follow the float32 ones within the dtype's rounding, with nothing infinite."""
    model = random_gpt(TINY_T2I, seed=5)
    drafter = with_states(random_drafter(model, seed=2, std=0.3), "hf_port")
    condition = padded_condition()
    prefix, _, full, _, _ = session_after_prefill(model, drafter, condition)
    half = copy.deepcopy(model).to(dtype)
    _, _, low, _, _ = session_after_prefill(half, drafter.to(dtype), condition)
    assert low.dtype == dtype and torch.isfinite(low).all()
    padded = ~prefix.key_valid
    torch.testing.assert_close(low[padded].float(), full[padded], rtol=0.05, atol=0.05)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_runs_equal_eager_with_an_hf_port_drafter(dtype):
    from lantern_core.decoding import step_graphs

    model = random_gpt(TINY_T2I, seed=5).to("cuda", dtype)
    drafter = with_states(random_drafter(random_gpt(TINY_T2I, seed=5), seed=2, std=0.3), "hf_port").to("cuda", dtype)
    condition = padded_condition()
    condition = Condition(caption=condition.caption.cuda(), caption_mask=condition.caption_mask.cuda())
    for spec in (SpeculativeConfig(static_tree=NAIVE_EXTEND_57), SpeculativeConfig(tree="dynamic")):
        with torch.no_grad():
            runs = [speculative_generate(model, drafter, condition, SAMPLED, spec, make_generators(4, 3, "cuda"),
                                         compile=compile) for compile in ("auto", "off")]
        assert torch.equal(runs[0].tokens, runs[1].tokens), spec.tree
        assert torch.equal(runs[0].accepted_per_cell, runs[1].accepted_per_cell), spec.tree
    step_graphs.release(model)
