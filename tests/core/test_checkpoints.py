"""Strict loading of every supported layout, official key names and shapes, and bad-file errors."""
import argparse
import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tiny_models import TINY_T2I, TINY_VQ, random_gpt, random_vq
from tolerances import assert_close_to_reference, float64_copy, model_tolerance
from lantern_core.loading.checkpoints import load_gpt, load_vq
from lantern_core.config import GPTConfig, VQ_PRESETS, gpt_preset
from lantern_core.errors import CheckpointError
from lantern_core.models.gpt import LlamaGenGPT
from lantern_core.models.vq import VQModel

# A preset width (GPT-B, 768) so heads are inferred as for official files; one layer keeps it small.
B_LIKE_C2I = GPTConfig(dim=768, n_layer=1, n_head=12, vocab_size=64, model_type="c2i", num_classes=10, grid_size=4)


def logits_of(model: LlamaGenGPT, config: GPTConfig) -> torch.Tensor:
    if config.model_type == "c2i":
        cond = torch.tensor([1, config.num_classes])
    else:
        cond = torch.randn(2, config.cls_token_num, config.caption_dim, generator=torch.Generator().manual_seed(0))
        cond = cond.to(model.output.weight.dtype)
    tokens = torch.arange(8).reshape(2, 4) % config.vocab_size
    with torch.no_grad():
        return model.training_logits(cond, tokens)


def save_llamagen_pt(path: Path, sd: dict, wrapper: str | None, args: dict | None = None) -> Path:
    if wrapper is None:
        obj = dict(sd)
    else:
        obj = {wrapper: sd, "optimizer": {"state": {}, "param_groups": []}, "steps": 1000}
        if args is not None:
            obj["args"] = argparse.Namespace(**args)
    torch.save(obj, path)
    return path


# ------------------------------------------------------------------------------ official names/shapes

def test_gpt_xl_key_names_and_shapes_match_the_official_layout():
    with torch.device("meta"):
        c2i = LlamaGenGPT(gpt_preset("GPT-XL", "c2i", 384)).state_dict()
        t2i = LlamaGenGPT(gpt_preset("GPT-XL", "t2i", 256)).state_dict()
    expected = {
        "cls_embedding.embedding_table.weight": (1001, 1280), "tok_embeddings.weight": (16384, 1280),
        "layers.35.attention.wqkv.weight": (3840, 1280), "layers.0.attention.wo.weight": (1280, 1280),
        "layers.0.feed_forward.w1.weight": (3584, 1280), "layers.0.feed_forward.w3.weight": (3584, 1280),
        "layers.0.feed_forward.w2.weight": (1280, 3584), "layers.0.attention_norm.weight": (1280,),
        "layers.0.ffn_norm.weight": (1280,), "norm.weight": (1280,), "output.weight": (16384, 1280),
    }
    for key, shape in expected.items():
        assert tuple(c2i[key].shape) == shape, key
    assert len(c2i) == 36 * 7 + 4  # 7 tensors a layer + cls, tok, norm, output
    assert "layers.36.attention.wqkv.weight" not in c2i
    assert tuple(t2i["cls_embedding.cap_proj.fc1.weight"].shape) == (1280, 2048)
    assert tuple(t2i["cls_embedding.cap_proj.fc2.weight"].shape) == (1280, 1280)
    assert tuple(t2i["cls_embedding.uncond_embedding"].shape) == (120, 2048)
    assert "rope_table" not in c2i  # like upstream's freqs_cis, never saved


@pytest.mark.parametrize("name,millions", [("GPT-B", 111), ("GPT-L", 343), ("GPT-XL", 775), ("GPT-XXL", 1400),
                                           ("GPT-3B", 3100)])
def test_published_sizes_have_the_published_parameter_counts(name, millions):
    with torch.device("meta"):
        model = LlamaGenGPT(gpt_preset(name, "c2i"))
    count = sum(p.numel() for p in model.parameters()) / 1e6
    assert abs(count - millions) / millions < 0.03, count


def test_t2i_1b_and_7b_and_3b_configs():
    assert gpt_preset("GPT-1B", "t2i").ffn_dim == 5632
    assert gpt_preset("GPT-7B", "t2i").ffn_dim == 11008 and gpt_preset("GPT-7B", "t2i").head_dim == 128
    assert gpt_preset("GPT-3B").head_dim == 100 and gpt_preset("GPT-3B").ffn_dim == 8704
    with torch.device("meta"):
        m = LlamaGenGPT(gpt_preset("GPT-7B", "t2i", 512))
    assert m.config.cls_token_num == 120 and m.config.grid_size == 32


