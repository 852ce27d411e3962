"""Drafters see the prefix states they were trained on.

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
import math
from dataclasses import replace

import pytest
import torch

from lantern_core.conditioning import Condition, build_prefix
from lantern_core.config import GPTConfig, SamplingConfig
from lantern_core.decoding.trees.drafting import DrafterSession, prefix_inputs
from lantern_core.decoding.generate import generate, prefill
from lantern_core.decoding.trees.prefix_states import drafter_features
from lantern_core.decoding.report import stats_payload, stats_text
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding.trees.specs import NAIVE_EXTEND_57, chain_tree
from lantern_core.errors import CheckpointError
from lantern_core.loading.drafter_io import load_drafter, save_drafter
from lantern_core.training.train_drafter import DrafterData, Recipe, teacher_features, train_drafter
from tests.core.test_drafter_io import released_folder
from tests.tolerances import float64_copy, rounded_tolerance as tolerance
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


# ----------------------------------------------------- reference: LANTERN's HF port, step by step

def lantern_port_mask(key_valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """LANTERN's `_prepare_decoder_attention_mask` (models/kv_variants/modeling_llamagen_kv.py, commit
    3a56e45) for a run in `dtype`, step by step: `_make_causal_mask` in float32 (a full finfo(float32).min
    matrix, zeroed where key < query + 1), `_expand_mask` in `dtype` (1 - mask, then finfo(dtype).min where
    that is nonzero), and their sum (float32 by type promotion). Returns (rows, 1, T, T) float32."""
    rows, T = key_valid.shape
    causal = torch.full((T, T), torch.finfo(torch.float32).min)
    cond = torch.arange(T)
    causal.masked_fill_(cond < (cond + 1).view(T, 1), 0)
    causal = causal.to(torch.float32)[None, None].expand(rows, 1, T, T)
    expanded = key_valid[:, None, None, :].expand(rows, 1, T, T).to(dtype)
    inverted = 1.0 - expanded
    padding = inverted.masked_fill(inverted.to(torch.bool), torch.finfo(dtype).min)
    return padding + causal


def todays_mask(key_valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The mask this module once built: finfo(dtype).min on every key a row may not see (a
    padded row then spreads over every key of the prefill). Kept to show the reference test fails on it."""
    T = key_valid.shape[1]
    pos = torch.arange(T)
    allowed = (pos[None, :] <= pos[:, None])[None] & key_valid[:, None, :]
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def port_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LANTERN's LlamaRMSNorm: variance in float32 (here: the reference's compute dtype), weight last."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def port_rotary(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """LlamaGen's apply_rotary_emb: x (B, T, H, D), freqs (T, D/2, 2) as (cos, sin) pairs."""
    xs = x.reshape(*x.shape[:-1], -1, 2)  # (B, T, H, D/2, 2)
    f = freqs.view(1, xs.shape[1], 1, xs.shape[3], 2).to(x.dtype)
    out = torch.stack([xs[..., 0] * f[..., 0] - xs[..., 1] * f[..., 1],
                       xs[..., 1] * f[..., 0] + xs[..., 0] * f[..., 1]], dim=-1)
    return out.flatten(3)


def port_layer(block, heads: int, eps: float, h: torch.Tensor, mask: torch.Tensor, freqs: torch.Tensor,
               input_norm: bool = True) -> torch.Tensor:
    """LANTERN's LlamaDecoderLayer / LlamaAttention (eager: scores / sqrt(d) + mask, softmax, values),
    holding `block`'s weights, in h's dtype. A LlamaGen drafter layer has no input norm."""
    B, T, dim = h.shape
    D = dim // heads
    weight = lambda p: p.to(h.dtype)  # noqa: E731
    x = port_rms(h, weight(block.attention_norm.weight), eps) if input_norm else h
    q, k, v = torch.nn.functional.linear(x, weight(block.attention.wqkv.weight)).split(dim, dim=-1)
    q, k = (port_rotary(t.view(B, T, heads, D), freqs).transpose(1, 2) for t in (q, k))
    v = v.view(B, T, heads, D).transpose(1, 2)
    scores = q @ k.transpose(2, 3) / math.sqrt(D) + mask  # float32 mask: promoted, as in LANTERN
    attn = torch.softmax(scores, dim=-1) @ v  # (B, H, T, D)
    h = h + torch.nn.functional.linear(attn.transpose(1, 2).reshape(B, T, dim), weight(block.attention.wo.weight))
    ff = block.feed_forward.state_dict()  # the checkpoint's names: w1, w2, w3
    x = port_rms(h, weight(block.ffn_norm.weight), eps)
    gate = torch.nn.functional.linear(x, weight(ff["w1.weight"]))
    up = torch.nn.functional.linear(x, weight(ff["w3.weight"]))
    return h + torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, weight(ff["w2.weight"]))


