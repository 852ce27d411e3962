"""Configuration dataclasses: GPT architecture (with the published LlamaGen presets), VQ tokenizer
architecture, and sampling knobs.

Architecture configs describe shapes only (no training-only fields); they are frozen and validated.
This module does not build modules or read files.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Literal

from .errors import ConfigError

ModelType = Literal["c2i", "t2i", "prompt"]
Family = Literal["llamagen", "chameleon", "janus"]
FAMILIES: tuple[str, ...] = ("llamagen", "chameleon", "janus")
KV_CACHE_FORMATS = ("auto", "int8")  # "auto": keys and values in the model's dtype


def find_multiple(n: int, k: int) -> int:
    """Smallest multiple of k that is >= n."""
    return n if n % k == 0 else n + k - (n % k)


def llamagen_ffn_dim(dim: int, multiple_of: int = 256) -> int:
    """LlamaGen's SwiGLU width: int(2 * 4 * dim / 3) rounded up to a multiple of `multiple_of`."""
    return find_multiple(int(2 * 4 * dim / 3), multiple_of)


def check_grid_cols(owner: str, grid_cols: int, grid_size: int, rope_dims: int) -> None:
    """`grid_cols` is 0 (square) or a positive width; a width other than the rows needs 1-D RoPE."""
    if isinstance(grid_cols, bool) or not isinstance(grid_cols, int) or grid_cols < 0:
        raise ConfigError(f"{owner}.grid_cols", "0 (a square grid) or the codes per row", grid_cols)
    if grid_cols and grid_cols != grid_size and rope_dims == 2:
        raise ConfigError(f"{owner}.grid_cols", f"{grid_size} (a square grid): 2-D RoPE models (LlamaGen) draw the "
                          "square grid they were trained on", grid_cols)


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a decoder-only image transformer on the shared block / KV-cache machinery.

    `grid_size` is the number of token rows the model generates, the side of a square grid (16 for 256 px
    with VQ-16); `grid_cols` the codes per row of a grid that is not square (0: square; Lumina-mGPT's
    aspect ratios: 1-D RoPE only, LlamaGen's 2-D RoPE table is square);
    `vocab_size` is the number of image codes the model samples from (the VQ codebook).
    `cls_token_num` is the conditioning prefix length (1 for c2i, 120 for t2i) or, for prompted
    families (`model_type="prompt"`: Chameleon/Anole/Lumina-mGPT, Janus-Pro), the longest prompt in
    tokens the RoPE table and memory estimates are sized for.

    Family knobs: `qk_norm` (Chameleon's per-head LayerNorm on q and k), `swin_norm` (norms after the
    sub-layers), `rope_dims` (2 = LlamaGen's 2-D grid RoPE with a zero prefix, 1 = 1-D RoPE over cache
    slots), `text_vocab_size` (the language model's vocabulary, prompt tokens), `image_embed_dim` (Janus:
    the codebook embedding width; its aligner and generation head are `dim` wide), `row_end` (Lumina-mGPT:
    every image row of `cols` codes is followed by a forced end-of-row token, image code
    `vocab_size - 1`, so an image is rows * (cols + 1) tokens; see `layout.py`). `kv_cache` is how a run stores
    keys and values: "auto" in the model's dtype, "int8" with per-entry scales (`models/kv_cache.py`: about half
    the memory, a slightly different law); the weights' shapes do not depend on it.
    """

    dim: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int | None = None
    ffn_dim: int | None = None
    vocab_size: int = 16384
    model_type: ModelType = "c2i"
    num_classes: int = 1000
    caption_dim: int = 2048
    cls_token_num: int = 1
    grid_size: int = 16
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    family: Family = "llamagen"
    text_vocab_size: int = 0
    qk_norm: bool = False
    swin_norm: bool = False
    rope_dims: int = 2
    image_embed_dim: int = 0
    row_end: bool = False
    grid_cols: int = 0
    kv_cache: str = "auto"

    def __post_init__(self) -> None:
        if self.kv_cache not in KV_CACHE_FORMATS:
            raise ConfigError("GPTConfig.kv_cache", f"one of {KV_CACHE_FORMATS}", self.kv_cache)
        if self.n_kv_head is None:
            object.__setattr__(self, "n_kv_head", self.n_head)
        check_grid_cols("GPTConfig", self.grid_cols, self.grid_size, self.rope_dims)
        if self.row_end and (self.family != "chameleon" or self.rope_dims != 1):
            raise ConfigError("GPTConfig.row_end", "only for Chameleon-family models with 1-D RoPE (Lumina-mGPT)",
                              f"family {self.family!r}, rope_dims {self.rope_dims}")
        if self.ffn_dim is None:
            object.__setattr__(self, "ffn_dim", llamagen_ffn_dim(self.dim))
        for name in ("dim", "n_layer", "n_head", "vocab_size", "cls_token_num", "grid_size", "ffn_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"GPTConfig.{name}", "a positive integer", value)
        if self.model_type not in ("c2i", "t2i", "prompt"):
            raise ConfigError("GPTConfig.model_type", "'c2i', 't2i' or 'prompt'", self.model_type)
        if self.family not in FAMILIES:
            raise ConfigError("GPTConfig.family", f"one of {FAMILIES}", self.family)
        if (self.family == "llamagen") == (self.model_type == "prompt"):
            raise ConfigError("GPTConfig.model_type", "'c2i'/'t2i' for LlamaGen, 'prompt' for Chameleon and "
                              "Janus", f"{self.model_type!r} with family {self.family!r}")
        if self.dim % self.n_head:
            raise ConfigError("GPTConfig.n_head", f"a divisor of dim={self.dim}", self.n_head)
        if self.n_head % self.n_kv_head:
            raise ConfigError("GPTConfig.n_kv_head", f"a divisor of n_head={self.n_head}", self.n_kv_head)
        if self.rope_dims not in (1, 2):
            raise ConfigError("GPTConfig.rope_dims", "1 or 2", self.rope_dims)
        if self.head_dim % (2 * self.rope_dims):
            raise ConfigError("GPTConfig.n_head", f"dim / n_head divisible by {2 * self.rope_dims} "
                              f"({self.rope_dims}-D RoPE)", self.head_dim)
        if self.model_type == "c2i" and self.num_classes <= 0:
            raise ConfigError("GPTConfig.num_classes", "a positive integer for c2i", self.num_classes)
        if self.model_type == "prompt" and self.text_vocab_size <= 0:
            raise ConfigError("GPTConfig.text_vocab_size", "the language model's vocabulary size (> 0)",
                              self.text_vocab_size)
        if self.family == "janus" and self.image_embed_dim <= 0:
            raise ConfigError("GPTConfig.image_embed_dim", "the codebook-embedding width (> 0) for Janus",
                              self.image_embed_dim)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def cols(self) -> int:
        """Codes per image row (grid_size for a square grid)."""
        return self.grid_cols or self.grid_size

    @property
    def grid_shape(self) -> tuple[int, int]:
        """(rows, cols) of the code grid, as the VQ decoder takes it."""
        return self.grid_size, self.cols

    @property
    def row_stride(self) -> int:
        """Tokens per image row: the codes, plus the end-of-row token when `row_end`."""
        return self.cols + int(self.row_end)

    @property
    def num_image_tokens(self) -> int:
        return self.grid_size * self.row_stride

    @property
    def num_image_codes(self) -> int:
        """VQ codes of one image (the tokens without the end-of-row tokens)."""
        return self.grid_size * self.cols

    @property
    def max_seq_len(self) -> int:
        """Prefix plus every image token (the last one is never fed back, but caches keep the slot)."""
        return self.cls_token_num + self.num_image_tokens

    def to_dict(self) -> dict:
        return asdict(self)

    def with_grid(self, grid_size: int, grid_cols: int = 0) -> "GPTConfig":
        """This shape drawing `grid_size` rows of `grid_cols` codes (0: a square grid)."""
        return replace(self, grid_size=grid_size, grid_cols=0 if grid_cols == grid_size else grid_cols)


# Published LlamaGen sizes (autoregressive/models/gpt.py): name -> (n_layer, n_head, dim).
GPT_PRESETS: dict[str, tuple[int, int, int]] = {
    "GPT-B": (12, 12, 768),
    "GPT-L": (24, 16, 1024),
    "GPT-XL": (36, 20, 1280),
    "GPT-XXL": (48, 24, 1536),
    "GPT-XXXL": (48, 40, 2560),
    "GPT-1B": (22, 32, 2048),
    "GPT-3B": (24, 32, 3200),
    "GPT-7B": (32, 32, 4096),
}

# dim -> n_head for every published size, used to infer heads from weights (head_dim is not stored).
HEADS_BY_DIM: dict[int, int] = {dim: heads for (_, heads, dim) in GPT_PRESETS.values()}


def gpt_preset(name: str, model_type: ModelType = "c2i", image_size: int = 256,
               downsample: int = 16, **overrides) -> GPTConfig:
    """A published LlamaGen config, e.g. gpt_preset("GPT-XL", "t2i", 512)."""
    if name not in GPT_PRESETS:
        raise ConfigError("preset", f"one of {sorted(GPT_PRESETS)}", name)
    n_layer, n_head, dim = GPT_PRESETS[name]
    base = dict(
        dim=dim, n_layer=n_layer, n_head=n_head, model_type=model_type,
        cls_token_num=1 if model_type == "c2i" else 120, grid_size=image_size // downsample,
    )
    base.update(overrides)
    return GPTConfig(**base)


@dataclass(frozen=True)
class VQConfig:
    """Shape of a VQ-GAN tokenizer: LlamaGen's VQ-16 / VQ-8 (also Janus-Pro's image tokenizer) and the
    taming-style Chameleon VQGAN (`codebook_l2_norm=False`, `level_attention=False`: attention only in
    the middle block). `level_attention` puts attention after every block of the lowest-resolution
    level of the encoder and decoder (LlamaGen's layout)."""

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    codebook_show_usage: bool = True
    ch: int = 128
    encoder_ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    decoder_ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    z_channels: int = 256
    num_res_blocks: int = 2
    level_attention: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "encoder_ch_mult", tuple(self.encoder_ch_mult))
        object.__setattr__(self, "decoder_ch_mult", tuple(self.decoder_ch_mult))
        for name in ("codebook_size", "codebook_embed_dim", "ch", "z_channels", "num_res_blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"VQConfig.{name}", "a positive integer", value)
        if len(self.encoder_ch_mult) != len(self.decoder_ch_mult):
            raise ConfigError("VQConfig.decoder_ch_mult", "as many levels as encoder_ch_mult",
                              self.decoder_ch_mult)
        if self.ch % 32 or self.z_channels % 32:
            raise ConfigError("VQConfig.ch", "a multiple of 32 (GroupNorm with 32 groups)", self.ch)

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.encoder_ch_mult) - 1)

    def to_dict(self) -> dict:
        return asdict(self)


