"""Reading and writing EAGLE / LANTERN drafters in the released layout, strictly.

Released LlamaGen drafters (`jadohu/llamagen_drafter`, `jadohu/llamagen2_drafter`) are a folder with
`config.json` + `pytorch_model.bin` (HF names: `embed_tokens`, `fc`, `layers.0.self_attn.{q,k,v,o}_proj`,
`layers.0.mlp.{gate,up,down}_proj`, `layers.0.post_attention_layernorm`). The released Anole drafter
(`jadohu/anole_drafter`, `model_type: chameleon`) is one Chameleon layer in the same layout plus
`layers.0.input_layernorm` and the QK-norm `layers.0.self_attn.{q,k}_norm.{weight,bias}`, with a
65,536-row `embed_tokens` (the target's text embedding), of which the image tokens' rows are kept (the
target's code -> token map is needed: `image_token_ids`); its q/k use HF's rotate-half RoPE and are
permuted to our interleaved pairs, and written back that way. We also read `model.safetensors` in that
folder, or a single `.safetensors`/`.bin` file (then the config comes from our metadata or is inferred
from the weights and the target). Names are mapped onto `EagleDrafter` (q/k/v fused into the shared
block's `wqkv`); any missing, extra or mis-shaped tensor, and any drafter that does not fit the target,
is a `CheckpointError`. `save_drafter` writes config.json + model.safetensors in the released names.
The prefix convention a drafter was trained with (`DrafterConfig.prefix_states`) is read from
config.json's `lantern.prefix_states` (written by `save_drafter`); a released LlamaGen text-to-image
folder without it gets "hf_port" (trained on LANTERN's HF port), anything else "native".
The released Lumina-mGPT drafter (`sihwanpark/LANTERN-Lumina-mGPT-7B-768`: config.json + model.safetensors)
is the Anole layout over Lumina's vocabulary (its end-of-row token among the kept rows), with QK-norm
rows per model-parallel shard ((1, head_dim), shared by every head); every field of a Chameleon
drafter's config.json is used, checked or knowingly left aside (`CHAMELEON_*`), and LANTERN's
`embed_upscale` (input-embedding scale) is read where a config declares it.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .checkpoint_io import read_checkpoint, read_json_object, write_safetensors
from .checkpoints import build_on_meta, config_from_metadata, load_state_strict, strip_prefixes
from ..config import HEADS_BY_DIM, PREFIX_STATES, DrafterConfig, GPTConfig
from ..errors import CheckpointError, ConfigError, LanternError
from ..models.drafter import EagleDrafter
from ..models.rope import interleave_head_norm, permute_rotate_half, unpermute_rotate_half

log = logging.getLogger("lantern_core.loading.drafter_io")
DRAFTER_FIX = ("choose the drafter trained for this target model (a folder with config.json + "
               "pytorch_model.bin or model.safetensors, e.g. jadohu/llamagen_drafter for LlamaGen-T2I stage I), "
               "or train one with `python -m lantern_core.training.train_drafter`")
# LANTERN's `input_type` -> (grid side, drafter prefix length)
INPUT_TYPES = {"t2i": (16, 119), "t2i2": (32, 119), "c2i": (24, 0)}
MLP_MAP = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
NORM_MAP = {"layers.0.post_attention_layernorm.weight": "layers.0.ffn_norm.weight",
            "layers.0.input_layernorm.weight": "layers.0.attention_norm.weight"}


@dataclass
class LoadedDrafter:
    model: EagleDrafter
    config: DrafterConfig
    source_format: str  # "released-folder", "safetensors", ...


def released_to_internal(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    qkv: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        m = re.fullmatch(r"layers\.0\.(self_attn|mlp)\.(\w+)\.weight", key)
        if m and m.group(1) == "self_attn" and m.group(2) in ("q_proj", "k_proj", "v_proj"):
            qkv[m.group(2)[0]] = value
        elif m and m.group(2) == "o_proj":
            out["layers.0.attention.wo.weight"] = value
        elif m and m.group(2) in MLP_MAP:
            out[f"layers.0.feed_forward.{MLP_MAP[m.group(2)]}.weight"] = value
        elif key in NORM_MAP:
            out[NORM_MAP[key]] = value
        elif qk := re.fullmatch(r"layers\.0\.self_attn\.([qk])_norm\.(weight|bias)", key):
            out[f"layers.0.attention.{qk.group(1)}_norm.{qk.group(2)}"] = value
        else:
            out[key] = value  # embed_tokens, fc; anything else is reported as unexpected
    if qkv:
        if set(qkv) != {"q", "k", "v"}:
            raise CheckpointError(path, "q_proj, k_proj and v_proj in layers.0.self_attn", f"only {sorted(qkv)}",
                                  "the drafter file is incomplete: download it again")
        out["layers.0.attention.wqkv.weight"] = torch.cat([qkv["q"], qkv["k"], qkv["v"]], dim=0)
    return out


def internal_to_released(state: dict[str, torch.Tensor], config: DrafterConfig) -> dict[str, torch.Tensor]:
    inverse = {v: k for k, v in MLP_MAP.items()}
    norms = {v: k for k, v in NORM_MAP.items()}
    head_dim = config.dim // config.n_head
    q_size, kv_size = config.n_head * head_dim, config.n_kv_head * head_dim
    heads = {"q": config.n_head, "k": config.n_kv_head}
    # 1-D RoPE families are written in HF's rotate-half convention, as released
    halves = (lambda w, h: unpermute_rotate_half(w, h)) if config.rope_dims == 1 else (lambda w, h: w)
    out = {}
    for key, value in state.items():
        if key == "layers.0.attention.wqkv.weight":
            q, k, v = value.split([q_size, kv_size, kv_size], dim=0)
            out.update({"layers.0.self_attn.q_proj.weight": halves(q, config.n_head),
                        "layers.0.self_attn.k_proj.weight": halves(k, config.n_kv_head),
                        "layers.0.self_attn.v_proj.weight": v})
        elif key == "layers.0.attention.wo.weight":
            out["layers.0.self_attn.o_proj.weight"] = value
        elif key.startswith("layers.0.feed_forward."):
            out[f"layers.0.mlp.{inverse[key.split('.')[3]]}.weight"] = value
        elif key in norms:
            out[norms[key]] = value
        elif qk := re.fullmatch(r"layers\.0\.attention\.([qk])_norm\.(weight|bias)", key):
            out[f"layers.0.self_attn.{qk.group(1)}_norm.{qk.group(2)}"] = halves(value, heads[qk.group(1)])
        else:
            out[key] = value
    return out


def to_interleaved(sd: dict[str, torch.Tensor], config: DrafterConfig) -> dict[str, torch.Tensor]:
    """A 1-D-RoPE drafter read in the rotate-half convention -> our interleaved pairs (q/k rows, QK-norms)."""
    if config.rope_dims != 1:
        return sd
    out = dict(sd)
    head_dim = config.dim // config.n_head
    q_size, kv_size = config.n_head * head_dim, config.n_kv_head * head_dim
    wqkv = out.get("layers.0.attention.wqkv.weight")
    if wqkv is not None and wqkv.shape[0] == q_size + 2 * kv_size:
        q, k, v = wqkv.split([q_size, kv_size, kv_size], dim=0)
        out["layers.0.attention.wqkv.weight"] = torch.cat(
            [permute_rotate_half(q, config.n_head), permute_rotate_half(k, config.n_kv_head), v])
    for name, heads in (("q", config.n_head), ("k", config.n_kv_head)):
        for part in ("weight", "bias"):
            key = f"layers.0.attention.{name}_norm.{part}"
            if key in out:
                out[key] = interleave_head_norm(out[key], heads, head_dim)
    return out


def image_rows(path: Path, sd: dict[str, torch.Tensor], config: DrafterConfig,
               image_token_ids: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], DrafterConfig]:
    """A Chameleon drafter's full-vocabulary `embed_tokens` (65,536 rows) -> the rows of the image codes."""
    emb = sd.get("embed_tokens.weight")
    if config.family != "chameleon" or emb is None or image_token_ids is None or emb.shape[0] == len(image_token_ids):
        return sd, config
    if int(image_token_ids.max()) >= emb.shape[0]:
        raise CheckpointError(path, f"an embedding covering the target's image tokens (ids up to "
                              f"{int(image_token_ids.max())})", f"{emb.shape[0]} rows", DRAFTER_FIX)
    sd = {**sd, "embed_tokens.weight": emb[image_token_ids.to(emb.device)]}
    return sd, DrafterConfig(**{**config.to_dict(), "vocab_size": len(image_token_ids)})


