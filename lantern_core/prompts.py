"""Prompt formats of the prompted families and the encoder that turns text into a `Condition`.

Each family's reference generator wraps the prompt in a template, appends the special token(s) that
start an image, and builds its classifier-free-guidance (unconditional) input its own way:

- Janus-Pro (DeepSeek's `generation_inference.py`): "<|User|>: {prompt}\\n\\n<|Assistant|>:" + "<begin_of_image>",
  BOS first; the unconditional row is the same sequence with every token but the first (BOS) and the
  last (<begin_of_image>) replaced by the pad token.
- Chameleon / Anole (LANTERN's Anole generator): BOS + prompt + "<reserved08706>" (end of turn) +
  "<racm3:break>" (image start); the unconditional row is BOS + "<racm3:break>" alone.
- Emu3 (BAAI's `image_generation.py` with its processor): BOS "<|extra_203|>" + prompt + " masterpiece, film
  grained, best quality." (the positive suffix its example adds) + "<|image start|>" + the grid as text
  "{rows}*{cols}" + "<|image token|>"; the unconditional row is the same with its default negative prompt
  (`EMU3_NEGATIVE`) instead of the prompt and suffix.
- Lumina-mGPT (its FlexAR generator): BOS + "Generate an image of {W}x{H} according to the following
  prompt:\n{prompt}" + "<reserved08706>", then the image start and the two size tokens the reference
  forces (id 8804 + pixels / 32, named "<reserved{08800 + pixels / 32}>"); the unconditional row is the
  image start and size tokens alone, without BOS (its image-start-triggered CFG).

Tokenisation uses the model's own `tokenizer.json` through the `tokenizers` library (no transformers, no
remote code, no downloads), or a tiktoken rank file (Emu3's original `emu3.tiktoken`, `tiktoken_bpe.py`).
Image codes <-> vocabulary ids for Chameleon come from the tokenizer's IMGIMG names
(`chameleon_image_token_ids`), for Emu3 from its `<|visual token NNNNNN|>` names. This module does not know about
models or weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .conditioning import Condition, left_pad
from .errors import CheckpointError, ConfigError

CHAMELEON_IMAGE_PREFIX = "IMGIMG"
_LETTER_DIGITS = {chr(ord("A") + i): str(i) for i in range(10)}  # IMGIMG names spell digits as A..J


@dataclass(frozen=True)
class PlainText:
    """A suffix entry tokenised as text (Emu3's "{rows}*{cols}"), not looked up as one special token."""

    text: str


UNCOND_KINDS = ("pad_inner", "bos_suffix", "suffix", "negative")


@dataclass(frozen=True)
class PromptFormat:
    """How a family wraps a prompt: BOS + `template` around {prompt} + `suffix` (special tokens by name, or
    `PlainText`; it ends with the image-start token), and the unconditional row: "pad_inner" (the same
    tokens, all but the first and last replaced by `pad_token`), "bos_suffix" (BOS + `uncond_suffix`),
    "suffix" (`uncond_suffix` alone) or "negative" (BOS + the `negative` prompt + `suffix`). BOS is added
    explicitly (not by the tokenizer's post-processor, whose presence varies between exports)."""

    template: str
    suffix: tuple[str | PlainText, ...]
    uncond: str
    bos_token: str
    uncond_suffix: tuple[str, ...] = ()
    pad_token: str | None = None
    negative: str = ""
    quality: str = ""  # text the family's recipe appends to every prompt (Emu3's positive suffix), optional

    def __post_init__(self) -> None:
        if "{prompt}" not in self.template:
            raise ConfigError("PromptFormat.template", "a string containing {prompt}", self.template)
        if self.uncond not in UNCOND_KINDS:
            raise ConfigError("PromptFormat.uncond", f"one of {UNCOND_KINDS}", self.uncond)
        if self.uncond == "pad_inner" and not self.pad_token:
            raise ConfigError("PromptFormat.pad_token", "the pad token for 'pad_inner' CFG", self.pad_token)
        if self.uncond == "negative" and not self.negative:
            raise ConfigError("PromptFormat.negative", "the negative prompt for 'negative' CFG", self.negative)


JANUS_FORMAT = PromptFormat(template="<|User|>: {prompt}\n\n<|Assistant|>:", suffix=("<begin_of_image>",),
                            uncond="pad_inner", bos_token="<｜begin▁of▁sentence｜>", pad_token="<｜▁pad▁｜>")
CHAMELEON_FORMAT = PromptFormat(template="{prompt}", suffix=("<reserved08706>", "<racm3:break>"),
                                uncond="bos_suffix", bos_token="<s>", uncond_suffix=("<racm3:break>",))
FORMATS = {"janus": JANUS_FORMAT, "chameleon": CHAMELEON_FORMAT}
LUMINA_ROW_END = "<reserved08799>"  # id 8803: ends every image row


def lumina_size_token(pixels: int) -> str:
    """The size token Lumina-mGPT forces after the image start: id 8804 + pixels / 32."""
    return f"<reserved{8800 + pixels // 32:05d}>"


def lumina_format(grid: int, cols: int = 0, patch: int = 16, bos_token: str = "<s>") -> PromptFormat:
    """Lumina-mGPT's prompt for an image of `grid` rows of `cols` (default: grid) `patch`-pixel tokens (768 px
    square: grid 48; Lumina-mGPT 2.0's 8-pixel codes: grid 96, its own `bos_token`): the text names the size as
    width x height, then the image start and the height's and the width's size tokens (32-pixel steps), as
    Alpha-VLLM's item processor lays an image out."""
    height, width = grid * patch, (cols or grid) * patch
    sizes = (lumina_size_token(height), lumina_size_token(width))
    template = f"Generate an image of {width}x{height} according to the following prompt:\n" + "{prompt}"
    return PromptFormat(template=template, suffix=("<reserved08706>", "<racm3:break>", *sizes),
                        uncond="suffix", bos_token=bos_token, uncond_suffix=("<racm3:break>", *sizes))


EMU3_POSITIVE = " masterpiece, film grained, best quality."
EMU3_NEGATIVE = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, "
                 "worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, username, blurry.")