def test_vq16_key_names_and_shapes_match_vq_ds16():
    with torch.device("meta"):
        sd = VQModel(VQ_PRESETS["VQ-16"]).state_dict()
    expected = {
        "quantize.embedding.weight": (16384, 8), "quantize.codebook_used": (65536,),
        "encoder.conv_in.weight": (128, 3, 3, 3), "encoder.conv_blocks.4.attn.1.q.weight": (512, 512, 1, 1),
        "encoder.conv_blocks.3.downsample.conv.weight": (256, 256, 3, 3),
        "encoder.conv_blocks.2.res.0.nin_shortcut.weight": (256, 128, 1, 1),
        "encoder.mid.1.proj_out.weight": (512, 512, 1, 1), "encoder.conv_out.weight": (256, 512, 3, 3),
        "quant_conv.weight": (8, 256, 1, 1), "post_quant_conv.weight": (256, 8, 1, 1),
        "decoder.conv_in.weight": (512, 256, 3, 3), "decoder.conv_blocks.0.attn.2.k.weight": (512, 512, 1, 1),
        "decoder.conv_blocks.0.res.2.conv2.weight": (512, 512, 3, 3),
        "decoder.conv_blocks.1.res.0.nin_shortcut.weight": (256, 512, 1, 1),
        "decoder.conv_blocks.3.upsample.conv.weight": (128, 128, 3, 3),
        "decoder.norm_out.weight": (128,), "decoder.conv_out.weight": (3, 128, 3, 3),
    }
    for key, shape in expected.items():
        assert tuple(sd[key].shape) == shape, key
    for absent in ("encoder.conv_blocks.4.downsample.conv.weight", "decoder.conv_blocks.4.upsample.conv.weight",
                   "decoder.conv_blocks.1.attn.0.q.weight", "encoder.conv_blocks.3.attn.0.q.weight"):
        assert absent not in sd
    params = sum(v.numel() for k, v in sd.items() if k != "quantize.codebook_used") / 1e6
    assert 69 < params < 74  # LlamaGen's README: 72M


# ------------------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("wrapper", ["model", "ema", "module", "state_dict", None])
def test_llamagen_pt_round_trip_every_wrapper(tmp_path, wrapper):
    src = random_gpt(B_LIKE_C2I)
    args = {"image_size": 64, "downsample_size": 16, "gpt_model": "GPT-B"} if wrapper == "model" else None
    path = save_llamagen_pt(tmp_path / "c2i_B_64.pt", src.state_dict(), wrapper, args)
    loaded = load_gpt(path)
    assert loaded.config == B_LIKE_C2I
    assert loaded.source_format == f"llamagen-pt[{wrapper or 'bare'}]"
    assert torch.equal(logits_of(loaded.model, loaded.config), logits_of(src, B_LIKE_C2I))


def test_grid_comes_from_args_then_file_name(tmp_path):
    sd = random_gpt(B_LIKE_C2I).state_dict()
    with_args = save_llamagen_pt(tmp_path / "weights.pt", sd, "model", {"image_size": 384, "downsample_size": 16})
    assert load_gpt(with_args).config.grid_size == 24
    named = save_llamagen_pt(tmp_path / "c2i_B_512.pt", sd, None)
    loaded = load_gpt(named)
    assert loaded.config.grid_size == 32 and any("file name" in n for n in loaded.notes)
    assert load_gpt(named, grid_size=8).config.grid_size == 8


def test_fsdp_bare_state_dict_with_compile_prefix(tmp_path):
    src = random_gpt(B_LIKE_C2I)
    path = save_llamagen_pt(tmp_path / "c2i_XXL_64.pt", {f"_orig_mod.{k}": v for k, v in src.state_dict().items()}, None)
    loaded = load_gpt(path)
    assert torch.equal(logits_of(loaded.model, loaded.config), logits_of(src, B_LIKE_C2I))


def test_official_keys_in_safetensors_without_metadata(tmp_path):
    src = random_gpt(B_LIKE_C2I)
    path = tmp_path / "c2i_B_64.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    loaded = load_gpt(path)
    assert loaded.config == B_LIKE_C2I
    assert torch.equal(logits_of(loaded.model, loaded.config), logits_of(src, B_LIKE_C2I))


