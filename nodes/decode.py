"""LanternDecode: LANTERN_TOKENS -> IMAGE ([B, H, W, 3] float32 in 0..1 on the intermediate device)."""
from __future__ import annotations

import torch
from comfy_api.latest import io

from ..lantern_core.images import to_unit_range
from ..lantern_core.layout import image_codes

from . import runtime
from .types import LanternTokens, LanternTokensType, expect_link

DECODE_CHUNK = 4  # images per VQ decoder call: bounds activation memory for large grids


def decode(tokens: LanternTokens) -> torch.Tensor:
    expect_link("tokens", tokens, LanternTokens, "Lantern: Sampler")
    vq = tokens.model.vq
    with runtime.run_scope():
        device = runtime.place([vq])
        images = []
        with torch.no_grad():
            for chunk in tokens.tokens.split(DECODE_CHUNK):
                runtime.check_interrupt()
                codes, grid = image_codes(tokens.model.config, chunk)  # drops Lumina's end-of-row tokens
                images.append(to_unit_range(vq.model.decode(codes.to(device), grid)).to(runtime.intermediate_device()))
    return torch.cat(images)


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
