"""Loading a prompted-family model folder offline: Chameleon (Anole-7b, Lumina-mGPT), Janus-Pro and Emu3.

A folder is recognised from its `config.json` (`model_type` "chameleon", "janus" (transformers'
conversion) or "multi_modality" (DeepSeek's original Janus-Pro release)), never from its name (a hub
cache names a snapshot by its commit hash). A Chameleon folder is Lumina-mGPT when its config.json was
written by Alpha-VLLM's ChameleonXLLMX code: `architectures` names a ChameleonXLLMX class, or the config
carries `z_loss_weight`, the one field that code's config class adds to Chameleon's (`is_lumina`);
Anole's transformers config has neither. Lumina's images end every row with a forced end-of-row token
(`layout.py`), its prompt is its own template with size tokens (`prompts.lumina_format`) and it draws
768 px by default.

Decoder sizes come from the config: Chameleon's top level, transformers' Janus `text_config`, DeepSeek's
`language_config`. DeepSeek's own loader builds `LlamaConfig(**language_config)`, and its published
Janus-Pro-7B language_config names only the layer count and vocabulary, so for that layout a size the
config leaves out takes transformers' LlamaConfig default (`LLAMA_DEFAULTS`: hidden 4096, 32 heads,
as many key/value heads, intermediate 11008, eps 1e-6, RoPE base 10000), says so in the load notes, and
the weights' shapes are checked against those sizes before anything is built. The other layouts keep
requiring their sizes (their configs always carry them). A value that is present but invalid is an error
naming the field.

Weights are read from `model.safetensors` or sharded `model-*.safetensors` (+ index), `.bin` only through
`torch.load(weights_only=True)`. The tokenizer is the folder's `tokenizer.json` (or Chameleon's
`text_tokenizer.json`), read by the `tokenizers` library. The image tokenizer comes from the same
checkpoint for Janus, and from Chameleon's VQGAN file (`vqgan.safetensors` or `vqgan.ckpt`, in the
folder or its `tokenizer/` / `vqgan/` subfolder) for Chameleon. Nothing is downloaded; no remote code.
Weight renaming is `family_io.py`; model code is the shared trunk (`models/prompted.py`); the build every
prompted loader shares is `prompted_build.py`. Emu3 folders (model_type "Emu3", the original release, or "emu3",
transformers') are recognised here and loaded by `emu3.py`. Lumina-mGPT and Emu3 draw many sizes
(`SIZED_LAYOUTS`: a size -> a grid -> the prompt that names it). Lumina-mGPT 2.0 (a Lumina config whose
vocabulary names MoVQGAN image tokens) is loaded by `lumina2.py`.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ..config import GPTConfig
from ..errors import CheckpointError, ConfigError
from ..image_sizes import LUMINA_PATCH, emu3_grid, format_size, lumina2_grid, lumina_grid
from ..models.quantized import scheme_named
from ..models.vq import VQModel
from ..prompts import (FORMATS, LUMINA_ROW_END, PromptEncoder, PromptFormat, chameleon_image_token_ids, emu3_format,
                       load_tokenizer, lumina_format, lumina_size_token, token_id)
from .checkpoint_io import read_checkpoint, read_json_object
from .checkpoints import infer_vq_config, load_state_strict, read_hf_folder
from .emu3 import Emu3Request, load_emu3
from .lumina2 import Lumina2Request, is_lumina2, load_lumina2, lumina2_format
from .family_io import chameleon_state, janus_state, taming_to_ours
from .prompted_build import (LoadedPrompted, Placement, build_prompted, chameleon_config,  # noqa: F401
                             decoder_shape, defaults_note, fields_left_out, place_vq, positive, section)


# config.json model_type -> (family, layout); Emu3's trunk is the Chameleon family's (image codes as vocabulary
# tokens, `models/prompted.py`), without QK-norm
EMU3_LAYOUTS = {"Emu3": "emu3", "emu3": "hf-emu3"}
LAYOUTS = {"chameleon": ("chameleon", "hf-chameleon"), "janus": ("janus", "hf-janus"),
           "multi_modality": ("janus", "deepseek-janus"),
           **{model_type: ("chameleon", layout) for model_type, layout in EMU3_LAYOUTS.items()}}
DEFAULT_GRID = {"chameleon": 32, "janus": 24, "lumina": 48}  # Anole 512 px, Janus-Pro 384 px, Lumina 768 px
DEFAULT_MAX_PROMPT = 256
TOKENIZER_NAMES = ("tokenizer.json", "text_tokenizer.json", "tokenizer/text_tokenizer.json")
VQGAN_NAMES = ("vqgan.safetensors", "vqgan.ckpt", "tokenizer/vqgan.safetensors", "tokenizer/vqgan.ckpt",
               "vqgan/vqgan.safetensors", "vqgan/vqgan.ckpt")
FIX = ("choose the model's folder as downloaded (config.json, tokenizer.json, model*.safetensors), e.g. "
       "models/lantern/Anole-7b-v0.1-hf or models/lantern/Janus-Pro-7B")


def read_config(folder: Path) -> dict:
    return read_json_object(folder / "config.json", FIX)


def detect_family(folder: str | Path, cfg: dict | None = None) -> tuple[str, str]:
    """(family, layout) of a model folder, from config.json's model_type (`cfg`: the config, already read)."""
    folder = Path(folder)
    model_type = (read_config(folder) if cfg is None else cfg).get("model_type")
    if not isinstance(model_type, str) or model_type not in LAYOUTS:
        raise CheckpointError(folder / "config.json", f"model_type one of {sorted(LAYOUTS)} (Chameleon / Anole / "
                              "Lumina-mGPT, Janus-Pro, Emu3)", repr(model_type), FIX)
    return LAYOUTS[model_type]