def test_our_safetensors_carry_config_and_class_names(tmp_path):
    from lantern_core.loading.checkpoint_io import write_safetensors

    src = random_gpt(TINY_T2I)
    path = tmp_path / "tiny.safetensors"
    write_safetensors(path, src.state_dict(), {"kind": "gpt", "config": TINY_T2I.to_dict(), "class_names": None})
    loaded = load_gpt(path, dtype=torch.float64)
    assert loaded.config == TINY_T2I and loaded.model.output.weight.dtype == torch.float64
    exact = logits_of(float64_copy(loaded.model), TINY_T2I)  # the same weights' logits, not rounded to float32
    assert exact.dtype == torch.float64  # the float32 source within float32's rounding of it; outside the layers:
    assert_close_to_reference(logits_of(src, TINY_T2I), exact,  # the caption MLP's 2 linears and the head
                              model_tolerance(torch.float32, TINY_T2I, extra=3))


def hf_state_dict(model: LlamaGenGPT) -> dict:
    c = model.config
    out = {}
    for k, v in model.state_dict().items():
        if k == "tok_embeddings.weight":
            out["model.embed_tokens.weight"] = v
        elif k == "norm.weight":
            out["model.norm.weight"] = v
        elif k == "output.weight":
            out["lm_head.weight"] = v
        elif k.startswith("cls_embedding."):
            out["model." + k] = v
        else:
            i, rest = k.split(".")[1], ".".join(k.split(".")[2:])
            if rest == "attention.wqkv.weight":
                q, kk, vv = v.split([c.dim, c.n_kv_head * c.head_dim, c.n_kv_head * c.head_dim])
                out.update({f"model.layers.{i}.self_attn.q_proj.weight": q,
                            f"model.layers.{i}.self_attn.k_proj.weight": kk,
                            f"model.layers.{i}.self_attn.v_proj.weight": vv})
            else:
                name = {"attention.wo.weight": "self_attn.o_proj.weight", "feed_forward.w1.weight": "mlp.gate_proj.weight",
                        "feed_forward.w3.weight": "mlp.up_proj.weight", "feed_forward.w2.weight": "mlp.down_proj.weight",
                        "attention_norm.weight": "input_layernorm.weight",
                        "ffn_norm.weight": "post_attention_layernorm.weight"}[rest]
                out[f"model.layers.{i}.{name}"] = v
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(c: GPTConfig) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.dim,
            "intermediate_size": c.ffn_dim, "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_head,
            "num_hidden_layers": c.n_layer, "vocab_size": c.vocab_size, "rms_norm_eps": 1e-5,
            "block_size": c.num_image_tokens, "cls_token_num": c.cls_token_num, "input_type": "t2i",
            "caption_dim": c.caption_dim, "rope_base": 10000, "num_classes": 1000, "attention_bias": False,
            "class_dropout_p": 0.1, "token_dropout_p": 0.1, "resid_dropout_p": 0.1, "ffn_dropout_p": 0.1}


