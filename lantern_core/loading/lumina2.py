"""Loading Lumina-mGPT 2.0 (`Alpha-VLLM/Lumina-mGPT-2.0`) offline, with its MoVQGAN image tokenizer.

The release is a Chameleon-layout folder (config.json with model_type "chameleon", written by Alpha-VLLM's
ChameleonXLLMX training code, so `families.is_lumina` holds; `model.layers.N.self_attn.{q,k,v,o}_proj`,
`q_norm` / `k_norm` of shape (model_parallel_size, head_dim) repeated over the heads, Llama MLP, `lm_head`;
rotate-half RoPE; tokenizer.json + tokenizer_config.json). It differs from Lumina-mGPT 1 in its image tokens:
16,384 MoVQGAN codes at vocabulary ids `code + 155000` (its item processor's arithmetic; the config's
`vocabulary_map` names them `<MOVQGAN...>`, which is how a 2.0 folder is told from a 1.0 one,
`is_lumina2`), image start `<racm3:break>` (151665), end of row `<reserved08799>` (151670) and end of image
`<eoss>` (151666), and in its 8-pixel codes: the size tokens `<reserved{8800 + n}>` still count 32-pixel
steps, each step 4 codes (768 px = 96 x 96 codes, each row closed by the end-of-row token).

Prompt (its generate.py): BOS (tokenizer_config.json's `bos_token`, its EOS when that is null, as its
tokenizer wrapper does) + "Generate an image of {W}x{H} according to the following prompt:\\n{prompt}" +
"<reserved08706>", then the image start and the height's and width's size tokens, which we force (its
generator samples them, and the maintainers report wrong sizes that way); the unconditional row is the image
start and size tokens alone (its image-start-triggered CFG). A field config.json leaves out takes
transformers' ChameleonConfig default (`CHAMELEON_DEFAULTS`), as its loader does; the notes name each one.
The decoder's config is `chameleon_config`'s, as for 1.0. The ids the official code hard-codes are checked
on a full-size vocabulary. MoVQGAN's `movqgan_270M.ckpt`
(a flat state dict) is read with `torch.load(weights_only=True)` from the folder (`MOVQGAN_NAMES`) or the given
path. Nothing is downloaded; no remote code runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CheckpointError, ConfigError
from ..image_sizes import lumina2_grid
from ..prompts import LUMINA_ROW_END, PromptEncoder, load_tokenizer, lumina_format, token_id
from .checkpoint_io import read_checkpoint, read_json_object
from .checkpoints import read_hf_folder
from .family_io import chameleon_state
from .prompted_build import (CHAMELEON_DEFAULTS, LoadedPrompted, Placement, build_prompted, chameleon_config,
                             defaults_note, fields_left_out, place_vq)

FIX = ("choose the Lumina-mGPT-2.0 folder as downloaded from Alpha-VLLM/Lumina-mGPT-2.0 (config.json, tokenizer.json, "
       "tokenizer_config.json, model-*.safetensors), with movqgan_270M.ckpt from ai-forever/MoVQGAN in it")
MOVQGAN_PREFIX = "<MOVQGAN"  # how its vocabulary_map names image tokens (its `get_image_tokens`)
CODE_OFFSET, CODES = 155000, 16384  # vocabulary id of image code c: c + 155000 (its item processor)
OFFICIAL_IDS = {"<racm3:break>": 151665, "<eoss>": 151666, LUMINA_ROW_END: 151670}  # as its generator hard-codes
MOVQGAN_NAMES = ("movqgan_270M.ckpt", "movqgan/270M/movqgan_270M.ckpt", "movqgan_270M.safetensors",
                 "movqgan/movqgan_270M.ckpt")
PATCH = 8  # pixels per MoVQGAN code


@dataclass(frozen=True)
class Lumina2Request:
    """What the caller asks: a grid (`grid_size` rows of as many codes; None: 768 px) or an `image_size` (width,
    height) in pixels, the longest prompt in tokens, and a MoVQGAN file to use instead of the folder's."""

    grid_size: int | None = None
    image_size: tuple[int, int] | None = None
    max_prompt_tokens: int = 256
    movqgan: str | Path | None = None


def image_names(cfg: dict) -> dict[str, int]:
    """config.json's `vocabulary_map` entries naming MoVQGAN image tokens ({} when there is none)."""
    vocab = cfg.get("vocabulary_map")
    if not isinstance(vocab, dict):
        return {}
    return {k: v for k, v in vocab.items() if isinstance(k, str) and k.startswith(MOVQGAN_PREFIX)}


def is_lumina2(cfg: dict) -> bool:
    """A Lumina-mGPT (ChameleonXLLMX) config whose vocabulary names MoVQGAN image tokens: 2.0, not 1.0."""
    return bool(image_names(cfg))