def folder_layout(folder: str | Path, cfg: dict | None = None) -> tuple[str, str]:
    """(family, layout) with Lumina-mGPT told apart from Anole: "hf-lumina2" (2.0), "hf-lumina" (1.0), else
    `detect_family`'s layout."""
    folder = Path(folder)
    cfg = read_config(folder) if cfg is None else cfg
    family, layout = detect_family(folder, cfg)
    if layout == "hf-chameleon" and is_lumina(folder, cfg):
        layout = "hf-lumina2" if is_lumina2(cfg) else "hf-lumina"
    return family, layout


def layout_of(path: str | Path) -> tuple[str, str] | None:
    """(family, layout) of a prompted model folder (`folder_layout`), or None for anything else (a file, a
    folder without config.json, another model_type)."""
    path = Path(path)
    if not (path.is_dir() and (path / "config.json").is_file()):
        return None
    try:
        return folder_layout(path)
    except (CheckpointError, ConfigError):
        return None


def family_of(path: str | Path) -> str | None:
    """The prompted family ("chameleon", "janus") of a model folder, or None for anything else."""
    found = layout_of(path)
    return None if found is None else found[0]


def is_lumina(folder: Path, cfg: dict) -> bool:
    """Lumina-mGPT among Chameleon folders, from its config.json (`cfg`) alone: Alpha-VLLM's ChameleonXLLMX
    code wrote it (architectures name ChameleonXLLMX..., or its config class's own `z_loss_weight` field is
    there). The folder's name plays no part (`folder` is kept for callers): a hub-cache snapshot is named by
    a hash, and a copy named "lumina-..." may hold Anole."""
    names = cfg.get("architectures")
    names = names if isinstance(names, list) else []
    return any(isinstance(a, str) and "ChameleonXLLMX" in a for a in names) or "z_loss_weight" in cfg


# transformers.LlamaConfig's defaults: what DeepSeek's Janus loader (`LlamaConfig(**language_config)`) gets for a
# field its config.json leaves out; num_key_value_heads defaults to num_attention_heads
LLAMA_DEFAULTS = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "intermediate_size": 11008,
                  "vocab_size": 32000, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}


def llama_defaults(text: dict) -> dict[str, int | float]:
    """The decoder fields a DeepSeek-layout `language_config` leaves out, with the LlamaConfig defaults
    DeepSeek's loader takes for them ({} when it names every one)."""
    out = fields_left_out(text, LLAMA_DEFAULTS)
    if text.get("num_key_value_heads") is None:  # LlamaConfig: None -> num_attention_heads
        out["num_key_value_heads"] = text.get("num_attention_heads", out.get("num_attention_heads"))
    return out


def janus_config(cfg: dict, layout: str, grid: int, max_prompt: int) -> GPTConfig:
    """Janus-Pro in transformers' layout (`text_config`, every size required) or DeepSeek's
    (`language_config`; a size it leaves out is LlamaConfig's default, as DeepSeek's loader: `llama_defaults`)."""
    if layout == "hf-janus":
        text, where, vq = section(cfg, "text_config"), "config.json text_config", section(cfg, "vq_config")
        codes, embed = vq.get("num_embeddings", 16384), vq.get("embed_dim", 8)
    else:  # DeepSeek: language_config + gen_*_config {"params": {...}}
        text, where = section(cfg, "language_config"), "config.json language_config"
        text = {**text, **llama_defaults(text)}
        head = section(cfg, "gen_head_config", "params")
        aligner = section(cfg, "gen_aligner_config", "params")
        codes, embed = head.get("image_token_size", 16384), aligner.get("input_dim", 8)
        if aligner.get("depth", 2) != 2:
            raise ConfigError("config.json gen_aligner_config.depth", "2 (every Janus-Pro release)", aligner["depth"])
    return GPTConfig(**decoder_shape(text, where),
                     vocab_size=positive(codes, "config.json image codebook size", integer=True), model_type="prompt",
                     family="janus", rope_dims=1, grid_size=grid, cls_token_num=max_prompt,
                     image_embed_dim=positive(embed, "config.json image embedding width", integer=True))