def _read_config(config_path: Path) -> dict:
    hf = read_json_object(config_path, "re-download config.json")
    if not isinstance(hf.get("lantern", {}), dict):
        raise CheckpointError(config_path, "a JSON object (its 'lantern' entry an object too)",
                              f"{type(hf).__name__} {str(hf)[:80]}", "re-download config.json")
    return hf


def _read_files(path: Path) -> tuple[dict[str, torch.Tensor], dict, dict, str]:
    """-> (tensors, HF config.json or {}, our metadata or {}, source format)."""
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise CheckpointError(path, "config.json in the drafter folder", "no config.json",
                                  "download config.json from the drafter's repository into this folder")
        hf = _read_config(config_path)
        for name in ("model.safetensors", "pytorch_model.bin"):
            if (path / name).is_file():
                raw = read_checkpoint(path / name)
                return raw.tensors, hf, raw.metadata, "released-folder"
        raise CheckpointError(path, "pytorch_model.bin or model.safetensors beside config.json",
                              f"only {sorted(p.name for p in path.iterdir())[:10]}", DRAFTER_FIX)
    raw = read_checkpoint(path)
    sibling = path.parent / "config.json"
    hf = _read_config(sibling) if raw.metadata.get("kind") != "drafter" and sibling.is_file() else {}
    return raw.tensors, hf, raw.metadata, "safetensors" if path.suffix == ".safetensors" else "pt"