def image_token_ids(cfg: dict, tokenizer, path: Path) -> torch.Tensor:
    """Vocabulary ids (codes + 1,): image code c at the first MoVQGAN id + c (the ids are one contiguous block,
    155,000 .. 171,383 in the release, as its `code + 155000` assumes), then the end-of-row token."""
    ids = sorted(v for v in image_names(cfg).values() if isinstance(v, int) and not isinstance(v, bool))
    if not ids or ids != list(range(ids[0], ids[0] + len(ids))):
        raise CheckpointError(path, "MoVQGAN image tokens as one contiguous block of vocabulary ids",
                              f"{len(ids)} ids" + (f" from {ids[0]} to {ids[-1]}" if ids else ""), FIX)
    full = tokenizer.get_vocab_size() > CODE_OFFSET
    if full and (ids[0], len(ids)) != (CODE_OFFSET, CODES):
        raise CheckpointError(path, f"{CODES} image tokens from id {CODE_OFFSET} (Lumina-mGPT 2.0's generator adds "
                              f"{CODE_OFFSET} to a code)", f"{len(ids)} from id {ids[0]}", FIX)
    row_end = token_id(tokenizer, LUMINA_ROW_END, path)
    return torch.tensor(ids + [row_end], dtype=torch.long)


def check_official_ids(tokenizer, path: Path) -> None:
    """On the full vocabulary the special tokens sit where the official generator hard-codes them."""
    if tokenizer.get_vocab_size() <= CODE_OFFSET:
        return  # a reduced vocabulary (tests): names only
    for name, want in OFFICIAL_IDS.items():
        found = tokenizer.token_to_id(name)
        if found != want:
            raise CheckpointError(path, f"token {name!r} at id {want} (Lumina-mGPT 2.0's generator uses that id)",
                                  f"id {found}", "use the tokenizer.json shipped with the model")


def bos_token(folder: Path) -> str:
    """tokenizer_config.json's BOS, or its EOS when the BOS is null (the official tokenizer wrapper's rule)."""
    cfg = read_json_object(folder / "tokenizer_config.json", FIX)
    for field in ("bos_token", "eos_token"):
        value = cfg.get(field)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str) and value:
            return value
    raise CheckpointError(folder / "tokenizer_config.json", "a bos_token or eos_token", "neither", FIX)


def lumina2_format(rows: int, cols: int, bos_token: str):
    """Lumina-mGPT 2.0's prompt for `rows` x `cols` codes of 8 pixels."""
    return lumina_format(rows, cols, patch=PATCH, bos_token=bos_token)


def choose_lumina2_grid(request: Lumina2Request) -> tuple[int, int]:
    if request.image_size is not None:
        return lumina2_grid(request.image_size)
    if request.grid_size is not None:
        if request.grid_size % 4:
            raise ConfigError("grid_size", "a multiple of 4 codes per side for Lumina-mGPT 2.0 (its size tokens count "
                              "32-pixel steps of 4 codes)", request.grid_size)
        return request.grid_size, request.grid_size
    return lumina2_grid((768, 768))


def load_movqgan_file(path: Path):
    from .movq_io import load_movqgan

    raw = read_checkpoint(path)
    tensors = {k: v.float() if v.is_floating_point() else v for k, v in raw.tensors.items()}
    return load_movqgan(tensors, path)


def find_movqgan(folder: Path, given: str | Path | None) -> Path | None:
    if given is not None:
        return Path(given)
    return next((folder / n for n in MOVQGAN_NAMES if (folder / n).is_file()), None)


def load_lumina2(folder: Path, cfg: dict, request: Lumina2Request, placement: Placement) -> LoadedPrompted:
    """Load a Lumina-mGPT 2.0 folder strictly (see the module docstring)."""
    notes: list[str] = []
    grid = choose_lumina2_grid(request)
    tokenizer_path = folder / "tokenizer.json"
    tokenizer = load_tokenizer(tokenizer_path)
    check_official_ids(tokenizer, tokenizer_path)
    token_ids = image_token_ids(cfg, tokenizer, folder / "config.json")
    defaults = fields_left_out(cfg, CHAMELEON_DEFAULTS)
    try:
        config = chameleon_config({**cfg, **defaults}, grid[0], request.max_prompt_tokens, row_end=True,
                                  cols=grid[1], codes=len(token_ids) - 1)
    except ConfigError as exc:
        raise CheckpointError(folder / "config.json", "a consistent Lumina-mGPT 2.0 configuration", str(exc),
                              FIX) from exc
    if defaults:
        notes.append(defaults_note("config.json", defaults, "ChameleonConfig's defaults, as Lumina-mGPT 2.0's "
                                   "loader does"))
    if int(token_ids.max()) >= config.text_vocab_size:
        raise CheckpointError(folder / "config.json", f"a vocab_size above the image token ids (> "
                              f"{int(token_ids.max())})", f"vocab_size {config.text_vocab_size}", FIX)
    tensors, _ = read_hf_folder(folder)
    sd = chameleon_state(folder, tensors, config, token_ids)
    tensors = None
    path = find_movqgan(folder, request.movqgan)
    vq = None
    if path is None:
        notes.append("no MoVQGAN (movqgan_270M.ckpt from ai-forever/MoVQGAN) in the folder: tokens only, images "
                     "cannot be decoded")
    else:
        vq = load_movqgan_file(path)
        if vq.config.codebook_size != config.vocab_size - 1:
            raise CheckpointError(path, f"a codebook of {config.vocab_size - 1} codes (the model's image tokens)",
                                  f"{vq.config.codebook_size}", "choose movqgan_270M.ckpt from ai-forever/MoVQGAN")
    model = build_prompted(folder, config, sd, placement, notes, FIX)
    encoder = PromptEncoder(tokenizer, lumina2_format(*config.grid_shape, bos_token(folder)), tokenizer_path)
    return LoadedPrompted(model, config, "hf-lumina2", encoder, place_vq(vq, placement),
                          None if path is None else str(path), notes)