@pytest.mark.parametrize("sharded", [False, True])
def test_hf_llama_folder_round_trip(tmp_path, sharded):
    src = random_gpt(TINY_T2I)
    sd = hf_state_dict(src)
    folder = tmp_path / "LlamaGen-T2I"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf_config(TINY_T2I)))
    if sharded:
        keys = sorted(sd)
        halves = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
                  "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
        for name, part in halves.items():
            save_file({k: sd[k] for k in part}, str(folder / name))
        index = {"weight_map": {k: name for name, part in halves.items() for k in part}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        save_file(sd, str(folder / "model.safetensors"))
    loaded = load_gpt(folder)
    assert loaded.source_format == "hf-llama"
    assert loaded.config == TINY_T2I
    assert torch.equal(logits_of(loaded.model, TINY_T2I), logits_of(src, TINY_T2I))


@pytest.mark.parametrize("layout", ["pt-model", "pt-ema", "safetensors-bare", "safetensors-ours"])
def test_vq_round_trip(tmp_path, layout):
    from lantern_core.loading.checkpoint_io import write_safetensors

    src = random_vq()
    sd = src.state_dict()
    if layout.startswith("pt"):
        wrapper = layout.split("-")[1]
        path = tmp_path / "vq_ds16_c2i.pt"
        torch.save({wrapper: sd, "optimizer": {}, "discriminator": {"w": torch.zeros(1)}, "optimizer_disc": {},
                    "steps": 5, "args": argparse.Namespace(codebook_size=32)}, path)
    elif layout == "safetensors-bare":
        path = tmp_path / "vq.safetensors"
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    else:
        path = tmp_path / "vq.safetensors"
        write_safetensors(path, sd, {"kind": "vq", "config": TINY_VQ.to_dict()})
    loaded = load_vq(path)
    assert loaded.config == TINY_VQ
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        idx = loaded.model.encode(images)
        assert torch.equal(idx, src.encode(images))
        assert torch.equal(loaded.model.decode(idx), src.decode(idx))


def test_vq8_layout_is_inferred(tmp_path):
    config = VQ_PRESETS["VQ-8"]
    small = type(config)(**{**config.to_dict(), "ch": 32, "z_channels": 32, "codebook_size": 64})
    path = tmp_path / "vq_ds8_c2i.safetensors"
    save_file({k: v.contiguous() for k, v in VQModel(small).state_dict().items()}, str(path))
    loaded = load_vq(path)
    assert loaded.config.encoder_ch_mult == (1, 2, 2, 4) and loaded.config.downsample == 8


def test_vq_indices_image_round_trip_on_codebook_latents(tiny_vq):
    """Decoding then re-quantising the latents of given indices returns the same indices."""
    idx = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(0))
    z = tiny_vq.quantize.lookup(idx, (4, 4))
    assert torch.equal(tiny_vq.quantize.nearest(z), idx)
    with torch.no_grad():
        assert tiny_vq.decode(idx).shape == (2, 3, 16, 16)


# --------------------------------------------------------------------------------------- bad files

def assert_clear(err: CheckpointError, path: Path, *fragments: str):
    text = str(err)
    assert path.name in text and "expected" in text and "found" in text and "Fix:" in text, text
    for fragment in fragments:
        assert fragment in text, (fragment, text)


def test_missing_key(tmp_path):
    sd = random_gpt(B_LIKE_C2I).state_dict()
    del sd["layers.0.ffn_norm.weight"]
    path = save_llamagen_pt(tmp_path / "c2i_B_64.pt", sd, "model")
    with pytest.raises(CheckpointError) as err:
        load_gpt(path)
    assert_clear(err.value, path, "1 missing keys", "layers.0.ffn_norm.weight")


def test_unexpected_key(tmp_path):
    sd = random_gpt(B_LIKE_C2I).state_dict()
    sd["layers.0.attention.q_norm.weight"] = torch.ones(64)
    path = save_llamagen_pt(tmp_path / "c2i_B_64.pt", sd, "model")
    with pytest.raises(CheckpointError) as err:
        load_gpt(path)
    assert_clear(err.value, path, "1 unexpected keys", "q_norm")


def test_wrong_shape(tmp_path):
    sd = random_gpt(B_LIKE_C2I).state_dict()
    sd["layers.0.feed_forward.w2.weight"] = torch.zeros(768, 100)
    path = save_llamagen_pt(tmp_path / "c2i_B_64.pt", sd, "model")
    with pytest.raises(CheckpointError) as err:
        load_gpt(path)
    assert_clear(err.value, path, "wrong shapes", "feed_forward.w2.weight")


def test_vq_file_given_as_gpt_and_gpt_given_as_vq(tmp_path):
    vq_path = tmp_path / "vq_ds16_c2i.pt"
    torch.save({"model": random_vq().state_dict()}, vq_path)
    with pytest.raises(CheckpointError) as err:
        load_gpt(vq_path)
    assert_clear(err.value, vq_path, "VQ tokenizer", "LlamaGen GPT checkpoint")
    gpt_path = save_llamagen_pt(tmp_path / "c2i_B_64.pt", random_gpt(B_LIKE_C2I).state_dict(), "model")
    with pytest.raises(CheckpointError) as err:
        load_vq(gpt_path)
    assert_clear(err.value, gpt_path, "a LlamaGen GPT", "VQ tokenizer (vq_ds16_c2i.pt")


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_truncated_file(tmp_path, suffix):
    sd = random_gpt(B_LIKE_C2I).state_dict()
    path = tmp_path / f"c2i_B_64{suffix}"
    if suffix == ".pt":
        save_llamagen_pt(path, sd, "model")
    else:
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as err:
        load_gpt(path)
    assert_clear(err.value, path, "truncated or corrupt")


