"""Loading an Emu3 folder (Emu3-Gen) offline, in both layouts users download.

- Original (`BAAI/Emu3-Gen`, remote-code `Emu3ForCausalLM`): config.json with model_type "Emu3", the decoder's
  sizes at its top level and the special token ids; weights `model.embed_tokens`, `model.layers.N.*`,
  `model.norm`, `lm_head`; text tokenizer `emu3.tiktoken` + `emu3_vision_tokens.txt`, numbered as its
  tokenizer numbers them (the rank table, then `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, `<|extra_0|>` ..
  `<|extra_204|>` and the vision file's tokens) and encoded by `tiktoken_bpe.py`; the image tokenizer is the
  separate `BAAI/Emu3-VisionTokenizer` folder, found inside the model folder (`VISION_TOKENIZER_DIRS`) or given
  as `vqgan`.
- transformers' (`BAAI/Emu3-Gen-hf`, `Emu3ForConditionalGeneration`): config.json with model_type "emu3",
  `text_config`, `vq_config`, `vocabulary_map`; weights `text_model.model.*`, `text_model.lm_head.weight` and
  `vqmodel.*` as published (`model.text_model.*`, `lm_head.weight`, `model.vqmodel.*` as transformers saves
  them today); `tokenizer.json`.

transformers writes only the fields that differ from its config class's defaults, so a size a config leaves
out takes that default (`EMU3_DEFAULTS`: the values of transformers' `Emu3TextConfig` and of the original
`Emu3Config`, the same), and the load notes name each one. The special ids the config names are checked
against the tokenizer's. The trunk is the Chameleon family's (`models/prompted.py`: image codes are vocabulary
tokens, Llama layers; no QK-norm here); image code `c` is `<|visual token {c:06d}|>` and the last image code
is the end-of-line token `<|extra_200|>`, forced after every row (`layout.py`), exactly where Emu3's own
prefix-constrained generation allows only it. Weight renaming reuses `family_io.chameleon_state`; building the
model is `prompted_build.build_prompted`. Nothing is downloaded; no remote code runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import GPTConfig
from ..errors import CheckpointError, ConfigError
from ..image_sizes import EMU3_AREA, emu3_grid, emu3_ratio_grid
from ..prompts import EMU3_SPECIAL, PromptEncoder, emu3_format, emu3_visual_token, load_tokenizer
from ..tiktoken_bpe import TiktokenBPE, read_ranks
from .checkpoints import read_hf_folder
from .family_io import chameleon_state
from .prompted_build import (LoadedPrompted, Placement, build_prompted, decoder_shape, defaults_note,
                             fields_left_out, place_vq, scales_rope)

FIX = ("choose the Emu3 folder as downloaded: BAAI/Emu3-Gen-hf (config.json, tokenizer.json, model-*.safetensors) "
       "or BAAI/Emu3-Gen (config.json, emu3.tiktoken, emu3_vision_tokens.txt, model-*.safetensors) with "
       "BAAI/Emu3-VisionTokenizer in its vision_tokenizer/ subfolder")
# transformers' Emu3TextConfig defaults = the original Emu3Config's: what a config.json that leaves a field out means
EMU3_DEFAULTS = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "vocab_size": 184622, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0}
SPECIAL_IDS = {"bos_token_id": "bos", "eos_token_id": "eos", "pad_token_id": "pad", "img_token_id": "img",
               "boi_token_id": "boi", "eoi_token_id": "eoi", "eol_token_id": "eol", "eof_token_id": "eof"}
TIKTOKEN_HEAD = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *(f"<|extra_{i}|>" for i in range(205)))
VISION_TOKENIZER_DIRS = ("vision_tokenizer", "Emu3-VisionTokenizer", "vq")
HF_RENAMES = (("model.text_model.", "model."), ("text_model.model.", "model."), ("text_model.lm_head.", "lm_head."))
VQ_PREFIXES = ("model.vqmodel.", "vqmodel.")


@dataclass(frozen=True)
class Emu3Request:
    """What the caller asks of an Emu3 load: the layout ("emu3" or "hf-emu3", from `families.detect_family`),
    a grid (`grid_size` rows of as many codes; None: the config's image area at 1:1) or an `image_size`
    (width, height) in pixels, the longest prompt in tokens, and a vision-tokenizer path to use instead of the
    folder's (original layout)."""

    layout: str
    grid_size: int | None = None
    image_size: tuple[int, int] | None = None
    max_prompt_tokens: int = 256
    vqgan: str | Path | None = None


def text_section(cfg: dict, layout: str) -> tuple[dict, str]:
    """The decoder's config fields and where they are, for error messages."""
    if layout == "hf-emu3":
        text = cfg.get("text_config", {})
        if not isinstance(text, dict):
            raise ConfigError("config.json text_config", "a JSON object", type(text).__name__)
        return text, "config.json text_config"
    return cfg, "config.json"


def check_rope(text: dict, where: str) -> None:
    """Plain RoPE only: no scaling (Emu3-Gen has none; the original config writes `rope_scaling: null`, newer
    transformers write `{"rope_type": "default"}`, which means the same)."""
    scaling, params = text.get("rope_scaling"), text.get("rope_parameters")
    if scales_rope(scaling) or scales_rope(params):
        raise ConfigError(f"{where}.rope_scaling / rope_parameters",
                          "no RoPE scaling (as Emu3-Gen; absent, null or {\"rope_type\": \"default\"})",
                          scaling if scales_rope(scaling) else params)


def emu3_config(cfg: dict, layout: str, grid: tuple[int, int], max_prompt: int, codes: int) -> tuple[GPTConfig, dict]:
    """The trunk's `GPTConfig` (image codes + the end-of-line code) and the defaults taken for absent fields."""
    text, where = text_section(cfg, layout)
    check_rope(text, where)
    defaults = fields_left_out(text, EMU3_DEFAULTS)
    filled = {**text, **defaults}
    if filled.get("num_key_value_heads") is None:  # both classes: None means one key/value head per head
        filled["num_key_value_heads"] = filled["num_attention_heads"]
    if filled.get("tie_word_embeddings"):
        raise ConfigError(f"{where}.tie_word_embeddings", "false (Emu3 has its own output head)", True)
    shape = decoder_shape(filled, where)
    rows, cols = grid
    return GPTConfig(**shape, vocab_size=codes + 1, model_type="prompt", family="chameleon", qk_norm=False,
                     rope_dims=1, grid_size=rows, grid_cols=0 if cols == rows else cols, cls_token_num=max_prompt,
                     row_end=True), defaults


def choose_emu3_grid(cfg: dict, request: Emu3Request) -> tuple[int, int]:
    """(rows, cols): the asked image size, else `grid_size` squares, else 1:1 at the config's image area."""
    if request.image_size is not None:
        return emu3_grid(request.image_size)
    if request.grid_size is not None:
        return request.grid_size, request.grid_size
    area = cfg.get("image_area", EMU3_AREA)
    if isinstance(area, bool) or not isinstance(area, int) or area < 64:
        raise ConfigError("config.json image_area", "the image area in pixels (518400 for Emu3-Gen)", area)
    return emu3_ratio_grid((1, 1), area)


def read_emu3_tokenizer(folder: Path, layout: str):
    """(tokenizer, path): tokenizer.json (transformers' layout, or any folder that has one), else the original
    emu3.tiktoken with emu3_vision_tokens.txt."""
    if (folder / "tokenizer.json").is_file():
        return load_tokenizer(folder / "tokenizer.json"), folder / "tokenizer.json"
    ranks_path, vision_path = folder / "emu3.tiktoken", folder / "emu3_vision_tokens.txt"
    if not (ranks_path.is_file() and vision_path.is_file()):
        wanted = "tokenizer.json" if layout == "hf-emu3" else "emu3.tiktoken and emu3_vision_tokens.txt"
        raise CheckpointError(folder, f"Emu3's text tokenizer ({wanted})", "none",
                              "copy the tokenizer files from the model's download into this folder")
    ranks = read_ranks(ranks_path)
    try:
        vision = [line.strip() for line in vision_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(vision_path, "Emu3's vision token names, one per line", f"an unreadable file ({exc})",
                              "download emu3_vision_tokens.txt again") from exc
    start = max(ranks.values()) + 1  # the special tokens follow the rank table (151,643 in Emu3's)
    special = {name: start + i for i, name in enumerate((*TIKTOKEN_HEAD, *vision))}
    return TiktokenBPE(ranks, special), ranks_path


def check_special_ids(tokenizer, text: dict, path: Path) -> None:
    """Every special id config.json names (bos, eos, pad, image markers, end of line / frame) is the tokenizer's
    id for that token: the tokenizer and the weights come from the same release."""
    for field, role in SPECIAL_IDS.items():
        want = text.get(field)
        if want is None:
            continue
        found = tokenizer.token_to_id(EMU3_SPECIAL[role])
        if found != want:
            raise CheckpointError(path, f"{EMU3_SPECIAL[role]!r} at id {want} (config.json {field})", f"id {found}",
                                  "use the tokenizer files shipped with these weights")


def emu3_token_ids(tokenizer, path: Path) -> torch.Tensor:
    """Vocabulary ids (codes + 1,): `<|visual token c|>` for c = 0, 1, ... while the vocabulary has it (32,768 in
    Emu3's), then the end-of-line token."""
    ids = []
    while (index := tokenizer.token_to_id(emu3_visual_token(len(ids)))) is not None:
        ids.append(index)
    eol = tokenizer.token_to_id(EMU3_SPECIAL["eol"])
    if not ids or eol is None:
        raise CheckpointError(path, f"visual tokens from {emu3_visual_token(0)!r} and the end-of-line token "
                              f"{EMU3_SPECIAL['eol']!r}", f"{len(ids)} visual tokens" + (", no end-of-line token"
                                                                                       if eol is None else ""),
                              "use the tokenizer files shipped with these weights")
    return torch.tensor(ids + [eol], dtype=torch.long)


def split_emu3_tensors(tensors: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """(language-model tensors under the original names, vision-tokenizer tensors) of either layout."""
    lm, vq = {}, {}
    for key, value in tensors.items():
        if key.startswith(VQ_PREFIXES):
            vq[key] = value
            continue
        for old, new in HF_RENAMES:
            if key.startswith(old):
                key = new + key[len(old):]
                break
        lm[key] = value
    return lm, vq


def find_vision_tokenizer(folder: Path, given: str | Path | None) -> Path | None:
    if given is not None:
        return Path(given)
    return next((folder / d for d in VISION_TOKENIZER_DIRS if (folder / d / "config.json").is_file()), None)


def emu3_vq(folder: Path, cfg: dict, vq_tensors: dict, request: Emu3Request, notes: list[str]):
    """(MoVQModel or None, source): the tokenizer inside a transformers checkpoint, else the vision-tokenizer
    folder (original layout, or `request.vqgan`)."""
    from .movq_io import load_emu3_vision_tokenizer, load_emu3_vq

    if vq_tensors and request.vqgan is None:
        vq_cfg = cfg.get("vq_config") or {}
        if not isinstance(vq_cfg, dict):
            raise CheckpointError(folder / "config.json", "vq_config as a JSON object", type(vq_cfg).__name__, FIX)
        floats = {k: v.float() if v.is_floating_point() else v for k, v in vq_tensors.items()}
        return load_emu3_vq(floats, vq_cfg, folder), request.layout
    path = find_vision_tokenizer(folder, request.vqgan)
    if path is None:
        notes.append("no Emu3 vision tokenizer (BAAI/Emu3-VisionTokenizer in a vision_tokenizer/ subfolder): "
                     "tokens only, images cannot be decoded")
        return None, None
    return load_emu3_vision_tokenizer(path), str(path)


def load_emu3(folder: Path, cfg: dict, request: Emu3Request, placement: Placement) -> LoadedPrompted:
    """Load an Emu3 folder strictly (see the module docstring) -> `LoadedPrompted`."""
    notes: list[str] = []
    grid = choose_emu3_grid(cfg, request)
    tokenizer, tokenizer_path = read_emu3_tokenizer(folder, request.layout)
    token_ids = emu3_token_ids(tokenizer, tokenizer_path)
    codes = len(token_ids) - 1
    try:
        config, defaults = emu3_config(cfg, request.layout, grid, request.max_prompt_tokens, codes)
    except ConfigError as exc:
        raise CheckpointError(folder / "config.json", "a consistent Emu3 configuration", str(exc), FIX) from exc
    text, where = text_section(cfg, request.layout)
    if defaults:
        notes.append(defaults_note(where, defaults, "Emu3's defaults, as transformers' loader does"))
    check_special_ids(tokenizer, {**cfg, **text}, tokenizer_path)
    tensors, _ = read_hf_folder(folder)
    lm, vq_tensors = split_emu3_tensors(tensors)
    tensors = None
    if request.layout == "emu3" and vq_tensors:
        raise CheckpointError(folder, "the original Emu3 layout (model.*, lm_head.*)", "vqmodel.* tensors beside it",
                              FIX)
    sd = chameleon_state(folder, lm, config, token_ids)
    lm = None
    vq, vq_source = emu3_vq(folder, cfg, vq_tensors, request, notes)
    if vq is not None and vq.config.codebook_size != codes:
        raise CheckpointError(vq_source, f"a codebook of {codes} codes (the tokenizer's visual tokens)",
                              f"{vq.config.codebook_size}", "use the vision tokenizer released with these weights")
    model = build_prompted(folder, config, sd, placement, notes, FIX)
    encoder = PromptEncoder(tokenizer, emu3_format(*config.grid_shape), tokenizer_path)
    return LoadedPrompted(model, config, request.layout, encoder, place_vq(vq, placement), vq_source, notes)