EMU3_SPECIAL = {"bos": "<|extra_203|>", "eos": "<|extra_204|>", "pad": "<|endoftext|>", "img": "<|image token|>",
                "boi": "<|image start|>", "eoi": "<|image end|>", "eol": "<|extra_200|>", "eof": "<|extra_201|>"}


def emu3_visual_token(code: int) -> str:
    """The vocabulary name of Emu3's image code `code`."""
    return f"<|visual token {code:06d}|>"


def emu3_format(rows: int, cols: int, bos_token: str = EMU3_SPECIAL["bos"]) -> PromptFormat:
    """Emu3's generation prompt for a grid of `rows` x `cols` codes (8 pixels each)."""
    suffix = (EMU3_SPECIAL["boi"], PlainText(f"{rows}*{cols}"), EMU3_SPECIAL["img"])
    return PromptFormat(template="{prompt}", suffix=suffix, uncond="negative", bos_token=bos_token,
                        negative=EMU3_NEGATIVE, quality=EMU3_POSITIVE)


def load_tokenizer(path: str | Path):
    """A `tokenizers.Tokenizer` from tokenizer.json; a clear error when missing or unreadable."""
    from tokenizers import Tokenizer  # the tokenizers wheel comes with transformers; imported lazily

    path = Path(path)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
        raise CheckpointError(path, "the model's tokenizer.json", f"a missing or unreadable file ({exc})",
                              "copy tokenizer.json from the model's download into this folder") from exc


def token_id(tokenizer, token: str, path: str | Path) -> int:
    index = tokenizer.token_to_id(token)
    if index is None:
        raise CheckpointError(path, f"the special token {token!r} in the tokenizer", "no such token",
                              "use the tokenizer.json that ships with these weights")
    return index