def infer_drafter_config(path: Path, sd: dict[str, torch.Tensor], hf: dict, meta: dict,
                         target: GPTConfig | None) -> DrafterConfig:
    try:
        config = _infer_drafter_config(path, sd, hf, meta, target)
    except LanternError:
        raise
    except (TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError) as exc:  # odd config.json values
        raise CheckpointError(path, "a drafter config.json with integer sizes and numeric rope_theta / rms_norm_eps",
                              f"a value that cannot be used ({type(exc).__name__}: {exc})", DRAFTER_FIX) from exc
    try:  # DrafterConfig checks the value
        return replace(config, prefix_states=prefix_convention(hf, config))
    except ConfigError as exc:
        raise CheckpointError(path, f"config.json's lantern.prefix_states to be one of {PREFIX_STATES}", str(exc),
                              "see docs/decoding_modes.md, section Prefix states") from exc


def prefix_convention(hf: dict, config: DrafterConfig) -> str:
    """The prefix convention the drafter was trained with (`decoding/trees/prefix_states.py`): config.json's
    `lantern.prefix_states` when written; else "hf_port" for LANTERN's released LlamaGen text-to-image
    layout (its `input_type` t2i / t2i2, which `save_drafter` never writes: trained on its HF port's
    states); else what the file's own metadata says, "native" by default (our drafters, older ones
    included, the Anole drafter, class-conditional ones)."""
    ours = hf.get("lantern", {})
    if "prefix_states" in ours:
        return ours["prefix_states"]
    if hf.get("input_type") in ("t2i", "t2i2") and config.family == "llamagen":
        return "hf_port"
    return config.prefix_states


