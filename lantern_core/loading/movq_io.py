"""Published MoVQ tokenizer weights onto `models.movq.MoVQModel`: Emu3's vision tokenizer in transformers'
layout (`Emu3ForConditionalGeneration` checkpoints such as `BAAI/Emu3-Gen-hf`: keys `vqmodel.*` as published,
`model.vqmodel.*` as transformers saves them today) with its `vq_config`; the same tokenizer in its original layout
(`BAAI/Emu3-VisionTokenizer`, remote-code `Emu3VisionVQModel`: a folder of config.json with model_type
"Emu3VisionVQ" and model.safetensors, keys `decoder.*`, `quantize.*`, `post_quant_conv.*` with taming-style module
names, renamed here to transformers' names); and MoVQGAN (`ai-forever/MoVQGAN`, Lumina-mGPT 2.0's tokenizer: flat
taming-style keys, sizes read from the tensors).

Only the decoder path is read (codebook, post_quant_conv, temporal front, decoder): encoder and quant_conv keys (and
MoVQGAN's training losses) are recognised and left out on purpose, because the pack never encodes images; any other
key, and any decoder key missing or of the wrong shape, is a CheckpointError naming it. Emu3's causal 3-D kernels
become the 2-D kernels of their last temporal tap (`models/movq.py` says why frame 0 needs nothing else). Only
`load_emu3_vision_tokenizer` reads files (through `checkpoint_io`); everything else maps tensors already read.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ..errors import CheckpointError, ConfigError, shown
from ..models.movq import MoVQConfig, MoVQModel
from .checkpoint_io import read_checkpoint, read_json_object

EMU3_PREFIXES = ("model.vqmodel.", "vqmodel.")
SKIPPED = ("encoder.", "quant_conv.")  # the encoding path: not needed to decode


def emu3_vq_config(vq: dict, where: str = "config.json vq_config") -> MoVQConfig:
    """`MoVQConfig` from an Emu3 `vq_config` as published; a field it leaves out takes transformers'
    `Emu3VQVAEConfig` default (as transformers' own loader does). The attention width must be the channel
    count of the levels that attend (`hidden_size`), as in every release."""
    mult = tuple(int(m) for m in vq.get("channel_multiplier", (1, 2, 2, 4)))
    factor = int(vq.get("temporal_downsample_factor", 4))
    if factor < 1 or factor & (factor - 1):
        raise ConfigError(f"{where}.temporal_downsample_factor", "a power of two", factor)
    config = MoVQConfig(codebook_size=int(vq.get("codebook_size", 32768)), embed_dim=int(vq.get("embed_dim", 4)),
                        z_channels=int(vq.get("latent_channels", 4)), ch=int(vq.get("base_channels", 256)),
                        ch_mult=mult,
                        num_res_blocks=int(vq.get("num_res_blocks", 2)),
                        attn_levels=tuple(int(a) for a in vq.get("attn_resolutions", (3,))),
                        temporal_blocks=int(vq.get("num_res_blocks", 2)), temporal_upsamples=factor.bit_length() - 1)
    width, heads = int(vq.get("hidden_size", 1024)), int(vq.get("num_attention_heads", 1))
    attending = {config.ch * mult[level] for level in config.attn_levels} | {config.ch * mult[-1]}
    if heads != 1 or attending != {width}:
        raise ConfigError(f"{where}.hidden_size / num_attention_heads",
                          f"one head as wide as the attending levels' channels {sorted(attending)}",
                          {"hidden_size": width, "num_attention_heads": heads})
    return config


def _rename_emu3(key: str) -> str:
    """transformers' decoder name -> ours (prefix already stripped)."""
    rules = (
        (r"^post_quant_conv\.conv\.", "post_quant_conv."),
        (r"^quantize\.embedding\.", "embedding."),
        (r"^decoder\.time_res_stack\.(\d+)\.(norm\d|conv\d)\.(?:conv\.)?", r"front.res.\1.\2."),
        (r"^decoder\.time_conv\.(\d+)\.conv\.conv\.", r"front.up.\1."),
        (r"^decoder\.middle_block\.block_(\d)\.", r"decoder.mid_block_\1."),
        (r"^decoder\.middle_block\.attn_norm\.", "decoder.mid_attn.norm."),
        (r"^decoder\.middle_block\.attn_1\.", "decoder.mid_attn."),
        (r"^decoder\.up_block\.up\.(\d+)\.attn_norms\.(\d+)\.", r"decoder.up.\1.attn.\2.norm."),
        (r"^decoder\.up_block\.up\.(\d+)\.upsample\.conv\.", r"decoder.up.\1.upsample."),
        (r"^decoder\.up_block\.up\.(\d+)\.", r"decoder.up.\1."),
    )
    for pattern, replacement in rules:
        key, n = re.subn(pattern, replacement, key)
        if n:
            break
    for old, new in ((".q_proj.", ".q."), (".k_proj.", ".k."), (".v_proj.", ".v."), (".out_proj.", ".proj_out.")):
        key = key.replace(old, new)
    return key


def emu3_vq_state(tensors: dict[str, torch.Tensor], source: str | Path) -> dict[str, torch.Tensor]:
    """Our `MoVQModel` state from an Emu3 checkpoint's tensors in transformers' layout (`source` names the file
    in errors). 3-D kernels keep their last temporal tap; attention projections become 1x1 convolutions."""
    state: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        prefix = next((p for p in EMU3_PREFIXES if key.startswith(p)), None)
        if prefix is None:
            continue  # the language model's weights
        name = key[len(prefix):]
        if name.startswith(SKIPPED):
            continue
        ours = _rename_emu3(name)
        if tensor.dim() == 5:  # (out, in, t, kh, kw): frame 0 of a causal conv uses the last tap only
            tensor = tensor[:, :, -1]
        if re.search(r"\.(q|k|v|proj_out)\.weight$", ours) and tensor.dim() == 2:
            tensor = tensor[:, :, None, None]  # Linear (C, C) -> 1x1 conv
        state[ours] = tensor
    if not state:
        raise CheckpointError(source, "Emu3 vision-tokenizer weights (keys under vqmodel. or model.vqmodel.)",
                              "none", "choose the Emu3 checkpoint folder as downloaded (BAAI/Emu3-Gen-hf)")
    return state


def load_emu3_vq(tensors: dict[str, torch.Tensor], vq: dict, source: str | Path,
                 dtype: torch.dtype = torch.float32) -> MoVQModel:
    """A strict load into a model of `dtype` (on the tensors' device)."""
    return _strict(MoVQModel(emu3_vq_config(vq)).to(dtype), emu3_vq_state(tensors, source), source,
                   "the Emu3 vision tokenizer's decoder weights as config.json vq_config sizes them",
                   "config.json and the weights come from different models: download the folder again")


def _strict(model: MoVQModel, state: dict[str, torch.Tensor], source: str | Path, what: str, fix: str) -> MoVQModel:
    """Every decoder weight present, of its shape, and nothing unknown; else a CheckpointError naming them."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unknown = sorted(set(state) - set(expected))
    if missing or unknown:
        raise CheckpointError(source, what, f"{len(missing)} missing {missing[:6]}, {len(unknown)} unexpected "
                              f"{unknown[:6]}", fix)
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(source, f"{name} of shape {tuple(expected[name].shape)}", f"{tuple(tensor.shape)}",
                                  fix)
    model.load_state_dict(state, strict=True)
    return model.eval()


EMU3_ORIGINAL_TYPE = "Emu3VisionVQ"  # config.json model_type of BAAI/Emu3-VisionTokenizer
EMU3_ORIGINAL_FIX = "use the BAAI/Emu3-VisionTokenizer folder as downloaded (config.json and model.safetensors)"


def emu3_original_vq_config(cfg: dict, where: str = "config.json") -> MoVQConfig:
    """`MoVQConfig` from the original tokenizer's config.json (`Emu3VisionVQConfig`'s field names). The fields that
    size the decoder (codebook_size, embed_dim, z_channels, ch, ch_mult, num_res_blocks, attn_resolutions,
    temporal_downsample_factor) must all be there: a missing or invalid one is a ConfigError naming it.
    out_channels may be left out (3, the only value the decoder builds); model_type, when given, must be
    "Emu3VisionVQ". The encoder's fields (in_channels, double_z), dropout and transformers' bookkeeping are
    ignored. Attention is single-head at each level's own width, as the original model builds it."""
    def field(name: str) -> object:
        if cfg.get(name) is None:
            raise ConfigError(f"{where}.{name}", "a field of the Emu3 vision tokenizer's config",
                              "no such field" if name not in cfg else None, EMU3_ORIGINAL_FIX)
        return cfg[name]

    def integer(value: object, name: str, low: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{where}.{name}", f"an integer >= {low}", shown(value), EMU3_ORIGINAL_FIX)
        return value

    def integers(name: str, low: int, allow_empty: bool) -> tuple[int, ...]:
        value = field(name)
        if not isinstance(value, (list, tuple)) or not (value or allow_empty):
            raise ConfigError(f"{where}.{name}", "a list of integers", shown(value), EMU3_ORIGINAL_FIX)
        return tuple(integer(v, name, low) for v in value)

    kind = cfg.get("model_type", EMU3_ORIGINAL_TYPE)
    if kind != EMU3_ORIGINAL_TYPE:
        raise ConfigError(f"{where}.model_type", f"'{EMU3_ORIGINAL_TYPE}' (BAAI/Emu3-VisionTokenizer's layout)",
                          shown(kind), "for an Emu3-Gen-hf folder (model_type 'emu3') use its vq_config loader")
    mult = integers("ch_mult", 1, allow_empty=False)
    attn = integers("attn_resolutions", 0, allow_empty=True)
    if any(level >= len(mult) for level in attn):
        raise ConfigError(f"{where}.attn_resolutions", f"level indices in 0..{len(mult) - 1} (one per ch_mult entry)",
                          list(attn), EMU3_ORIGINAL_FIX)
    factor = integer(field("temporal_downsample_factor"), "temporal_downsample_factor")
    if factor & (factor - 1):
        raise ConfigError(f"{where}.temporal_downsample_factor", "a power of two", factor, EMU3_ORIGINAL_FIX)
    if cfg.get("out_channels", 3) != 3:
        raise ConfigError(f"{where}.out_channels", "3 (RGB, as released)", shown(cfg["out_channels"]),
                          EMU3_ORIGINAL_FIX)
    blocks = integer(field("num_res_blocks"), "num_res_blocks")
    return MoVQConfig(codebook_size=integer(field("codebook_size"), "codebook_size"),
                      embed_dim=integer(field("embed_dim"), "embed_dim"),
                      z_channels=integer(field("z_channels"), "z_channels"), ch=integer(field("ch"), "ch"),
                      ch_mult=mult, num_res_blocks=blocks, attn_levels=attn,
                      temporal_blocks=blocks, temporal_upsamples=factor.bit_length() - 1)


_ORIGINAL_RULES = (  # original module path -> transformers' (prefix already stripped), first match wins
    (r"^decoder\.mid\.attn_1\.norm\.", "decoder.middle_block.attn_norm."),
    (r"^decoder\.mid\.", "decoder.middle_block."),
    (r"^decoder\.up\.(\d+)\.attn\.(\d+)\.norm\.", r"decoder.up_block.up.\1.attn_norms.\2."),
    (r"^decoder\.up\.", "decoder.up_block.up."),
)
_ORIGINAL_PROJECTIONS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "proj_out": "out_proj"}


