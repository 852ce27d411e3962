"""LanternDecode: LANTERN_TOKENS -> IMAGE ([B, H, W, 3] float32 in 0..1 on the intermediate device)."""
from __future__ import annotations

import torch
from comfy_api.latest import io

from ..lantern_core.images import to_unit_range
from ..lantern_core.layout import image_codes
from ..lantern_core.models.vq import decode_images

from . import runtime
from .types import LanternTokens, LanternTokensType, expect_link


def decode(tokens: LanternTokens) -> torch.Tensor:
    """Tokens -> IMAGE, one image per VQ decoder call (`decode_images`): image i of a batch has exactly
    the pixels of a single run, and the decoder's activations stay those of one image."""
    expect_link("tokens", tokens, LanternTokens, "Lantern: Sampler")
    vq = tokens.model.vq
    with runtime.run_scope():
        device = runtime.place([vq])
        config = tokens.model.config if tokens.grid is None else tokens.model.config.with_grid(*tokens.grid)
        codes, grid = image_codes(config, tokens.tokens)  # drops Lumina's end-of-row tokens

        def finish(image: torch.Tensor) -> torch.Tensor:
            runtime.check_interrupt()
            return to_unit_range(image).to(runtime.intermediate_device())

        runtime.check_interrupt()
        return decode_images(vq.model, codes.to(device), grid, per_image=finish)


class LanternDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LanternDecode",
            display_name="Lantern: Decode",
            category="LANTERN/sampling",
            description="Turns generated tokens into images with the model's VQ tokenizer. The IMAGE output works "
                        "with every other node (Save Image, upscalers, img2img...).",
            inputs=[LanternTokensType.Input("tokens", tooltip="From Lantern: Sampler.")],
            outputs=[io.Image.Output(display_name="image", tooltip="[B, H, W, 3] images in 0..1.")],
        )

    @classmethod
    def execute(cls, tokens: LanternTokens) -> io.NodeOutput:
        return io.NodeOutput(decode(tokens))
