"""LanternConditioning: class names/indices (c2i) or a prompt (t2i: Flan-T5 features; Chameleon and
Janus-Pro: the model's tokenizer and template) -> LANTERN_COND."""
from __future__ import annotations

import torch
from comfy_api.latest import io

from ..lantern_core.errors import ConfigError, LanternError
from ..lantern_core.image_sizes import emu3_sizes, format_size, lumina_sizes, parse_size

from . import runtime
from .types import LanternCond, LanternCondType, LanternModel, LanternModelType, expect_link

MAX_CLASSES = 64  # entries per node: each becomes batch_size images
AUTO = "auto"
# Lumina-mGPT-7B-768's buckets, then Emu3-Gen's aspect ratios at its 720 x 720 area; the others: auto
SIZES = [AUTO, *dict.fromkeys(format_size(size) for size in [*lumina_sizes(768), *emu3_sizes()])]


def native_size(model: LanternModel) -> str:
    rows, cols = model.config.grid_shape
    step = model.vq.model.config.downsample
    return format_size((cols * step, rows * step))


def choose_grid(model: LanternModel, image_size: str) -> tuple[int, int] | None:
    """The (rows, cols) token grid for `image_size` ('WxH' pixels), None for the model's own. Lumina-mGPT
    and Emu3 draw many sizes; every other model only the size its weights were trained at."""
    from ..lantern_core.loading.families import SIZED_LAYOUTS, grid_for_size

    if image_size == AUTO or image_size == native_size(model):
        return None
    size = parse_size(image_size)
    if model.layout not in SIZED_LAYOUTS:
        raise ConfigError("image_size", f"auto or {native_size(model)}: '{model.name}' draws the one size its "
                          "weights were trained at", image_size, "choose auto (other sizes and aspect ratios: "
                          "Lumina-mGPT, Emu3)")
    grid = grid_for_size(model.layout, size)
    return None if grid == model.config.grid_shape else grid


def class_labels(model: LanternModel, text: str) -> tuple[list[int], list[str]]:
    """'cat, 3' -> label indices and their names; errors list the valid classes."""
    names = model.class_names
    labels, described = [], []
    items = [t.strip() for t in text.split(",") if t.strip()]
    if len(items) > MAX_CLASSES:
        raise ConfigError("class_name", f"at most {MAX_CLASSES} comma-separated classes", f"{len(items)} classes",
                          "use fewer entries (batch_size repeats each one)")
    for item in items:
        if item.isascii() and item.removeprefix("-").isdigit() and len(item) <= 18:
            index = int(item)
            if not 0 <= index < model.config.num_classes:
                raise ConfigError("class_name", f"an index in 0..{model.config.num_classes - 1} or a name", item)
        else:
            lowered = [n.lower() for n in names]
            if item.lower() not in lowered:
                raise ConfigError("class_name", f"one of {names} or an index 0..{model.config.num_classes - 1}",
                                  item[:80])
            index = lowered.index(item.lower())
        labels.append(index)
        described.append(names[index] if index < len(names) else f"class {index}")
    if not labels:
        raise ConfigError("class_name", "at least one class name or index", text[:80])
    return labels, described


def encode(model: LanternModel, class_text: str, prompt: str, image_size: str = AUTO,
           quality_suffix: bool = True) -> LanternCond:
    expect_link("model", model, LanternModel, "Lantern: Load Model")
    grid = choose_grid(model, image_size)
    if grid is not None:  # only Lumina-mGPT and Emu3 get here: their prompts name the size
        return encode_prompt(model, prompt, grid, quality_suffix)
    if model.config.model_type == "c2i":
        labels, described = class_labels(model, class_text)
        return LanternCond(described, labels=torch.tensor(labels, dtype=torch.long))
    if not prompt.strip():
        raise LanternError(f"'{model.name}' is a text-to-image model: write a prompt")
    if model.config.model_type == "prompt":
        return encode_prompt(model, prompt, quality=quality_suffix)
    runtime.place([model.text_encoder])
    from ..lantern_core.text_encoder import T5CaptionEncoder

    encoder = T5CaptionEncoder.from_parts(model.tokenizer, model.text_encoder.model.inner,
                                          max_tokens=model.config.cls_token_num)
    with torch.no_grad():
        cond = encoder.encode([prompt])
    return LanternCond([prompt], caption=cond.caption.cpu(), caption_mask=cond.caption_mask.cpu())