def lantern_port_target(model, embeddings: torch.Tensor, key_valid: torch.Tensor, run_dtype: torch.dtype,
                        mask_builder=lantern_port_mask) -> torch.Tensor:
    """LANTERN's HF port over the caption prefill for a run in `run_dtype`: its mask built in that dtype's
    arithmetic, every other operation in float64 (so the comparison does not depend on any CPU's BLAS),
    the prefix's RoPE rows (zeros: LlamaGen's cls rows), then the final norm. -> (rows, T, dim) float64."""
    c = model.config
    T = embeddings.shape[1]
    mask = mask_builder(key_valid, run_dtype)
    freqs = model.rope_table[:T].double()
    assert not freqs.any()  # q = k = 0 on the prefix: every score is exactly 0
    h = embeddings.double()
    with torch.no_grad():
        for block in model.layers:
            h = port_layer(block, c.n_head, c.norm_eps, h, mask, freqs)
        return port_rms(h, model.norm.weight.double(), c.norm_eps)


def lantern_port_drafter(drafter, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """LANTERN's LlamaGen drafter (cnets_llamagen.Model.forward) over the prefix, in float64: fc([emb;
    feature]), then one layer without input norm under its own mask: no padding mask (attention_mask
    None -> all ones), only `_make_causal_mask` in float32. Its 2-D RoPE is zero on the first T-1 prefix
    slots and the identity (grid cell (0, 0)) on the last one."""
    c = drafter.config
    rows, T, _ = features.shape
    freqs = torch.zeros(T, c.dim // c.n_head // 2, 2, dtype=torch.float64)
    freqs[-1, :, 0] = 1.0
    with torch.no_grad():
        emb = drafter.embed_tokens(tokens).double()
        h = torch.nn.functional.linear(torch.cat([emb, features.double()], -1), drafter.fc.weight.double(),
                                       drafter.fc.bias.double())
        mask = lantern_port_mask(torch.ones(rows, T, dtype=torch.bool), torch.float32)
        return port_layer(drafter.layers[0], c.n_head, c.norm_eps, h, mask, freqs, input_norm=False)


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
        feats = drafter_features(model, prefix, hidden, drafter.config.prefix_states)
        session = DrafterSession(drafter, rows, slots, key_valid)
        fed, _ = prefix_inputs(drafter, model, None, torch.tensor([7, 3, 11]), rows, T)
        session.consume(feats, fed)
    return prefix, hidden, feats, session, fed


def run_in(dtype: torch.dtype):
    """The tiny t2i target and an hf_port drafter in `dtype` (weights made in float32, then cast)."""
    model = random_gpt(TINY_T2I, seed=5)
    drafter = with_states(random_drafter(model, seed=2, std=0.3), "hf_port")
    return copy.deepcopy(model).to(dtype), drafter.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_features_and_drafter_output_follow_lanterns_mask_arithmetic(dtype, monkeypatch):
    """The drafter's features and its first prediction over a left-padded caption equal LANTERN's HF
    port run in the same dtype (its summed float32 causal + `dtype` padding mask), computed in float64;
    today's mask (finfo.min on every hidden key) and the native convention are far off."""
    from lantern_core.decoding.trees import prefix_states

    model, drafter = run_in(dtype)
    condition = padded_condition()
    prefix, hidden, feats, session, fed = session_after_prefill(model, drafter, condition)
    valid = prefix.key_valid
    assert (~valid).sum() > 6 and valid.sum(1).min() >= 1
    tol = tolerance(dtype, TINY_T2I)
    reference = lantern_port_target(model, prefix.embeddings, valid, dtype)
    torch.testing.assert_close(feats.double(), reference, rtol=tol, atol=tol)  # every row: padded ones the port's
    assert (hidden.double() - reference)[~valid].abs().max() > 4 * tol  # LlamaGen's own forward differs
    port = lantern_port_drafter(drafter, feats, fed)[:, -1]  # on our features, checked just above
    # the random drafter's outputs reach ~60 and cancel: its error scales with the largest value, not each one
    scale = port.abs().max().item()
    dtol = tolerance(dtype, drafter.config.block_config()) * scale  # one layer
    torch.testing.assert_close(session.root_feature.double(), port, rtol=0, atol=dtol)
    # the same weights in the native convention (padded rows and keys as LlamaGen's) differ from the port
    native = session_after_prefill(model, with_states(drafter, "native"), condition)[3]
    assert (native.root_feature.double() - port).abs().max() > 4 * dtol
    # the check fails on the mask this module once built (every hidden key at finfo.min)
    monkeypatch.setattr(prefix_states, "hf_port_mask", todays_mask)
    _, _, old, old_session, _ = session_after_prefill(model, drafter, condition)
    assert (old.double() - reference)[~valid].abs().max() > 4 * tol
    assert (old_session.root_feature.double() - port).abs().max() > 4 * dtol


def test_lanterns_mask_depends_on_the_run_dtype():
    """What LANTERN's arithmetic gives a padded row: float32 -> its padded past keys and every valid key at
    one value (and -inf on padded future keys); bf16 / fp16 -> its padded past keys alone at the top. So
    the port's states in half precision are not its float32 states, and ours follow each: fp16 and bf16
    agree with each other within rounding, and both differ from the float32 states."""
    valid = padded_condition().caption_mask
    T = valid.shape[1]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        mask = lantern_port_mask(valid, dtype)[:, 0]
        for row in range(valid.shape[0]):
            for i in range(T):
                if valid[row, i]:
                    continue
                top = mask[row, i] == mask[row, i].max()
                padded_past = (torch.arange(T) <= i) & ~valid[row]
                expected = padded_past | valid[row] if dtype == torch.float32 else padded_past
                assert torch.equal(top, expected), (dtype, row, i)
    # LANTERN's training-data script ran the port over caption + image tokens in one pass (bf16 by default):
    # in half precision a padded row sees the same keys as in the generator's caption-only prefill, so the
    # released drafters' training and bf16 decoding agree; in float32 the image tokens would join the set
    image = 5
    with_image = torch.cat([valid, torch.ones(valid.shape[0], image, dtype=torch.bool)], 1)
    for dtype in (torch.float32, torch.bfloat16):
        caption_only = lantern_port_mask(valid, dtype)[:, 0]
        training = lantern_port_mask(with_image, dtype)[:, 0, :T]  # the caption rows
        for row, i in (~valid).nonzero().tolist():
            same = torch.equal(training[row, i] == training[row, i].max(),
                               torch.cat([caption_only[row, i] == caption_only[row, i].max(),
                                          torch.ones(image, dtype=torch.bool) if dtype == torch.float32
                                          else torch.zeros(image, dtype=torch.bool)]))
            assert same, (dtype, row, i)
    states = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        model, drafter = run_in(dtype)
        prefix, _, feats, _, _ = session_after_prefill(model, drafter, padded_condition())
        assert feats.dtype == dtype and torch.isfinite(feats).all()
        states[dtype] = feats.double()[~prefix.key_valid]
        reference = lantern_port_target(model, prefix.embeddings, prefix.key_valid, dtype)[~prefix.key_valid]
        tol = tolerance(dtype, TINY_T2I)
        torch.testing.assert_close(states[dtype], reference, rtol=tol, atol=tol)
    half = tolerance(torch.bfloat16, TINY_T2I)
    torch.testing.assert_close(states[torch.float16], states[torch.bfloat16], rtol=half, atol=half)
    assert (states[torch.float32] - states[torch.bfloat16]).abs().max() > 4 * half


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
    # the teacher pass (prefix + image tokens, 3 rows) and the prefill (6 CFG rows) take different kernel
    # paths: both against the float64 reference of their convention (the port's mask in float32 arithmetic)
    if states == "hf_port":
        prefix = build_prefix(model, condition, guided=True)
        reference = lantern_port_target(model, prefix.embeddings[:3], prefix.key_valid[:3], torch.float32)
    else:  # LlamaGen's own forward: our decoding path run in float64
        exact = float64_copy(model)
        reference = session_after_prefill(exact, with_states(random_drafter(model), states).double(), condition)[2][:3]
    tol = tolerance(torch.float32, TINY_T2I) * reference.abs().max().item()
    torch.testing.assert_close(teacher.features[:, :T].double(), reference, rtol=0, atol=tol)
    torch.testing.assert_close(feats[:3].double(), reference, rtol=0, atol=tol)  # the conditional rows


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
        chosen = session.keep_rows(rows.tolist(), selected)
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
