"""Loading LlamaGen GPTs and VQ tokenizers strictly, from every published layout.

Supported: LlamaGen `.pt` training checkpoints ("model" / "ema" / "module" / "state_dict" wrappers,
with or without `args`), bare (FSDP-consolidated) state dicts, `.safetensors` (ours carry their
config in metadata), and the HF-converted LlamaForCausalLM folders of LANTERN's LlamaGen-T2I
(config.json + model.safetensors, optionally sharded). Shapes, size, type and grid are inferred from
the weights and whatever config travels with them. Any missing, unexpected or mis-shaped key is a
`CheckpointError`; nothing is loaded leniently.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .checkpoint_io import RawCheckpoint, read_checkpoint, read_json_object
from .quantized_io import cast_for_load, finite, quantized_layers, rename_scales
from ..config import GPT_PRESETS, HEADS_BY_DIM, GPTConfig, VQConfig
from ..errors import CheckpointError, ConfigError
from ..models.gpt import LlamaGenGPT
from ..models.quantized import prepare_quantized, quantize_at_load, scheme_named, weights_scheme
from ..models.vq import VQModel

log = logging.getLogger(__name__)

GPT_FIX = ("choose a LlamaGen GPT checkpoint (e.g. c2i_B_256.pt, t2i_XL_stage1_256.pt, or a LlamaGen-T2I "
           "folder with config.json + model.safetensors)")
VQ_FIX = "choose a LlamaGen VQ tokenizer (vq_ds16_c2i.pt, vq_ds16_t2i.pt or vq_ds8_c2i.pt)"


@dataclass
class LoadedGPT:
    model: LlamaGenGPT
    config: GPTConfig
    source_format: str  # e.g. "llamagen-pt[model]", "safetensors", "hf-llama"
    class_names: list[str] | None = None
    notes: list[str] = field(default_factory=list)  # inferences the user may want to know about


@dataclass
class LoadedVQ:
    model: VQModel
    config: VQConfig
    source_format: str


def config_from_metadata(cls: type, path: Path, meta: dict, fix: str):
    """Our files' stored config (`meta["config"]`) as `cls`; a damaged or foreign entry is a CheckpointError."""
    try:
        return cls(**meta["config"])
    except (TypeError, ValueError) as exc:  # unknown / missing fields, or a value its __post_init__ refuses
        raise CheckpointError(path, f"a valid {cls.__name__} in the file's metadata", f"{exc}", fix) from exc


def detect_kind(tensors: dict[str, torch.Tensor]) -> str:
    """'gpt', 'hf-llama', 'vq', 'drafter' or 'unknown', from characteristic key names."""
    keys = tensors.keys()
    if "tok_embeddings.weight" in keys and any(k.endswith("attention.wqkv.weight") for k in keys):
        return "gpt"
    if "model.embed_tokens.weight" in keys and any(k.endswith("self_attn.q_proj.weight") for k in keys):
        return "hf-llama"
    if "quantize.embedding.weight" in keys and "encoder.conv_in.weight" in keys:
        return "vq"
    if "fc.weight" in keys and any(k.startswith("layers.0.self_attn.") for k in keys):
        return "drafter"
    return "unknown"


KIND_DESCRIPTIONS = {
    "gpt": "a LlamaGen GPT (tok_embeddings, layers.N.attention.wqkv)",
    "hf-llama": "an HF LlamaForCausalLM port of LlamaGen (model.embed_tokens, self_attn.q_proj)",
    "vq": "a VQ tokenizer (encoder, quantize.embedding)",
    "drafter": "a speculative-decoding drafter (fc, layers.0.self_attn)",
}


def _describe(kind: str, tensors: dict[str, torch.Tensor]) -> str:
    if kind in KIND_DESCRIPTIONS:
        return KIND_DESCRIPTIONS[kind]
    return f"an unrecognised state dict (first keys: {sorted(tensors)[:5]})"