def _infer_drafter_config(path: Path, sd: dict[str, torch.Tensor], hf: dict, meta: dict,
                          target: GPTConfig | None) -> DrafterConfig:
    if "config" in meta:
        return config_from_metadata(DrafterConfig, path, meta, DRAFTER_FIX)
    ours = hf.get("lantern", {})
    try:
        dim = sd["fc.weight"].shape[0]
        ffn = sd["layers.0.feed_forward.w1.weight"].shape[0]
        vocab = sd["embed_tokens.weight"].shape[0]
        heads = hf.get("num_attention_heads") or (target.n_head if target and target.dim == dim else None) \
            or HEADS_BY_DIM.get(dim)
        if heads is None:
            raise CheckpointError(path, "the number of attention heads (config.json num_attention_heads)",
                                  f"no config and no known preset for hidden size {dim}", DRAFTER_FIX)
        head_dim = dim // heads
        kv_heads = sd["layers.0.attention.wqkv.weight"].shape[0] - dim
        kv_heads = kv_heads // (2 * head_dim)
    except KeyError as exc:
        raise CheckpointError(path, "a LANTERN/EAGLE drafter (fc, embed_tokens, layers.0.self_attn.*, layers.0.mlp.*)",
                              f"no tensor {exc}", DRAFTER_FIX) from exc
    if hf.get("model_type") == "chameleon":  # LANTERN's Anole / Lumina drafter: one Chameleon layer
        if target is None or target.family != "chameleon":
            raise CheckpointError(path, "a Chameleon target (Anole or Lumina-mGPT) to size this Chameleon drafter",
                                  "no Chameleon target" if target is None else f"a {target.family} target",
                                  "load it in Lantern: Load Drafter connected to the Anole or Lumina-mGPT model "
                                  "it was trained for")
        check_chameleon_fields(path, hf, {"hidden_size": dim, "intermediate_size": ffn, "vocab_size": vocab,
                                          "num_attention_heads": heads, "num_key_value_heads": kv_heads})
        try:
            return DrafterConfig(dim=dim, n_head=heads, n_kv_head=kv_heads, ffn_dim=ffn, vocab_size=vocab,
                                 grid_size=target.grid_size, grid_cols=target.grid_cols,
                                 cls_token_num=target.cls_token_num - 1, rope_base=float(hf.get("rope_theta", 10000.0)),
                                 norm_eps=float(hf.get("rms_norm_eps", 1e-5)), bias=bool(hf.get("bias", True)),
                                 family="chameleon", input_norm=True, qk_norm=True, rope_dims=1,
                                 embed_scale=embed_scale(path, hf))
        except ConfigError as exc:
            raise CheckpointError(path, "a consistent drafter configuration", str(exc), DRAFTER_FIX) from exc
    input_type = hf.get("input_type")
    grid, cls = INPUT_TYPES.get(input_type, (None, None))
    grid = ours.get("grid_size", grid if grid is not None else (target.grid_size if target else None))
    cls = ours.get("cls_token_num", cls if cls is not None else (target.cls_token_num - 1 if target else None))
    if grid is None or cls is None:
        raise CheckpointError(path, f"an input_type in {sorted(INPUT_TYPES)} or a target model to size the drafter",
                              f"input_type {input_type!r} and no target", "load the drafter together with its target")
    if target is not None and grid != target.grid_size and input_type == "c2i" and "grid_size" not in ours:
        grid = target.grid_size  # c2i drafters follow the target's resolution (LANTERN hard-codes 24)
    try:
        return DrafterConfig(dim=dim, n_head=heads, n_kv_head=kv_heads, ffn_dim=ffn, vocab_size=vocab,
                             grid_size=grid, cls_token_num=cls, rope_base=float(hf.get("rope_theta", 10000.0)),
                             norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                             bias=bool(hf.get("bias", True)) if hf else "fc.bias" in sd,  # LANTERN: bias unless "bias": false
                             embed_scale=embed_scale(path, hf))
    except ConfigError as exc:
        raise CheckpointError(path, "a consistent drafter configuration", str(exc), DRAFTER_FIX) from exc