def check_deepseek_shapes(folder: Path, tensors: dict[str, torch.Tensor], config: GPTConfig,
                          defaults: dict) -> None:
    """DeepSeek-layout language-model weights against the config's sizes, before anything is built: the
    embedding (vocab_size, hidden_size), layer 0's k_proj (num_key_value_heads x head width, hidden_size)
    and gate_proj (intermediate_size, hidden_size), and the layer count. A mismatch names the tensor and the
    field, and says when the size was not in config.json but Llama's default (`defaults`)."""
    prefix = "language_model.model."
    values = {"vocab_size": config.text_vocab_size, "hidden_size": config.dim, "intermediate_size": config.ffn_dim,
              "num_key_value_heads": config.n_kv_head, "num_attention_heads": config.n_head,
              "num_hidden_layers": config.n_layer}

    def told(name: str) -> str:
        if name in defaults:
            return (f"{name} {values[name]}: config.json language_config has none, so Llama's default, as "
                    "DeepSeek's loader uses")
        return f"{name} {values[name]} from config.json language_config"

    fix = ("write the model's sizes (hidden_size, num_attention_heads, num_key_value_heads, intermediate_size, "
           "num_hidden_layers, vocab_size) into config.json language_config" if defaults else
           "config.json and the weights come from different models: download the folder again")
    rows = {"embed_tokens.weight": (config.text_vocab_size, "vocab_size"),
            "layers.0.self_attn.k_proj.weight": (config.n_kv_head * config.head_dim, "num_key_value_heads"),
            "layers.0.mlp.gate_proj.weight": (config.ffn_dim, "intermediate_size")}
    for name, (want_rows, row_field) in rows.items():
        tensor = tensors.get(prefix + name)
        if tensor is None or tensor.dim() != 2:
            continue  # absent or odd: the strict load reports it with every other key
        wrong = [f for f, found, want in ((row_field, tensor.shape[0], want_rows),
                                          ("hidden_size", tensor.shape[1], config.dim)) if found != want]
        if "num_key_value_heads" in wrong:
            wrong.append("num_attention_heads")  # the head width is hidden_size / num_attention_heads
        if wrong:
            raise CheckpointError(folder, f"{prefix}{name} of shape {(want_rows, config.dim)} ("
                                  + "; ".join(told(f) for f in wrong) + ")", f"shape {tuple(tensor.shape)}", fix)
    layers = {int(m.group(1)) for k in tensors if (m := re.match(re.escape(prefix) + r"layers\.(\d+)\.", k))}
    if layers and layers != set(range(config.n_layer)):
        raise CheckpointError(folder, f"{prefix}layers.0 .. {config.n_layer - 1} ({told('num_hidden_layers')})",
                              f"{len(layers)} layers in the weights", fix)


def _janus_grid(cfg: dict) -> int | None:
    tokens = section(cfg, "vision_config").get("num_image_tokens")
    if not tokens:
        return None
    side = positive(tokens, "config.json vision_config.num_image_tokens", integer=True)
    if round(side ** 0.5) ** 2 != side:
        raise ConfigError("config.json vision_config.num_image_tokens", "a positive square number", tokens)
    return round(side ** 0.5)


def find_file(folder: Path, names: tuple[str, ...]) -> Path | None:
    return next((folder / n for n in names if (folder / n).is_file()), None)


def load_janus_vq(folder: Path, tensors: dict[str, torch.Tensor], layout: str) -> VQModel:
    prefix = "model.vqmodel." if layout == "hf-janus" else "gen_vision_model."
    sd = {k[len(prefix):]: (v.float() if v.is_floating_point() else v)  # integer data is refused by the strict load
          for k, v in tensors.items() if k.startswith(prefix)}
    if not sd:
        raise CheckpointError(folder, f"the image tokenizer's weights ({prefix}*)", "none",
                              "the folder is incomplete: download every model-*.safetensors shard")
    if layout == "hf-janus":
        sd = taming_to_ours(sd, decoder_from_highest=False)
    return _build_vq(folder, sd, l2_norm=True)


