"""LanternDecodingConfig: the decoding mode and its parameters -> LANTERN_DECODING."""
from __future__ import annotations

from comfy_api.latest import io

from .types import LanternDecoding, LanternDecodingType

MODES = {
    "ar": "plain autoregressive decoding: one forward pass per image token (the reference the fast modes match)",
}


class LanternDecodingConfig(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LanternDecodingConfig",
            display_name="Lantern: Decoding Config",
            category="LANTERN/sampling",
            description="Chooses how tokens are decoded. " + "; ".join(f"{k}: {v}" for k, v in MODES.items()) + ".",
            inputs=[
                io.Combo.Input("mode", options=list(MODES), default="ar",
                               tooltip="; ".join(f"{k}: {v}" for k, v in MODES.items())),
            ],
            outputs=[LanternDecodingType.Output(display_name="decoding", tooltip="Feed into Lantern: Sampler.")],
        )

    @classmethod
    def execute(cls, mode: str) -> io.NodeOutput:
        return io.NodeOutput(LanternDecoding(mode=mode))