# Every field of a Chameleon drafter's config.json as LANTERN releases it (`jadohu/anole_drafter`,
# `sihwanpark/LANTERN-Lumina-mGPT-7B-768`: transformers' ChameleonConfig written by its training run) and
# what this loader does with it. Sizes are checked against the weights; the fields below are used, must hold
# the value our layer implements, or are read and knowingly left aside for the reason given.
CHAMELEON_REQUIRED = {  # field -> (the value our layer implements, the reason)
    "num_hidden_layers": (1, "an EAGLE drafter is one decoder layer"),
    "attention_bias": (False, "the layer's projections have no biases"),
    "mlp_bias": (False, "the layer's MLP has no biases"),
    "hidden_act": ("silu", "the MLP is SwiGLU"),
    "rope_scaling": (None, "LANTERN's Chameleon attention asserts no RoPE scaling"),
}
CHAMELEON_USED = ("hidden_size", "intermediate_size", "vocab_size", "num_attention_heads", "num_key_value_heads",
                  "rms_norm_eps", "rope_theta", "model_parallel_size", "bias", "embed_upscale", "lantern",
                  "model_type")
CHAMELEON_LEFT_ASIDE = {
    "dropout": "training only (LANTERN trains with 0.05; a no-op in eval)",
    "attention_dropout": "training only",
    "swin_norm": "LANTERN's drafters are always the pre-norm ChameleonDecoderLayer, whatever it says",
    "max_position_embeddings": "LANTERN's rotary table grows past it: not a limit",
    "architectures": "metadata", "transformers_version": "metadata", "torch_dtype": "the saved dtype (we cast)",
    "initializer_range": "training only", "use_cache": "runtime flag", "tie_word_embeddings": "the target's head",
    "boi_token_id": "the target's tokens", "bos_token_id": "the target's tokens", "eoi_token_id": "the target's tokens",
    "eos_token_id": "the target's tokens", "image_token_id": "the target's tokens", "pad_token_id": "the target's tokens",
    "vq_config": "the target's image tokenizer", "vocabulary_map": "the target's tokenizer",
}


def check_chameleon_fields(path: Path, hf: dict, sizes: dict[str, int]) -> None:
    """A Chameleon drafter's config.json against its weights (`sizes`, read off the tensors) and the layer
    we build (CHAMELEON_REQUIRED); fields of neither list are logged as left aside. A CheckpointError names
    the field, expected and found."""
    for name, found in sizes.items():
        if name in hf and hf[name] != found:
            raise CheckpointError(path, f"config.json {name} {hf[name]!r} to match the weights",
                                  f"{found} in the weights", "re-download the drafter folder (config.json and "
                                  "the weights come from different drafters)")
    for name, (value, reason) in CHAMELEON_REQUIRED.items():
        if name in hf and hf[name] != value:
            raise CheckpointError(path, f"config.json {name} {value!r} ({reason})", repr(hf[name]),
                                  "use a LANTERN drafter of one Chameleon layer as released")
    mp = hf.get("model_parallel_size", 1)
    heads, kv_heads = sizes["num_attention_heads"], sizes["num_key_value_heads"]
    if isinstance(mp, bool) or not isinstance(mp, int) or mp < 1 or heads % mp or kv_heads % mp:
        raise CheckpointError(path, f"config.json model_parallel_size a positive divisor of the {heads} attention "
                              f"and {kv_heads} key/value heads (its QK-norm rows are shared by heads / mp heads)",
                              repr(mp), "use the drafter's config.json as released (model_parallel_size 1)")
    unknown = sorted(set(hf) - set(CHAMELEON_USED) - set(CHAMELEON_REQUIRED) - set(CHAMELEON_LEFT_ASIDE))
    if unknown:
        log.info("drafter %s: config.json fields not read: %s", path, ", ".join(unknown))