def encode_prompt(model: LanternModel, prompt: str, grid: tuple[int, int] | None = None,
                  quality: bool = True) -> LanternCond:
    """Prompted families: the model's own tokenizer and template, with its unconditional (CFG) row;
    `grid` (rows, cols): the template for that size (Lumina-mGPT, Emu3) instead of the loaded one; `quality`:
    the family's quality text after the prompt (Emu3's positive suffix; `PromptEncoder.with_quality`)."""
    from ..lantern_core.loading.families import format_for_grid

    if not prompt.strip():
        raise LanternError(f"'{model.name}' is a text-to-image model: write a prompt")
    encoder = (model.prompt_encoder if grid is None
               else model.prompt_encoder.with_format(format_for_grid(model.layout, *grid, model.prompt_encoder.format)))
    condition = encoder.encode([prompt], quality=quality)
    limit = model.config.cls_token_num
    if condition.prompt_ids.shape[1] > limit:
        raise ConfigError("prompt", f"at most {limit} tokens with the {model.family} template",
                          f"{condition.prompt_ids.shape[1]} tokens", "shorten the prompt")
    return LanternCond([prompt], prompt=condition, grid=grid)


def condition_inputs() -> list:
    """The class/prompt widgets, shared with the one-node generator."""
    return [
        io.String.Input("class_name", default="0",
                        tooltip="c2i models: class name or index, e.g. 'cat' or '207'; several separated "
                                "by commas make a batch. Ignored by t2i models."),
        io.String.Input("prompt", default="", multiline=True,
                        tooltip="Text-to-image models (LlamaGen t2i, Anole, Janus-Pro): the prompt. Ignored by "
                                "class-conditional models."),
    ]


class LanternConditioning(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LanternConditioning",
            display_name="Lantern: Conditioning",
            category="LANTERN/conditioning",
            description="What to draw. Class-conditional models take class names or indices (comma-separated "
                        "for several images); text-to-image models take the prompt. Lumina-mGPT and Emu3 also "
                        "take an image size and aspect ratio.",
            inputs=[
                LanternModelType.Input("model", tooltip="From Lantern: Load Model."),
                *condition_inputs(),
                io.Combo.Input("image_size", options=SIZES, default=AUTO,
                               tooltip="Width x height in pixels. Lumina-mGPT draws its trained buckets (32-pixel "
                                       "steps), Emu3 any aspect ratio in 8-pixel steps (its 720 x 720 area at 1:1, "
                                       "4:3, 3:2, 16:9, 21:9 and their portraits are listed); 'auto' is each "
                                       "model's own size (LlamaGen, Anole and Janus-Pro draw only that one)."),
                io.Boolean.Input("quality_suffix", default=True,
                                 tooltip="Emu3: append BAAI's positive suffix ' masterpiece, film grained, best "
                                         "quality.' to the prompt, as BAAI's recipe does (never twice: a prompt that "
                                         "already ends with it is left as it is). Other models ignore it."),
            ],
            outputs=[LanternCondType.Output(display_name="conditioning", tooltip="Feed into Lantern: Sampler.")],
        )

    @classmethod
    def execute(cls, model: LanternModel, class_name: str, prompt: str, image_size: str = AUTO,
                quality_suffix: bool = True) -> io.NodeOutput:
        return io.NodeOutput(encode(model, class_name, prompt, image_size, quality_suffix))