def chameleon_image_token_ids(tokenizer, codebook_size: int, path: str | Path = "tokenizer.json") -> torch.Tensor:
    """Vocabulary id of every image code 0..V-1, from the IMGIMG<digits as letters>Z token names."""
    ids = torch.full((codebook_size,), -1, dtype=torch.long)
    for name, index in tokenizer.get_vocab(with_added_tokens=True).items():
        if name.startswith(CHAMELEON_IMAGE_PREFIX):
            digits = "".join(_LETTER_DIGITS.get(c, c) for c in name[len(CHAMELEON_IMAGE_PREFIX):-1])
            if digits.isdigit() and int(digits) < codebook_size:
                ids[int(digits)] = index
    missing = int((ids < 0).sum())
    if missing:
        raise CheckpointError(path, f"{codebook_size} IMGIMG image tokens in the vocabulary",
                              f"{codebook_size - missing}", "use the Chameleon/Anole/Lumina-mGPT tokenizer.json")
    return ids


class PromptEncoder:
    """Text prompts -> a left-padded `Condition` with the family's unconditional rows."""

    def __init__(self, tokenizer, fmt: PromptFormat, source: str | Path = "tokenizer.json"):
        self.tokenizer = tokenizer
        self.source = source
        self.format = fmt
        self.suffix = [i for t in fmt.suffix for i in self._suffix_ids(t)]
        self.uncond_suffix = [token_id(tokenizer, t, source) for t in fmt.uncond_suffix]
        self.bos_id = token_id(tokenizer, fmt.bos_token, source)
        self.pad_id = token_id(tokenizer, fmt.pad_token, source) if fmt.pad_token else 0
        self.negative = self._text_ids(fmt.negative) if fmt.negative else []

    def _text_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _suffix_ids(self, entry: str | PlainText) -> list[int]:
        if isinstance(entry, PlainText):
            return self._text_ids(entry.text)
        return [token_id(self.tokenizer, entry, self.source)]

    def with_format(self, fmt: PromptFormat) -> "PromptEncoder":
        """The same tokenizer with another template (Lumina-mGPT's prompt for another image size)."""
        return PromptEncoder(self.tokenizer, fmt, self.source)

    def with_quality(self, prompt: str, quality: bool = True) -> str:
        """The prompt with the family's quality text appended (`PromptFormat.quality`: Emu3's " masterpiece, film
        grained, best quality.", as BAAI's recipe does), unless `quality` is off or the prompt already ends
        with it (typed by the user: never twice)."""
        extra = self.format.quality
        if not quality or not extra or prompt.rstrip().endswith(extra.strip()):
            return prompt
        return prompt + extra

    def token_ids(self, prompt: str, quality: bool = True) -> list[int]:
        """BOS + templated text (with the quality text, `with_quality`) + the suffix (ending with the
        image-start token)."""
        text = self.format.template.format(prompt=self.with_quality(prompt, quality))
        return [self.bos_id] + self._text_ids(text) + self.suffix

    def uncond_ids(self, ids: list[int]) -> list[int]:
        if self.format.uncond == "pad_inner":
            return ids[:1] + [self.pad_id] * (len(ids) - 2) + ids[-1:]
        if self.format.uncond == "suffix":
            return list(self.uncond_suffix)
        if self.format.uncond == "negative":
            return [self.bos_id] + self.negative + self.suffix
        return [self.bos_id] + self.uncond_suffix

    def encode(self, prompts: list[str], device=None, quality: bool = True) -> Condition:
        if not prompts:
            raise ConfigError("prompts", "at least one prompt", prompts)
        cond = [self.token_ids(p, quality) for p in prompts]
        uncond = [self.uncond_ids(ids) for ids in cond]
        ids, mask = _pad_left(cond, device)
        u_ids, u_mask = _pad_left(uncond, device)
        return Condition(prompt_ids=ids, prompt_mask=mask, uncond_ids=u_ids, uncond_mask=u_mask)


def _pad_left(rows: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(r) for r in rows)
    padded = [left_pad(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.bool), T) for r in rows]
    return torch.cat([p[0] for p in padded]).to(device), torch.cat([p[1] for p in padded]).to(device)