def load_chameleon_vq(folder: Path) -> tuple[VQModel | None, str | None]:
    """Chameleon's VQGAN from the model folder (see VQGAN_NAMES), or (None, None) when it has none."""
    path = find_file(folder, VQGAN_NAMES)
    if path is None:
        return None, None
    return load_chameleon_vqgan(path), str(path)


def load_chameleon_vqgan(path: Path) -> VQModel:
    """A Chameleon VQGAN file in Meta's taming layout (`vqgan.ckpt` Lightning `state_dict`, discriminator
    `loss.*` entries dropped, or the same names in `.safetensors`), strictly."""
    raw = read_checkpoint(path)
    sd = {k: v.float() if v.is_floating_point() else v for k, v in raw.tensors.items() if not k.startswith("loss.")}
    return _build_vq(path, taming_to_ours(sd, decoder_from_highest=True), l2_norm=False)


def _build_vq(path: Path, sd: dict[str, torch.Tensor], l2_norm: bool) -> VQModel:
    try:
        config = infer_vq_config(path, sd, {}, l2_norm=l2_norm)
    except (KeyError, ConfigError) as exc:
        raise CheckpointError(path, "a complete VQ-GAN (encoder, decoder, quantize.embedding)",
                              f"an inconsistent layout ({exc})", FIX) from exc
    model = VQModel(config)
    load_state_strict(model, sd, path, FIX)
    return model.eval()


def choose_grid(folder: Path, family: str, lumina: bool, native: int, size: tuple[int, int]) -> tuple[int, int]:
    """(rows, cols) for an image of `size` (width, height) pixels: any Lumina-mGPT size in 32-pixel steps;
    for the other families only their native square (`native` codes of 16 pixels per side)."""
    if lumina:
        return lumina_grid(size)
    if size != (native * LUMINA_PATCH, native * LUMINA_PATCH):
        name = {"chameleon": "Anole / Chameleon", "janus": "Janus-Pro"}[family]
        raise ConfigError("image_size", f"{native * LUMINA_PATCH}x{native * LUMINA_PATCH}: {name} ('{folder.name}') "
                          "draws the one size its weights were trained at", format_size(size),
                          "choose auto (other sizes and aspect ratios: Lumina-mGPT)")
    return native, native


# layouts that draw many sizes: their prompt names the size, so a size is a grid and a prompt format
SIZED_LAYOUTS = {"hf-lumina": (lumina_grid, lumina_format), "hf-lumina2": (lumina2_grid, lumina2_format),
                 "emu3": (emu3_grid, emu3_format), "hf-emu3": (emu3_grid, emu3_format)}


def grid_for_size(layout: str, size: tuple[int, int]) -> tuple[int, int]:
    """(rows, cols) of an image of `size` (width, height) pixels in a layout of `SIZED_LAYOUTS`."""
    return SIZED_LAYOUTS[layout][0](size)


def format_for_grid(layout: str, rows: int, cols: int, current: PromptFormat) -> PromptFormat:
    """The prompt format that asks a `SIZED_LAYOUTS` model for a grid of `rows` x `cols` codes, keeping the
    loaded format's (`current`) BOS (Lumina-mGPT 2.0's comes from its tokenizer_config.json)."""
    return SIZED_LAYOUTS[layout][1](rows, cols, bos_token=current.bos_token)


LUMINA_IDS = {LUMINA_ROW_END: 8803, "<reserved08706>": 8710, "<racm3:break>": 8197}  # as its generator hard-codes


def check_lumina_ids(tokenizer, path: Path, grid: int, cols: int = 0) -> None:
    """Lumina's generator hard-codes token ids (end-of-row 8803, size 8804 + px / 32); we find them by name,
    so on the full 65,536-token vocabulary the names must land on those ids."""
    if tokenizer.get_vocab_size() < 65536:
        return  # a reduced vocabulary (tests): names only
    expected = dict(LUMINA_IDS)
    for side in (grid, cols or grid):  # the height's and the width's size tokens
        expected[lumina_size_token(side * 16)] = 8804 + side * 16 // 32
    for name, want in expected.items():
        found = tokenizer.token_to_id(name)
        if found != want:
            raise CheckpointError(path, f"token {name!r} at id {want} (Lumina-mGPT's generator uses that id)",
                                  f"id {found}", "use Chameleon's tokenizer (text_tokenizer.json) shipped with the "
                                  "model")


