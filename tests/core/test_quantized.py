"""Weight-only int8 / fp8 quantization: the rounding rule, the layer's arithmetic against a float64 reference,
dtype moves, strict loading of already-quantized files (every refusal names the tensor), quantize-at-load for
LlamaGen files and prompted families, and every decoding mode on a quantized target (greedy tokens equal the
quantized target's AR tokens; the whole-image law test is in test_exactness_whole_images)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.decoding.generate import generate
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.acceptance.neighbors import build_neighbors
from lantern_core.decoding.acceptance.relaxation import Relaxation
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding.trees.specs import NAIVE_EXTEND_57
from lantern_core.errors import CheckpointError, ConfigError
from lantern_core.loading.checkpoint_io import write_safetensors
from lantern_core.loading.checkpoints import load_gpt
from lantern_core.models.quantized import (SCHEMES, quantize_blocks, quantize_weight, resident_bytes,
                                           scheme_named, weights_scheme)
from tests.tiny_models import TINY_C2I, TINY_GQA, random_drafter, random_gpt
from tests.tolerances import assert_close_to_reference, float64_copy, model_tolerance

FORMATS = sorted(SCHEMES)


def test_int8_rounds_to_the_nearest_step_of_its_row():
    w = torch.randn(64, 96, generator=torch.Generator().manual_seed(0), dtype=torch.float64).float()
    w[3] = 0.0  # an all-zero row: scale 1, zeros
    q, scale = quantize_weight(w, SCHEMES["int8"], torch.float32)
    assert q.dtype == torch.int8 and scale.shape == (64,) and scale.dtype == torch.float32
    assert int(q.abs().max()) == 127 and bool((q[3] == 0).all()) and float(scale[3]) == 1.0
    assert bool((q.abs().amax(1)[torch.arange(64) != 3] == 127).all())  # each row's largest weight maps to 127
    error = (q.double() * scale.double()[:, None] - w.double()).abs()
    slack = 127 * torch.finfo(torch.float32).eps  # w / s is formed in float32: its rounding, in steps
    assert bool((error <= scale.double()[:, None] * (0.5 + slack)).all())  # round to nearest: half a step


def test_fp8_keeps_three_mantissa_bits_of_each_weight():
    w = torch.randn(64, 96, generator=torch.Generator().manual_seed(1), dtype=torch.float64).float()
    q, scale = quantize_weight(w, SCHEMES["fp8"], torch.float32)
    assert q.dtype == torch.float8_e4m3fn and float(q.float().abs().max()) == 448.0
    back = q.double() * scale.double()[:, None]
    normal = (w.double().abs() / scale.double()[:, None]) >= 2.0 ** -6  # e4m3's smallest normal
    relative = ((back - w.double()).abs() / w.double().abs())[normal]
    # half a unit in the last of 3 mantissa bits, plus float32's rounding of w / s on the way
    assert float(relative.max()) <= 2.0 ** -4 + 2 * torch.finfo(torch.float32).eps


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_quantized_model_computes_its_dequantized_weights_exactly(fmt):
    """float32 logits of the quantized model against its own float64 twin (same int8/fp8 weights, scales in
    float64): within the float32 tolerance of the model, not the quantization error."""
    model = quantize_blocks(random_gpt(TINY_GQA), scheme_named(fmt))
    assert weights_scheme(model) == fmt
    labels, tokens = torch.tensor([1, 4]), torch.randint(0, 48, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        actual = model.training_logits(labels, tokens)
        reference = float64_copy(model).training_logits(labels, tokens)
    assert_close_to_reference(actual, reference, model_tolerance(torch.float32, TINY_GQA))
    plain = random_gpt(TINY_GQA)
    with torch.no_grad():
        assert not torch.allclose(plain.training_logits(labels, tokens), actual, atol=1e-4)  # it did quantize


def test_dtype_moves_keep_the_stored_weights_and_follow_the_scales():
    model = quantize_blocks(random_gpt(TINY_C2I), scheme_named("fp8"))
    linear = model.layers[0].attention.wqkv
    before = linear.weight.clone()
    model = model.to(torch.bfloat16)
    assert linear.weight.dtype == torch.float8_e4m3fn and torch.equal(linear.weight.view(torch.uint8),
                                                                     before.view(torch.uint8))
    assert linear.scale.dtype == torch.bfloat16 and model.tok_embeddings.weight.dtype == torch.bfloat16
    model.half().float()
    assert linear.weight.dtype == torch.float8_e4m3fn and linear.scale.dtype == torch.float32


def test_resident_bytes_count_one_byte_per_quantized_weight():
    model = random_gpt(TINY_C2I)
    full = resident_bytes(model)
    weights = [getattr(getattr(block, part), name).weight for block in model.layers
               for part, name in (("attention", "wqkv"), ("attention", "wo"), ("feed_forward", "w13"),
                                  ("feed_forward", "w2"))]
    linears, rows = sum(w.numel() for w in weights), sum(w.shape[0] for w in weights)
    assert resident_bytes(quantize_blocks(model, scheme_named("int8"))) == full - 3 * linears + 4 * rows


def same_state(a: nn.Module, b: nn.Module) -> bool:
    """Same keys, dtypes and bits (float8 compared through its bytes: torch.equal has no float8 kernel)."""
    sa, sb = a.state_dict(), b.state_dict()
    bits = lambda t: t.view(torch.uint8) if t.element_size() == 1 else t  # noqa: E731
    return sa.keys() == sb.keys() and all(sa[k].dtype == sb[k].dtype and torch.equal(bits(sa[k]), bits(sb[k]))
                                          for k in sa)


def write_quantized(path, model, fmt: str, spelling: str = "scale") -> dict:
    """A quantized LlamaGen-named file as gpt-fast or this pack writes it (w1 / w3 apart, scales per row)."""
    state = quantize_blocks(model, scheme_named(fmt)).state_dict()
    if spelling != "scale":
        state = {k[:-len("scale")] + spelling if k.endswith(".scale") else k: v for k, v in state.items()}
    write_safetensors(path, state, {"kind": "gpt", "config": model.config.to_dict()})
    return state


@pytest.mark.parametrize("fmt,spelling", [("int8", "scale"), ("fp8", "scale"), ("int8", "scales")])
def test_an_already_quantized_file_loads_strictly_as_it_is(tmp_path, fmt, spelling):
    model = random_gpt(TINY_C2I)
    write_quantized(tmp_path / "q.safetensors", model, fmt, spelling)
    loaded = load_gpt(tmp_path / "q.safetensors", weights="none")
    assert loaded.source_format == f"safetensors[{fmt}]" and weights_scheme(loaded.model) == fmt
    assert any("loaded as they are" in note for note in loaded.notes)
    assert same_state(model, loaded.model)


def damaged(tmp_path, change) -> str:
    state = write_quantized(tmp_path / "good.safetensors", random_gpt(TINY_C2I), "int8")
    state = dict(state)
    change(state)
    write_safetensors(tmp_path / "bad.safetensors", state, {"kind": "gpt", "config": TINY_C2I.to_dict()})
    with pytest.raises(CheckpointError) as info:
        load_gpt(tmp_path / "bad.safetensors")
    return str(info.value)


def test_a_scale_of_the_wrong_shape_or_dtype_is_named(tmp_path):
    key = "layers.1.attention.wo.scale"
    message = damaged(tmp_path, lambda s: s.update({key: s[key][:-1]}))
    assert key in message and "wrong shapes" in message
    message = damaged(tmp_path, lambda s: s.update({key: s[key].to(torch.int32)}))
    assert key in message and "floating point" in message
    message = damaged(tmp_path, lambda s: s.update({key: torch.full_like(s[key], float("nan"))}))
    assert key in message and "NaN" in message


def test_quantized_tensors_without_their_partner_or_outside_the_blocks_are_named(tmp_path):
    message = damaged(tmp_path, lambda s: s.pop("layers.0.feed_forward.w2.scale"))
    assert "layers.0.feed_forward.w2.scale" in message and "layers.0.feed_forward.w2.weight" in message
    message = damaged(tmp_path, lambda s: s.update({"layers.0.attention.wqkv.weight": torch.ones(
        s["layers.0.attention.wqkv.weight"].shape)}))
    assert "layers.0.attention.wqkv.weight" in message and "torch.float32 weight" in message
    message = damaged(tmp_path, lambda s: s.update({"tok_embeddings.weight": s["tok_embeddings.weight"].to(torch.int8),
                                                    "tok_embeddings.scale": torch.ones(48)}))
    assert "tok_embeddings.weight" in message and "blocks' linear layers" in message
    message = damaged(tmp_path, lambda s: s.update({"layers.1.feed_forward.w3.weight": s[
        "layers.1.feed_forward.w3.weight"].float().to(torch.float8_e4m3fn)}))
    assert "layers.1.feed_forward.w1.weight and w3.weight in one format" in message


def test_an_unknown_weights_choice_is_a_config_error(tmp_path):
    write_safetensors(tmp_path / "m.safetensors", random_gpt(TINY_C2I).state_dict(),
                      {"kind": "gpt", "config": TINY_C2I.to_dict()})
    with pytest.raises(ConfigError, match="weights"):
        load_gpt(tmp_path / "m.safetensors", weights="int4")


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_at_load_matches_quantizing_the_loaded_model(tmp_path, fmt):
    model = random_gpt(TINY_GQA)
    write_safetensors(tmp_path / "m.safetensors", model.state_dict(), {"kind": "gpt", "config": TINY_GQA.to_dict()})
    loaded = load_gpt(tmp_path / "m.safetensors", weights=fmt, dtype=torch.bfloat16)
    assert weights_scheme(loaded.model) == fmt and any(f"quantized to {fmt}" in n for n in loaded.notes)
    expected = quantize_blocks(model.to(torch.bfloat16), scheme_named(fmt))
    assert same_state(expected, loaded.model)
    assert loaded.model.layers[0].attention.wqkv.scale.dtype == torch.bfloat16
    assert isinstance(loaded.model.output, nn.Linear) and loaded.model.output.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_decoding_mode_runs_on_a_quantized_target_and_greedy_equals_its_ar(fmt):
    """The acceptance rules only read the target's laws: on a quantized target every exact mode (and the
    relaxed ones at delta 0 / lambda 1) reproduces that target's greedy AR image; the 2-D Jacobi mode (lossy
    by design) runs."""
    model = quantize_blocks(random_gpt(TINY_C2I, seed=3), scheme_named(fmt))
    drafter = random_drafter(random_gpt(TINY_C2I, seed=3), std=0.3)  # from the unquantized target
    condition = Condition.classes([0, 3])
    neighbors = build_neighbors(torch.randn(48, 4, generator=torch.Generator().manual_seed(4)), 3)
    runs = {
        "sjd": lambda s, g: jacobi_generate(model, condition, s, JacobiConfig(window=4), g),
        "sjd_coupled": lambda s, g: jacobi_generate(model, condition, s, JacobiConfig(window=4, coupled=True), g),
        "static_tree": lambda s, g: speculative_generate(
            model, drafter, condition, s, SpeculativeConfig(tree="static", static_tree=NAIVE_EXTEND_57), g),
        "eagle2": lambda s, g: speculative_generate(model, drafter, condition, s, SpeculativeConfig(tree="dynamic"), g),
        "lantern": lambda s, g: speculative_generate(model, drafter, condition, s, SpeculativeConfig(
            tree="dynamic", relaxation=Relaxation(k=3, delta=0.0)), g, neighbors),
        "lantern_pp": lambda s, g: speculative_generate(model, drafter, condition, s, SpeculativeConfig(
            tree="static", static_tree=NAIVE_EXTEND_57, relaxation=Relaxation(k=3, lam=1.0)), g, neighbors),
    }
    greedy = SamplingConfig(cfg_scale=2.0, temperature=0.0)
    with torch.no_grad():
        base = generate(model, condition, greedy, make_generators(0, 2)).tokens
        for name, run in runs.items():
            assert torch.equal(run(greedy, make_generators(0, 2)).tokens, base), name
            sampled = run(SamplingConfig(cfg_scale=2.0, temperature=1.0), make_generators(7, 2)).tokens
            assert sampled.shape == base.shape and int(sampled.max()) < 48, name
        rows = JacobiConfig(window=4, coupled=True, rows=2, row_window=2, row_commit=True, row_lead=0)
        tokens = jacobi_generate(model, condition, greedy, rows, make_generators(0, 2)).tokens  # 2-D: lossy
        assert tokens.shape == base.shape and torch.equal(tokens[:, :4], base[:, :4])  # the first row is AR's