def embed_scale(path: Path, hf: dict) -> float:
    """LANTERN's `embed_upscale` where config.json declares it (top level, or our `lantern` entry): the
    factor on the drafter's input embeddings, which LANTERN's code applies only above 1.0 (so a value at or
    below 1.0 means 1.0, with a log line when below); 1.0 when absent."""
    value = hf.get("embed_upscale", hf.get("lantern", {}).get("embed_upscale", 1.0))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (float("inf"), float("-inf")):
        raise CheckpointError(path, "config.json embed_upscale a finite number (LANTERN's input-embedding scale)",
                              repr(value), "remove embed_upscale or write the value the drafter was trained with")
    if value < 1.0:
        log.info("drafter %s: embed_upscale %s is not applied (LANTERN's code scales only above 1.0)", path, value)
    return max(float(value), 1.0)


def load_drafter(path: str | Path, target: GPTConfig | None = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, image_token_ids: torch.Tensor | None = None) -> LoadedDrafter:
    """Load a drafter strictly; with `target`, refuse one that does not fit it. `image_token_ids` (V,) are
    a Chameleon target's vocabulary ids of its image codes (PromptedImageLM.image.token_ids), needed for
    released Anole drafters. Raises CheckpointError."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(path, "a drafter folder or file", "nothing at that path",
                              "put the drafter in ComfyUI/models/lantern/drafters/")
    tensors, hf, meta, source = _read_files(path)
    tensors = strip_prefixes(tensors)
    if meta.get("kind") not in (None, "drafter"):
        raise CheckpointError(path, "a drafter file", f"a file marked '{meta.get('kind')}'", DRAFTER_FIX)
    if "fc.weight" not in tensors:
        raise CheckpointError(path, "a LANTERN/EAGLE drafter (fc.weight, layers.0.self_attn.*)",
                              f"tensors like {sorted(tensors)[:3]}", DRAFTER_FIX)
    sd = released_to_internal(path, tensors)
    config = infer_drafter_config(path, sd, hf, meta, target)
    sd, config = image_rows(path, to_interleaved(sd, config), config, image_token_ids)
    if target is not None and (problems := config.mismatches(target)):
        raise CheckpointError(path, "a drafter trained for the chosen target model", "a drafter with "
                              + ", ".join(problems), DRAFTER_FIX)
    model = build_on_meta(EagleDrafter, config, path, DRAFTER_FIX)
    load_state_strict(model, {k: v.float() if v.is_floating_point() else v for k, v in sd.items()},
                      path, DRAFTER_FIX, assign=True)
    model.rope_table = model._build_rope()
    model.embed_tokens.weight.requires_grad_(False)
    log.info("drafter %s: prefix states '%s'", path, config.prefix_states)
    return LoadedDrafter(model.to(device=device, dtype=dtype).eval(), config, source)


def save_drafter(model: EagleDrafter, folder: str | Path, extra: dict | None = None,
                 dtype: torch.dtype = torch.float32) -> Path:
    """Write config.json (HF keys LANTERN reads, plus ours under "lantern") + model.safetensors."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = model.config
    hf = {"architectures": ["EagleDrafter"], "hidden_size": c.dim, "intermediate_size": c.ffn_dim,
          "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_head, "num_hidden_layers": 1,
          "vocab_size": c.vocab_size, "rms_norm_eps": c.norm_eps, "rope_theta": c.rope_base, "bias": c.bias,
          "hidden_act": "silu", **({"embed_upscale": c.embed_scale} if c.embed_scale != 1.0 else {}),
          "lantern": {"grid_size": c.grid_size, "cls_token_num": c.cls_token_num,
                                            "family": c.family, "prefix_states": c.prefix_states,
                                            **(extra or {})}}
    tensors = {k: v.to(dtype) for k, v in internal_to_released(model.state_dict(), c).items()}
    write_safetensors(folder / "model.safetensors", tensors, {"kind": "drafter", "config": c.to_dict()})
    (folder / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True))
    return folder