def load_prompted(folder: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                  grid_size: int | None = None, max_prompt_tokens: int = DEFAULT_MAX_PROMPT,
                  vq_dtype: torch.dtype | None = None, vqgan: str | Path | None = None,
                  image_size: tuple[int, int] | None = None, weights: str = "none") -> LoadedPrompted:
    """Load a Chameleon / Janus-Pro folder strictly: model, prompt encoder and (when present) VQ decoder
    (in `vq_dtype`, default the model's dtype). `vqgan`: a Chameleon VQGAN file to use instead of the
    folder's. `image_size` (width, height) in pixels: Lumina-mGPT draws any of its sizes
    (`image_sizes.lumina_sizes`), the other families only the one their weights were trained at; None
    keeps the default (or `grid_size` squares). `weights` "int8" / "fp8" quantizes the blocks' linear layers
    on the host after the strict load (`models/quantized.py`)."""
    scheme_named(weights)  # an unknown scheme is refused before anything is read
    folder = Path(folder)
    cfg = read_config(folder)
    family, layout = folder_layout(folder, cfg)
    if layout in EMU3_LAYOUTS.values():
        request = Emu3Request(layout, grid_size, image_size, max_prompt_tokens, vqgan)
        return load_emu3(folder, cfg, request, Placement(device, dtype, vq_dtype, weights))
    if layout == "hf-lumina2":
        request = Lumina2Request(grid_size, image_size, max_prompt_tokens, vqgan)
        return load_lumina2(folder, cfg, request, Placement(device, dtype, vq_dtype, weights))
    notes: list[str] = []
    lumina = layout == "hf-lumina"
    if lumina:
        if grid_size is not None and grid_size % 2:
            raise ConfigError("grid_size", "an even number of tokens per side for Lumina-mGPT (its size tokens "
                              "count 32-pixel steps)", grid_size)
    try:
        grid = (grid_size or (_janus_grid(cfg) if family == "janus" else None)
                or DEFAULT_GRID["lumina" if lumina else family])
    except ConfigError as exc:
        raise CheckpointError(folder / "config.json", "a consistent model configuration", str(exc), FIX) from exc
    # a size the family cannot draw is the caller's parameter, not the file's fault: its ConfigError stands
    grid, cols = (grid, grid) if image_size is None else choose_grid(folder, family, lumina, grid, image_size)
    try:
        config = (chameleon_config(cfg, grid, max_prompt_tokens, row_end=lumina, cols=cols) if family == "chameleon"
                  else janus_config(cfg, layout, grid, max_prompt_tokens))
        defaults = llama_defaults(section(cfg, "language_config")) if layout == "deepseek-janus" else {}
    except ConfigError as exc:
        raise CheckpointError(folder / "config.json", "a consistent model configuration", str(exc), FIX) from exc
    tokenizer_path = find_file(folder, TOKENIZER_NAMES)
    if tokenizer_path is None:
        raise CheckpointError(folder, f"a tokenizer file ({' or '.join(TOKENIZER_NAMES)})", "none",
                              "copy the tokenizer from the model's download into this folder")
    tokenizer = load_tokenizer(tokenizer_path)
    if defaults:
        notes.append(defaults_note("config.json language_config", defaults,
                                   "Llama's defaults, as DeepSeek's loader (transformers.LlamaConfig) does"))
    tensors, _ = read_hf_folder(folder)
    if layout == "deepseek-janus":
        check_deepseek_shapes(folder, tensors, config, defaults)
    if family == "chameleon":
        token_ids = chameleon_image_token_ids(tokenizer, config.vocab_size - int(lumina), tokenizer_path)
        if lumina:  # the end-of-row token is the last image code
            check_lumina_ids(tokenizer, tokenizer_path, grid, cols)
            row_end = torch.tensor([token_id(tokenizer, LUMINA_ROW_END, tokenizer_path)])
            token_ids = torch.cat([token_ids, row_end])
        sd = chameleon_state(folder, tensors, config, token_ids)
        vq, vq_source = (load_chameleon_vqgan(Path(vqgan)), str(vqgan)) if vqgan else load_chameleon_vq(folder)
        if vq is None:
            notes.append("no Chameleon VQGAN (vqgan.safetensors / vqgan.ckpt) in the folder: tokens only, "
                         "images cannot be decoded")
    else:
        sd = janus_state(folder, tensors, config)
        vq, vq_source = load_janus_vq(folder, tensors, layout), layout
    tensors = None
    placement = Placement(device, dtype, vq_dtype, weights)
    model = build_prompted(folder, config, sd, placement, notes, FIX)
    fmt = lumina_format(config.grid_size, config.cols) if lumina else FORMATS[family]
    encoder = PromptEncoder(tokenizer, fmt, tokenizer_path)
    return LoadedPrompted(model, config, layout, encoder, place_vq(vq, placement), vq_source, notes)