def emu3_original_to_hf(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An original `Emu3VisionVQModel` state (BAAI/Emu3-VisionTokenizer) under transformers' `Emu3VQVAE` names,
    prefixed `vqmodel.` as in an Emu3-Gen-hf checkpoint, so `emu3_vq_state` reads it. Renamed: the middle block
    (`mid.` -> `middle_block.`, its attention norm `mid.attn_1.norm.` -> `middle_block.attn_norm.`), the up levels
    (`up.N.` -> `up_block.up.N.`, attention norms `up.N.attn.M.norm.` -> `up_block.up.N.attn_norms.M.`) and the
    attention projections (`q/k/v/proj_out` -> `q_proj/k_proj/v_proj/out_proj`, 1x1 conv kernels -> Linear
    matrices); `quantize.*`, `post_quant_conv.*` and the temporal front keep their names. The encoder and
    quant_conv are dropped (never used to decode); any other key is kept, prefixed, so a strict load names it."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        if key.startswith(SKIPPED):
            continue
        name = key
        for pattern, replacement in _ORIGINAL_RULES:
            name, n = re.subn(pattern, replacement, name)
            if n:
                break
        match = re.search(r"\.(attn_1|attn\.\d+)\.(q|k|v|proj_out)\.(weight|bias)$", name)
        if match and name.startswith("decoder."):
            head = name[:match.start(2)]
            name = f"{head}{_ORIGINAL_PROJECTIONS[match.group(2)]}.{match.group(3)}"
            if tensor.dim() == 4 and tensor.shape[2:] == (1, 1):
                tensor = tensor.flatten(1)  # 1x1 conv (C, C, 1, 1) -> Linear (C, C)
        out[f"vqmodel.{name}"] = tensor
    return out


def load_emu3_vision_tokenizer(folder_or_file: str | Path, dtype: torch.dtype = torch.float32) -> MoVQModel:
    """The decoder of BAAI/Emu3-VisionTokenizer as published (original layout): a folder holding config.json and
    model.safetensors, or that model.safetensors itself (its config.json beside it). Safetensors only. A strict
    load into a model of `dtype`, the same `MoVQModel` as `load_emu3_vq` returns; weights that do not fit are a
    CheckpointError naming model.safetensors, a config that does not a ConfigError naming the field."""
    path = Path(folder_or_file)
    weights = path / "model.safetensors" if path.is_dir() else path
    if weights.suffix.lower() != ".safetensors":
        raise CheckpointError(weights, "the tokenizer's model.safetensors (safetensors only)",
                              f"a '{weights.suffix}' file", EMU3_ORIGINAL_FIX)
    config_path = weights.parent / "config.json"
    config = emu3_original_vq_config(read_json_object(config_path, EMU3_ORIGINAL_FIX), str(config_path))
    tensors = read_checkpoint(weights).tensors
    if any(key.startswith(EMU3_PREFIXES) for key in tensors):
        raise CheckpointError(weights, "the original Emu3VisionVQModel keys (decoder.*, quantize.*, ...)",
                              "transformers' layout (vqmodel.* keys)",
                              "load an Emu3-Gen-hf folder with its vq_config instead")
    if not any(key.startswith("decoder.") for key in tensors):
        raise CheckpointError(weights, "Emu3 vision-tokenizer weights (keys under decoder.)",
                              f"none (keys: {sorted(tensors)[:4]})", EMU3_ORIGINAL_FIX)
    return _strict(MoVQModel(config).to(dtype), emu3_vq_state(emu3_original_to_hf(tensors), weights), weights,
                   "the Emu3 vision tokenizer's decoder weights as config.json sizes them",
                   "config.json and model.safetensors come from different models: " + EMU3_ORIGINAL_FIX)


MOVQGAN_SKIPPED = ("encoder.", "quant_conv.", "loss.")  # the encoding path and the training losses


def movqgan_config(tensors: dict[str, torch.Tensor], source: str | Path) -> MoVQConfig:
    """The sizes of a MoVQGAN checkpoint (`ai-forever/MoVQGAN`'s `movqgan_*.ckpt`, flat keys as Lumina-mGPT 2.0
    loads them), read from its tensors: codebook, channels per up level, blocks per level, which levels attend.
    Nothing is assumed from the file name."""
    def shape(name: str) -> tuple[int, ...]:
        if name not in tensors:
            raise CheckpointError(source, f"a MoVQGAN decoder ({name})", "no such tensor",
                                  "choose movqgan_270M.ckpt as downloaded from ai-forever/MoVQGAN")
        return tuple(tensors[name].shape)

    levels = {int(m.group(1)) for k in tensors if (m := re.match(r"decoder\.up\.(\d+)\.", k))}
    blocks = {int(m.group(1)) for k in tensors if (m := re.match(r"decoder\.up\.0\.block\.(\d+)\.", k))}
    if not levels or levels != set(range(len(levels))) or not blocks:
        raise CheckpointError(source, "a MoVQGAN decoder (decoder.up.0 .. decoder.up.N with resnet blocks)",
                              f"up levels {sorted(levels)}",
                              "choose movqgan_270M.ckpt as downloaded from ai-forever/MoVQGAN")
    width = [shape(f"decoder.up.{level}.block.0.conv2.weight")[0] for level in range(len(levels))]
    ch = width[0]
    if any(w % ch for w in width):
        raise CheckpointError(source, "up levels whose widths are multiples of level 0's", f"widths {width}",
                              "choose movqgan_270M.ckpt as downloaded from ai-forever/MoVQGAN")
    codebook, embed_dim = shape("quantize.embedding.weight")
    return MoVQConfig(codebook_size=codebook, embed_dim=embed_dim, z_channels=shape("decoder.conv_in.weight")[1],
                      ch=ch, ch_mult=tuple(w // ch for w in width), num_res_blocks=max(blocks),
                      attn_levels=tuple(level for level in range(len(levels))
                                        if f"decoder.up.{level}.attn.0.q.weight" in tensors))


def movqgan_state(tensors: dict[str, torch.Tensor], source: str | Path) -> dict[str, torch.Tensor]:
    """Our `MoVQModel` state from a MoVQGAN checkpoint's flat keys (taming-style names)."""
    rules = ((r"^quantize\.embedding\.", "embedding."), (r"^decoder\.mid\.block_(\d)\.", r"decoder.mid_block_\1."),
             (r"^decoder\.mid\.attn_1\.", "decoder.mid_attn."),
             (r"^decoder\.up\.(\d+)\.upsample\.conv\.", r"decoder.up.\1.upsample."))
    state = {}
    for key, tensor in tensors.items():
        if key.startswith(MOVQGAN_SKIPPED):
            continue
        for pattern, replacement in rules:
            key, n = re.subn(pattern, replacement, key)
            if n:
                break
        state[key] = tensor
    return state


def load_movqgan(tensors: dict[str, torch.Tensor], source: str | Path, dtype: torch.dtype = torch.float32) -> MoVQModel:
    """A strict load of a MoVQGAN decoder (sizes from the tensors) into a model of `dtype`."""
    return _strict(MoVQModel(movqgan_config(tensors, source)).to(dtype), movqgan_state(tensors, source), source,
                   "MoVQGAN's decoder weights", "choose movqgan_270M.ckpt as downloaded from ai-forever/MoVQGAN")