VQ_PRESETS: dict[str, VQConfig] = {
    "VQ-16": VQConfig(),
    "VQ-8": VQConfig(encoder_ch_mult=(1, 2, 2, 4), decoder_ch_mult=(1, 2, 2, 4)),
    # Chameleon's VQGAN (Anole, Lumina-mGPT): 8192 x 256 codes, f16, no level attention (vqgan.yaml)
    "chameleon": VQConfig(codebook_size=8192, codebook_embed_dim=256, codebook_l2_norm=False,
                          codebook_show_usage=False, level_attention=False),
}


@dataclass(frozen=True)
class SamplingConfig:
    """How one image is sampled. temperature 0 means greedy (argmax); top_k 0 / top_p 1.0 disable filters.

    `cfg_interval` < 0 keeps guidance on for every token; otherwise, as in LlamaGen's sampler, image
    tokens 0 .. cfg_interval + 1 are guided and later ones use the conditional logits alone.
    """

    cfg_scale: float = 4.0
    cfg_interval: int = -1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.cfg_scale) or self.cfg_scale < 0:
            raise ConfigError("cfg_scale", "a finite number >= 0 (1.0 disables guidance)", self.cfg_scale)
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ConfigError("temperature", "a finite number >= 0 (0 = greedy)", self.temperature)
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError("top_k", "an integer >= 0 (0 disables top-k)", self.top_k)
        if not (0.0 < self.top_p <= 1.0):
            raise ConfigError("top_p", "a number in (0, 1] (1.0 disables top-p)", self.top_p)
        if not isinstance(self.cfg_interval, int):
            raise ConfigError("cfg_interval", "an integer (-1 = always)", self.cfg_interval)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_cfg(self) -> bool:
        return self.cfg_scale != 1.0

    def cfg_active(self, step: int) -> bool:
        """Whether guidance applies when sampling image token number `step` (0-based)."""
        return self.uses_cfg and (self.cfg_interval < 0 or step <= self.cfg_interval + 1)


