"""Wire types of the pack: the values that travel between LANTERN nodes.

Each is a light handle (configs plus ModelPatchers or small CPU tensors), never a copy of weights.
Downstream nodes must not mutate them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from comfy_api.latest import io

from ..lantern_core.errors import ConfigError

LanternModelType = io.Custom("LANTERN_MODEL")
LanternCondType = io.Custom("LANTERN_COND")
LanternDecodingType = io.Custom("LANTERN_DECODING")
LanternTokensType = io.Custom("LANTERN_TOKENS")
LanternDrafterType = io.Custom("LANTERN_DRAFTER")


@dataclass
class LanternModel:
    """A loaded target model: GPT, VQ tokenizer and (t2i) text encoder, each in its own ModelPatcher;
    prompted families (Chameleon, Janus-Pro) carry their prompt encoder (tokenizer + template) instead."""

    name: str
    gpt: object  # comfy.model_patcher.ModelPatcher around lantern_core.LlamaGenGPT or PromptedImageLM
    vq: object  # ModelPatcher around lantern_core.VQModel
    text_encoder: object | None  # ModelPatcher around the T5 encoder, t2i only
    tokenizer: object | None
    class_names: list[str] = field(default_factory=list)
    dtype: torch.dtype = torch.float32
    neighbor_tables: dict = field(default_factory=dict, repr=False)  # k -> (V, k) table, read once per model
    prompt_encoder: object | None = None  # lantern_core.prompts.PromptEncoder, prompted families only
    layout: str = ""  # the folder's layout (lantern_core.loading.families.LoadedPrompted.source_format), prompted only

    @property
    def config(self):
        return self.gpt.model.config

    @property
    def family(self) -> str:
        """"llamagen", "chameleon" or "janus"."""
        return self.config.family

    @property
    def image_size(self) -> int:
        """The image height in pixels at the model's own size."""
        return self.config.grid_size * self.vq.model.config.downsample


def expect_link(name: str, value, kind: type, source: str, optional: bool = False) -> None:
    """A socket input must carry `kind` from the node that makes it: ComfyUI passes a constant sent through
    /prompt in its place unchecked (an optional socket may be left unconnected, None)."""
    if isinstance(value, kind) or (optional and value is None):
        return
    found = "nothing (not connected)" if value is None else f"a value of type {type(value).__name__}"
    raise ConfigError(name, f"the output of {source} linked to '{name}'", found, f"connect {source} to '{name}'")


def target_key(model: LanternModel) -> tuple:
    return (model.name, str(model.dtype), model.config)


@dataclass
class LanternCond:
    """What to draw: class labels (c2i), encoded left-padded captions (t2i) or a prompted family's
    tokenised prompt with its unconditional row (lantern_core Condition), on the CPU."""

    description: list[str]
    labels: torch.Tensor | None = None  # (B,)
    caption: torch.Tensor | None = None  # (B, T, C)
    caption_mask: torch.Tensor | None = None  # (B, T)
    prompt: object | None = None  # lantern_core.conditioning.Condition with prompt_ids, prompted families
    grid: tuple[int, int] | None = None  # (rows, cols) the prompt asks for (Lumina-mGPT's sizes); None: the model's


@dataclass
class LanternDrafter:
    """A loaded EAGLE drafter (in its own ModelPatcher) and the target it was checked against."""

    name: str
    drafter: object  # ModelPatcher around lantern_core.EagleDrafter
    target_name: str
    target_key: tuple = ()  # (name, dtype, config) of the target it was loaded for

    def fits(self, model: "LanternModel") -> bool:
        return self.target_key == target_key(model)

    @property
    def config(self):
        return self.drafter.model.config


@dataclass(frozen=True)
class LanternDecoding:
    """The decoding mode and its parameters: plain AR, or a speculative mode with its drafter and
    lantern_core.SpeculativeConfig (None for AR)."""

    mode: str = "ar"
    drafter: LanternDrafter | None = None
    spec: object | None = None  # lantern_core SpeculativeConfig (drafter modes) or JacobiConfig (sjd modes)
    tree_label: str = ""  # what the UI shows, e.g. "naive_extend_57" or "eagle2 d5 k10 n58"
    compile: str = "auto"  # "auto": replay captured CUDA graphs on a GPU (eager elsewhere); "off": always eager


@dataclass
class LanternTokens:
    """Generated token grids (CPU) plus the model that can decode them and the run's statistics."""

    tokens: torch.Tensor  # (B, N) long
    model: LanternModel
    stats: dict
    grid: tuple[int, int] | None = None  # (rows, cols) they fill when not the model's own