def strip_prefixes(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Remove a wrapper prefix shared by every key (`module.` from DDP, `_orig_mod.` from torch.compile)."""
    for prefix in ("module.", "_orig_mod."):
        if tensors and all(k.startswith(prefix) for k in tensors):
            tensors = {k[len(prefix):]: v for k, v in tensors.items()}
    return tensors


# ----------------------------------------------------------------------------------------- HF layout

HF_LAYER_MAP = {
    "self_attn.o_proj.weight": "attention.wo.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
    "input_layernorm.weight": "attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def hf_to_llamagen(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map LANTERN's HF LlamaForCausalLM keys onto LlamaGen names; q/k/v are fused into wqkv [q; k; v]."""
    out: dict[str, torch.Tensor] = {}
    qkv: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", key)
        if m:
            layer, rest = int(m.group(1)), m.group(2)
            part = re.fullmatch(r"self_attn\.([qkv])_proj\.weight", rest)
            if part:
                qkv.setdefault(layer, {})[part.group(1)] = value
            elif rest in HF_LAYER_MAP:
                out[f"layers.{layer}.{HF_LAYER_MAP[rest]}"] = value
            else:
                out[key] = value  # reported as unexpected by the strict check
        elif key == "model.embed_tokens.weight":
            out["tok_embeddings.weight"] = value
        elif key == "model.norm.weight":
            out["norm.weight"] = value
        elif key == "lm_head.weight":
            out["output.weight"] = value
        elif key.startswith("model.cls_embedding."):
            out[key[len("model."):]] = value
        else:
            out[key] = value
    for layer, parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            raise CheckpointError(path, f"q_proj, k_proj and v_proj in layer {layer}",
                                  f"only {sorted(parts)}", "the checkpoint is incomplete: download it again")
        out[f"layers.{layer}.attention.wqkv.weight"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out


def read_hf_folder(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """config.json + model.safetensors (or a sharded index) from an HF-style folder."""
    config = read_json_object(folder / "config.json", "re-download config.json for this model")
    index = next((folder / n for n in ("model.safetensors.index.json", "pytorch_model.bin.index.json")
                  if (folder / n).is_file()), None)
    if index is not None:
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError, AttributeError) as exc:
            raise CheckpointError(index, "a shard index with a weight_map", f"an unreadable file ({exc})",
                                  "re-download the index file") from exc
        files = [folder / s for s in shards]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise CheckpointError(folder, f"every shard named in {index.name}", f"{len(absent)} missing "
                                  f"(e.g. {absent[:3]})", "download the missing shards into this folder")
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif (folder / "pytorch_model.bin").is_file():
        files = [folder / "pytorch_model.bin"]
    else:
        raise CheckpointError(folder, "model.safetensors (or a sharded index, or pytorch_model.bin) beside config.json",
                              f"only {sorted(p.name for p in folder.iterdir())[:10]}",
                              "download the weights file into this folder")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(read_checkpoint(f).tensors)
    return tensors, config


# ------------------------------------------------------------------------------------ GPT inference

SIZE_IN_NAME = re.compile(r"(?:^|[_\-.])(\d{2,4})(?:[_\-.]|$)")  # c2i_L_384, t2i_XL_stage2_512


def _infer_grid(path: Path, raw_meta: dict, args: dict, hf_config: dict, notes: list[str]) -> int:
    if "grid_size" in raw_meta.get("config", {}):
        return int(raw_meta["config"]["grid_size"])
    if hf_config.get("block_size"):
        side = int(round(hf_config["block_size"] ** 0.5))
        if side * side == hf_config["block_size"]:
            return side
    if args.get("image_size"):
        return int(args["image_size"]) // int(args.get("downsample_size", 16))
    sizes = [int(s) for s in SIZE_IN_NAME.findall(path.stem) if int(s) % 16 == 0 and 64 <= int(s) <= 2048]
    if sizes:
        grid = sizes[-1] // 16
        notes.append(f"image size {sizes[-1]} px ({grid}x{grid} tokens) read from the file name")
        return grid
    notes.append("no image size in the file: assuming 256 px (16x16 tokens); pass grid_size to override")
    return 16


HEADS_FIX = ("give the head count: n_head= in load_gpt, --n-head on the command line, or {\"n_head\": N} in a "
             "sidecar JSON next to the file (<file name>.json, or config.json in its folder) for the nodes")


def _infer_heads(dim: int, args: dict, hf_config: dict, notes: list[str], n_head: int | None = None,
                 sidecar: str = "") -> int:
    """The head count, by the first rule that applies (the rule used goes into the load notes): an explicit
    `n_head` (argument or sidecar JSON), the HF config, the checkpoint's saved training args (`n_head`, then
    the `gpt_model` preset), LlamaGen's published width table, else head_dim 64."""
    if n_head is not None:
        notes.append(f"{n_head} attention heads as given ({sidecar or 'n_head'})")
        return n_head
    if hf_config.get("num_attention_heads"):
        return int(hf_config["num_attention_heads"])
    if isinstance(args.get("n_head"), int) and args["n_head"] > 0:
        notes.append(f"{args['n_head']} attention heads from the checkpoint's saved args (n_head)")
        return int(args["n_head"])
    name = args.get("gpt_model")
    if name in GPT_PRESETS:
        notes.append(f"{GPT_PRESETS[name][1]} attention heads from the checkpoint's saved args (gpt_model {name})")
        return GPT_PRESETS[name][1]
    if dim in HEADS_BY_DIM:
        notes.append(f"{HEADS_BY_DIM[dim]} attention heads: dim {dim} is a published LlamaGen width")
        return HEADS_BY_DIM[dim]
    heads = max(1, dim // 64)
    notes.append(f"dim {dim} matches no published size: assuming head_dim 64 ({heads} heads); if it was trained "
                 f"with another head count, {HEADS_FIX}")
    return heads


def read_sidecar(path: Path) -> tuple[dict, str]:
    """Loading hints kept beside a single checkpoint file for the nodes: `<file name>.json` (e.g.
    `my_gpt.pt.json`), else `config.json` in the same folder, if either holds a JSON object with `n_head`.
    Returns (hints, the file they came from) or ({}, "")."""
    for candidate in (path.with_name(path.name + ".json"), path.with_name("config.json")):
        if path.is_dir() or not candidate.is_file():
            continue
        hints = read_json_object(candidate, "write the loading hints as a JSON object, e.g. {\"n_head\": 16}, "
                                            "or delete the file")
        if "n_head" in hints:
            return hints, candidate.name
    return {}, ""


def check_heads(path: Path, n_head, dim: int, qkv_rows: int, where: str) -> None:
    """An explicit head count that the weights can have: a positive integer dividing dim, with whole K/V heads."""
    if isinstance(n_head, bool) or not isinstance(n_head, int) or n_head < 1 or dim % n_head:
        raise CheckpointError(path, f"{where}: a positive integer that divides the width {dim}", repr(n_head), HEADS_FIX)
    head_dim = dim // n_head
    if head_dim % 2:
        raise CheckpointError(path, f"{where}: a head count with an even head size (RoPE rotates pairs)",
                              f"{n_head} (head size {head_dim})", HEADS_FIX)
    if (qkv_rows - dim) % (2 * head_dim) or qkv_rows <= dim:
        raise CheckpointError(path, f"{where}: a head count whose head size ({head_dim}) splits the fused K/V "
                              f"projection ({qkv_rows - dim} rows) into whole heads", repr(n_head), HEADS_FIX)


def infer_gpt_config(path: Path, sd: dict[str, torch.Tensor], raw_meta: dict, args: dict,
                     hf_config: dict, notes: list[str], n_head: int | None = None) -> GPTConfig:
    """Build the GPTConfig implied by LlamaGen-named tensors plus any stored config. `n_head` (or a sidecar
    JSON's, see `read_sidecar`) overrides the inferred head count, which the weights' shapes cannot tell."""
    if "config" in raw_meta:  # our own safetensors: the config is authoritative, shapes are checked later
        return config_from_metadata(GPTConfig, path, raw_meta, GPT_FIX)
    vocab, dim = sd["tok_embeddings.weight"].shape
    n_layer = len({int(m.group(1)) for k in sd if (m := re.match(r"layers\.(\d+)\.", k))})
    qkv_rows = sd["layers.0.attention.wqkv.weight"].shape[0]
    where = "n_head"
    if n_head is None:
        hints, where = read_sidecar(path)
        n_head = hints.get("n_head")
        where = f"n_head in {where}" if where else "n_head"
    if n_head is not None:
        check_heads(path, n_head, dim, qkv_rows, where)
    n_head = _infer_heads(dim, args, hf_config, notes, n_head, where)
    head_dim = dim // n_head
    n_kv_head = (qkv_rows - dim) // (2 * head_dim)
    common = dict(dim=dim, n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head, vocab_size=vocab,
                  ffn_dim=sd["layers.0.feed_forward.w1.weight"].shape[0],
                  grid_size=_infer_grid(path, raw_meta, args, hf_config, notes),
                  rope_base=float(hf_config.get("rope_base", args.get("rope_base", 10000.0))),
                  norm_eps=float(hf_config.get("rms_norm_eps", args.get("norm_eps", 1e-5))))
    if "cls_embedding.embedding_table.weight" in sd:
        classes = sd["cls_embedding.embedding_table.weight"].shape[0] - 1
        return GPTConfig(model_type="c2i", num_classes=classes, cls_token_num=1, **common)
    if "cls_embedding.cap_proj.fc1.weight" in sd:
        caption_dim = sd["cls_embedding.cap_proj.fc1.weight"].shape[1]
        cls_tokens = sd["cls_embedding.uncond_embedding"].shape[0] if "cls_embedding.uncond_embedding" in sd \
            else int(hf_config.get("cls_token_num", 120))
        return GPTConfig(model_type="t2i", caption_dim=caption_dim, cls_token_num=cls_tokens, **common)
    raise CheckpointError(path, "a class embedder (cls_embedding.embedding_table) or caption embedder "
                          "(cls_embedding.cap_proj)", "neither", GPT_FIX)


def check_layer_count(path: Path, config: GPTConfig, sd: dict[str, torch.Tensor], fix: str) -> None:
    """The config's layer count matches the weights' `layers.N.*` before a model of that depth is built (a
    damaged config claiming a billion layers is refused here instead of hanging in the constructor)."""
    found = {int(m.group(1)) for k in sd if (m := re.match(r"layers\.(\d+)\.", k))}
    if found != set(range(config.n_layer)):
        raise CheckpointError(path, f"{config.n_layer} transformer layers (layers.0 .. layers.{config.n_layer - 1}), "
                              "as the config says", f"{len(found)} layers in the weights", fix)


def build_on_meta(module_class: type, config, path: Path, fix: str) -> torch.nn.Module:
    """`module_class(config)` on the meta device (no throw-away init of billions of parameters); sizes no
    tensor can have (a damaged config) are a CheckpointError, not torch's overflow error."""
    try:
        with torch.device("meta"):
            return module_class(config)
    except (RuntimeError, ValueError, OverflowError) as exc:
        raise CheckpointError(path, "a config whose sizes a model can be built with",
                              f"{type(exc).__name__}: {str(exc)[:200]}", fix) from exc


def load_state_strict(module: torch.nn.Module, sd: dict[str, torch.Tensor], path: Path, fix: str,
                      assign: bool = False) -> None:
    """load_state_dict(strict=True) with an error that lists missing / unexpected / mis-shaped keys."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    shapes = [f"{k}: expected {tuple(expected[k].shape)}, found {tuple(sd[k].shape)}"
              for k in sorted(set(expected) & set(sd)) if expected[k].shape != sd[k].shape]
    if missing or unexpected or shapes:
        found = []
        if missing:
            found.append(f"{len(missing)} missing keys (e.g. {missing[:3]})")
        if unexpected:
            found.append(f"{len(unexpected)} unexpected keys (e.g. {unexpected[:3]})")
        if shapes:
            found.append(f"{len(shapes)} wrong shapes (e.g. {shapes[:2]})")
        raise CheckpointError(path, f"exactly the {len(expected)} tensors of {type(module).__name__}",
                              "; ".join(found), fix)
    check_values(path, expected, sd)
    module.load_state_dict(sd, strict=True, assign=assign)


def _dtype_kind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "bool"
    if t.is_complex():
        return "complex"
    return "floating point" if t.is_floating_point() else "integer"


def check_values(path: Path, expected: dict[str, torch.Tensor], sd: dict[str, torch.Tensor]) -> None:
    """Every tensor has the kind of dtype its slot holds (floating weights, integer indices) and only
    finite values: a file of the right shapes filled with NaN/Inf or with integer data is refused here,
    not discovered as a black image later."""
    dtypes = [f"{k}: expected {_dtype_kind(expected[k])}, found {sd[k].dtype}" for k in sorted(sd)
              if _dtype_kind(sd[k]) != _dtype_kind(expected[k])]
    if dtypes:
        raise CheckpointError(path, "floating-point weights (and integer index buffers) of the model's dtypes",
                              f"{len(dtypes)} tensors of the wrong dtype (e.g. {dtypes[:2]})",
                              "the file is not a weights file of this model or was converted wrongly: use the "
                              "original checkpoint")
    bad = [k for k in sorted(sd) if sd[k].is_floating_point() and not finite(sd[k])]
    if bad:
        raise CheckpointError(path, "finite weights", f"NaN or Inf values in {len(bad)} tensors (e.g. {bad[:3]})",
                              "the file is corrupt (or was saved from a diverged training run): download it "
                              "again; if it loads in float32 but not float16, choose fp32 or bf16")


def load_gpt(path: str | Path, grid_size: int | None = None, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32, n_head: int | None = None, weights: str = "none") -> LoadedGPT:
    """Load a LlamaGen GPT from a file or an HF folder, inferring its config (`n_head` overrides the inferred
    head count of a file without a stored config; the load notes say which rule gave it). `weights` "int8" /
    "fp8" quantizes the blocks' linear layers after the strict load, on the host, before the model moves to
    `device`; an already-quantized file keeps its own format. Raises CheckpointError."""
    scheme = scheme_named(weights)
    path = Path(path)
    notes: list[str] = []
    hf_config: dict = {}
    if path.is_dir():
        tensors, hf_config = read_hf_folder(path)
        raw = RawCheckpoint(path, tensors)
    else:
        raw = read_checkpoint(path)
    tensors = rename_scales(path, strip_prefixes(raw.tensors))
    kind = detect_kind(tensors)
    if kind == "hf-llama":
        tensors = hf_to_llamagen(path, tensors)
        source = "hf-llama"
    elif kind == "gpt":
        source = "safetensors" if path.suffix == ".safetensors" else f"llamagen-pt[{raw.wrapper or 'bare'}]"
    else:
        raise CheckpointError(path, "a LlamaGen GPT (tok_embeddings.weight, layers.N.attention.wqkv.weight)",
                              _describe(kind, tensors), GPT_FIX)
    if raw.metadata and raw.metadata.get("kind") not in (None, "gpt"):
        raise CheckpointError(path, "a GPT file", f"a file marked '{raw.metadata.get('kind')}'", GPT_FIX)
    try:
        config = infer_gpt_config(path, tensors, raw.metadata, raw.args, hf_config, notes, n_head)
        if grid_size is not None:
            config = config.with_grid(grid_size)
    except ConfigError as exc:
        raise CheckpointError(path, "a consistent GPT configuration", str(exc), GPT_FIX) from exc
    if config.model_type == "t2i" and "cls_embedding.uncond_embedding" not in tensors and kind == "hf-llama":
        raise CheckpointError(path, "the saved buffer cls_embedding.uncond_embedding", "no such tensor",
                              "this checkpoint lacks the unconditional caption embedding; re-download it")
    check_layer_count(path, config, tensors, GPT_FIX)
    stored = quantized_layers(path, tensors)
    model = build_on_meta(LlamaGenGPT, config, path, GPT_FIX)
    prepare_quantized(model, stored, dtype)
    load_state_strict(model, cast_for_load(tensors, dtype), path, GPT_FIX, assign=True)
    tensors = None  # the model holds the weights now: drop ours so quantizing frees each layer's original
    raw.tensors.clear()
    model.rope_table = model._build_rope()
    if stored:
        held = weights_scheme(model)
        source += f"[{held}]"
        if scheme is None or scheme.name != held:
            notes.append(f"the file holds {held} weights: loaded as they are")
    else:
        model = quantize_at_load(model, scheme, notes)
    for note in notes:
        log.info("%s: %s", path.name, note)
    model = model.to(device=device, dtype=dtype).eval()
    return LoadedGPT(model, config, source, raw.metadata.get("class_names"), notes)


# ------------------------------------------------------------------------------------- VQ inference

def infer_vq_config(path: Path, sd: dict[str, torch.Tensor], raw_meta: dict, l2_norm: bool = True) -> VQConfig:
    """A VQ config from our key names; `l2_norm` is not visible in weights (LlamaGen / Janus: True,
    Chameleon's VQGAN: False); level attention is read from the keys."""
    if "config" in raw_meta:
        return config_from_metadata(VQConfig, path, raw_meta, VQ_FIX)
    size, embed_dim = sd["quantize.embedding.weight"].shape
    ch = sd["encoder.conv_in.weight"].shape[0]
    levels = len({int(m.group(1)) for k in sd if (m := re.match(r"encoder\.conv_blocks\.(\d+)\.", k))})
    enc_mult = tuple(sd[f"encoder.conv_blocks.{i}.res.0.conv2.weight"].shape[0] // ch for i in range(levels))
    dec_mult = tuple(sd[f"decoder.conv_blocks.{levels - 1 - i}.res.0.conv2.weight"].shape[0] // ch
                     for i in range(levels))
    n_res = len({int(m.group(1)) for k in sd if (m := re.match(r"encoder\.conv_blocks\.0\.res\.(\d+)\.", k))})
    level_attention = any(re.match(r"encoder\.conv_blocks\.\d+\.attn\.", k) for k in sd)
    return VQConfig(codebook_size=size, codebook_embed_dim=embed_dim, codebook_l2_norm=l2_norm,
                    codebook_show_usage="quantize.codebook_used" in sd, ch=ch, encoder_ch_mult=enc_mult,
                    decoder_ch_mult=dec_mult, z_channels=sd["encoder.conv_out.weight"].shape[0],
                    num_res_blocks=n_res, level_attention=level_attention)


def load_vq(path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> LoadedVQ:
    """Load a LlamaGen VQ tokenizer (VQ-16 / VQ-8 layouts, any width), strictly. Raises CheckpointError."""
    path = Path(path)
    raw = read_checkpoint(path)
    tensors = strip_prefixes(raw.tensors)
    kind = detect_kind(tensors)
    if kind != "vq":
        raise CheckpointError(path, "a VQ tokenizer (encoder.*, decoder.*, quantize.embedding.weight)",
                              _describe(kind, tensors), VQ_FIX)
    try:
        config = infer_vq_config(path, tensors, raw.metadata)
    except (KeyError, ConfigError) as exc:
        raise CheckpointError(path, "a complete VQ tokenizer", f"an inconsistent layout ({exc})", VQ_FIX) from exc
    model = VQModel(config)
    load_state_strict(model, {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, path, VQ_FIX)
    source = "safetensors" if path.suffix == ".safetensors" else f"llamagen-pt[{raw.wrapper or 'bare'}]"
    return LoadedVQ(model.to(device=device, dtype=dtype).eval(), config, source)
