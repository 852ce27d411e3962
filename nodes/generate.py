"""LanternGenerate: the one-node convenience for simple graphs (model + class/prompt -> IMAGE + stats)."""
from __future__ import annotations

from comfy_api.latest import io

from .conditioning import condition_inputs, encode
from .decode import decode
from .sampler import sample, sampling_config, sampling_inputs, stats_text
from .types import LanternDecodingType, LanternModel, LanternModelType


class LanternGenerate(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LanternGenerate",
            display_name="Lantern: Generate Image",
            category="LANTERN",
            description="Conditioning, sampling and decoding in one node, for simple graphs. Same results as "
                        "Lantern: Conditioning -> Sampler -> Decode with the same settings.",
            inputs=[
                LanternModelType.Input("model", tooltip="From Lantern: Load Model."),
                *condition_inputs(),
                LanternDecodingType.Input("decoding", optional=True,
                                          tooltip="From Lantern: Decoding Config; plain AR when not connected."),
                *sampling_inputs(),
            ],
            outputs=[io.Image.Output(display_name="image", tooltip="[B, H, W, 3] images in 0..1."),
                     io.String.Output(display_name="stats", tooltip="One line of run statistics.")],
        )

    @classmethod
    def execute(cls, model: LanternModel, class_name: str, prompt: str, cfg: float, temperature: float,
                top_k: int, top_p: float, seed: int, batch_size: int, decoding=None) -> io.NodeOutput:
        sampling = sampling_config(cfg, temperature, top_k, top_p)
        tokens, payload = sample(model, encode(model, class_name, prompt), decoding, sampling, seed, batch_size)
        return io.NodeOutput(decode(tokens), stats_text(payload), ui={"lantern_stats": [payload]})