PREFIX_STATES = ("native", "hf_port")


@dataclass(frozen=True)
class DrafterConfig:
    """Shape of an EAGLE-style one-layer feature drafter (LANTERN's `cnets_llamagen` / `cnets_anole`).

    `cls_token_num` is the drafter's own prefix length, one less than the target's (119 for t2i, 0 for
    c2i): drafter position s pairs the target feature f_s with token x_{s+1}, so the token gets the same
    grid coordinate it has in the target. `family` is the target's; a LlamaGen drafter's layer has no
    input norm and 2-D RoPE, a Chameleon / Janus drafter is one full decoder layer of its target's kind
    (`input_norm`, Chameleon's `qk_norm`, 1-D RoPE: `rope_dims`).

    `prefix_states` is the prefix convention the drafter was trained with (see
    `decoding/trees/prefix_states.py`): "native" (LlamaGen's semantics: a left-padded caption row attends only
    to itself, and the drafter masks padded keys; our trained drafters, LANTERN's Anole drafter) or
    "hf_port" (LANTERN's HF port of LlamaGen-T2I, which its released t2i drafters were trained on: a
    padded row attends uniformly over the whole prefill, and the drafter masks no prefix key).

    `embed_scale` multiplies the token embeddings before `fc` (LANTERN's `embed_upscale`, a constructor
    argument of its Lumina-mGPT drafter, applied only above 1.0; 1.0 in its released run).
    """

    dim: int = 1280
    n_head: int = 20
    n_kv_head: int | None = None
    ffn_dim: int = 3584
    vocab_size: int = 16384
    grid_size: int = 16
    cls_token_num: int = 119
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    bias: bool = True
    family: Family = "llamagen"
    input_norm: bool = False
    qk_norm: bool = False
    rope_dims: int = 2
    prefix_states: str = "native"
    embed_scale: float = 1.0
    grid_cols: int = 0

    def __post_init__(self) -> None:
        if self.n_kv_head is None:
            object.__setattr__(self, "n_kv_head", self.n_head)
        check_grid_cols("DrafterConfig", self.grid_cols, self.grid_size, self.rope_dims)
        if isinstance(self.embed_scale, bool) or not isinstance(self.embed_scale, (int, float)) \
                or not 1.0 <= self.embed_scale < float("inf"):
            raise ConfigError("DrafterConfig.embed_scale", "a finite number >= 1.0 (LANTERN's embed_upscale, "
                              "applied only above 1.0)", self.embed_scale)
        if self.prefix_states not in PREFIX_STATES:
            raise ConfigError("DrafterConfig.prefix_states", f"one of {PREFIX_STATES}", self.prefix_states,
                              "write \"native\" for drafters trained here, \"hf_port\" for LANTERN's released "
                              "LlamaGen-T2I drafters")
        if self.family not in FAMILIES:
            raise ConfigError("DrafterConfig.family", f"one of {FAMILIES}", self.family)
        if self.rope_dims not in (1, 2):
            raise ConfigError("DrafterConfig.rope_dims", "1 or 2", self.rope_dims)
        for name in ("dim", "n_head", "n_kv_head", "ffn_dim", "vocab_size", "grid_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"DrafterConfig.{name}", "a positive integer", value)
        if not isinstance(self.cls_token_num, int) or self.cls_token_num < 0:
            raise ConfigError("DrafterConfig.cls_token_num", "an integer >= 0", self.cls_token_num)
        if self.dim % self.n_head or (self.dim // self.n_head) % 4:
            raise ConfigError("DrafterConfig.n_head", f"a divisor of dim={self.dim} leaving a head size "
                              "divisible by 4", self.n_head)

    @classmethod
    def for_target(cls, target: GPTConfig, ffn_dim: int | None = None) -> "DrafterConfig":
        """The drafter LANTERN pairs with `target`: same width, heads, vocab and grid, prefix one shorter."""
        prompted = target.model_type == "prompt"
        return cls(dim=target.dim, n_head=target.n_head, n_kv_head=target.n_kv_head,
                   ffn_dim=ffn_dim or target.ffn_dim, vocab_size=target.vocab_size, grid_size=target.grid_size,
                   grid_cols=target.grid_cols, cls_token_num=target.cls_token_num - 1, rope_base=target.rope_base,
                   norm_eps=target.norm_eps if prompted else 1e-6, family=target.family, input_norm=prompted,
                   qk_norm=target.qk_norm, rope_dims=target.rope_dims)

    def block_config(self) -> GPTConfig:
        """The shared decoder-block shape (one layer of the target's kind)."""
        return GPTConfig(dim=self.dim, n_layer=1, n_head=self.n_head, n_kv_head=self.n_kv_head,
                         ffn_dim=self.ffn_dim, vocab_size=self.vocab_size, grid_size=self.grid_size,
                         rope_base=self.rope_base, norm_eps=self.norm_eps, qk_norm=self.qk_norm)

    def mismatches(self, target: GPTConfig) -> list[str]:
        """What keeps this drafter from serving `target` (empty when it fits)."""
        problems = []
        for name, mine, theirs in (("model family", self.family, target.family),
                                   ("QK-norm", self.qk_norm, target.qk_norm),
                                   ("hidden size", self.dim, target.dim),
                                   ("vocabulary", self.vocab_size, target.vocab_size),
                                   ("token grid", "{}x{}".format(*self.grid_shape), "{}x{}".format(*target.grid_shape)),
                                   # 2-D RoPE ties grid coordinates to the prefix length; 1-D is relative
                                   ("prefix length + 1", self.cls_token_num + 1,
                                    target.cls_token_num if self.rope_dims == 2 else self.cls_token_num + 1)):
            if mine != theirs:
                problems.append(f"{name} {mine} (target: {theirs})")
        return problems

    @property
    def grid_shape(self) -> tuple[int, int]:
        return self.grid_size, self.grid_cols or self.grid_size

    def to_dict(self) -> dict:
        return asdict(self)