def test_zero_byte_missing_and_unknown_format(tmp_path):
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError) as err:
        load_gpt(empty)
    assert_clear(err.value, empty, "0-byte")
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(CheckpointError) as err:
        load_gpt(missing)
    assert_clear(err.value, missing, "nothing at that path")
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"\x08\x01")
    with pytest.raises(CheckpointError) as err:
        load_gpt(onnx)
    assert_clear(err.value, onnx, "unknown extension '.onnx'")


def test_unrecognised_state_dict(tmp_path):
    path = tmp_path / "other.safetensors"
    save_file({"conv.weight": torch.zeros(2, 2)}, str(path))
    with pytest.raises(CheckpointError) as err:
        load_gpt(path)
    assert_clear(err.value, path, "unrecognised state dict", "conv.weight")


class _Payload:
    def __reduce__(self):
        return (Path.touch, (Path(_Payload.target),))


@pytest.mark.parametrize("suffix", [".pt", ".bin", ".ckpt"])
def test_code_executing_pickle_is_refused_and_never_runs(tmp_path, suffix):
    marker = tmp_path / "pwned"
    _Payload.target = str(marker)
    path = tmp_path / f"evil{suffix}"
    torch.save({"model": {"tok_embeddings.weight": torch.zeros(2, 2)}, "extra": _Payload()}, path)
    assert not marker.exists()
    with pytest.raises(CheckpointError) as err:
        load_gpt(path)
    assert_clear(err.value, path, "arbitrary code", "never executes pickled code")
    assert not marker.exists()
    with open(path, "rb"):  # sanity: an unrestricted load *would* run it (proves the test can fail)
        pass
    raw = pickle.dumps(_Payload())
    pickle.loads(raw)
    assert marker.exists()


def test_hf_folder_without_weights(tmp_path):
    folder = tmp_path / "LlamaGen-T2I"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf_config(TINY_T2I)))
    with pytest.raises(CheckpointError) as err:
        load_gpt(folder)
    assert_clear(err.value, folder, "model.safetensors")


# ------------------------------------------------------------------------------ head count of custom .pt

CUSTOM_HEADS = GPTConfig(dim=128, n_layer=1, n_head=8, vocab_size=64, model_type="c2i", num_classes=10, grid_size=4)


def test_a_custom_head_count_comes_from_saved_args_an_argument_or_a_sidecar(tmp_path):
    """dim 128 is no published width, so the weights alone suggest head_dim 64 (2 heads): wrong for a model
    trained with 8. The saved args, an explicit n_head and a sidecar JSON each give 8, and the load notes say
    which rule was used."""
    source = random_gpt(CUSTOM_HEADS, seed=3)
    expected = logits_of(source, CUSTOM_HEADS)
    sd = source.state_dict()
    guessed = load_gpt(save_llamagen_pt(tmp_path / "bare.pt", sd, "model"))
    assert guessed.config.n_head == 2 and any("head_dim 64" in n and "n_head" in n for n in guessed.notes)
    assert not torch.allclose(logits_of(guessed.model, guessed.config), expected, atol=1e-3)  # the rule matters

    saved = load_gpt(save_llamagen_pt(tmp_path / "args.pt", sd, "model", args={"n_head": 8, "gpt_model": "custom"}))
    assert saved.config.n_head == 8 and any("saved args (n_head)" in n for n in saved.notes)
    given = load_gpt(tmp_path / "bare.pt", n_head=8)
    assert given.config.n_head == 8 and any("as given (n_head)" in n for n in given.notes)
    (tmp_path / "bare.pt.json").write_text(json.dumps({"n_head": 8}))
    sidecar = load_gpt(tmp_path / "bare.pt")
    assert sidecar.config.n_head == 8 and any("bare.pt.json" in n for n in sidecar.notes)
    for loaded in (saved, given, sidecar):
        assert torch.allclose(logits_of(loaded.model, loaded.config), expected, atol=1e-5)


@pytest.mark.parametrize("bad", [3, 0, "8", 128])
def test_an_impossible_head_count_is_refused_with_the_fix(tmp_path, bad):
    path = save_llamagen_pt(tmp_path / "bare.pt", random_gpt(CUSTOM_HEADS, seed=3).state_dict(), "model")
    with pytest.raises(CheckpointError, match="n_head") as info:
        load_gpt(path, n_head=bad)
    assert "--n-head" in str(info.value)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        load_gpt(path)


def test_the_command_line_takes_n_head():
    from lantern_core.cli import build_parser

    assert build_parser().parse_args(["generate", "--n-head", "8"]).n_head == 8
