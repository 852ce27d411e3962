"""LanternDrafterLoader: an EAGLE / LANTERN drafter for a loaded target -> LANTERN_DRAFTER."""
from __future__ import annotations

from comfy_api.latest import io

from . import paths, runtime
from .types import LanternDrafterType, LanternModel, LanternModelType, expect_link


class LanternDrafterLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LanternDrafterLoader",
            display_name="Lantern: Load Drafter",
            category="LANTERN/loaders",
            description="Loads the EAGLE-style drafter that proposes tokens for speculative decoding, checked "
                        "against the target model (family, hidden size, vocabulary, grid). Released LANTERN drafters "
                        "(a folder with config.json + pytorch_model.bin, e.g. jadohu/llamagen_drafter, "
                        "jadohu/anole_drafter for Anole-7b) or our "
                        "own (config.json + model.safetensors) go in models/lantern/drafters; the embedded "
                        "model's drafter ships with the pack.",
            inputs=[
                LanternModelType.Input("model", tooltip="The target model the drafter must fit."),
                io.Combo.Input("drafter", options=paths.list_drafters(), default=paths.EMBEDDED,
                               tooltip="Drafter folder or file in models/lantern/drafters. Train your own with "
                                       "python -m lantern_core.training.train_drafter."),
            ],
            outputs=[LanternDrafterType.Output(display_name="drafter", tooltip="Feed into Lantern: Decoding Config.")],
        )

    @classmethod
    def validate_inputs(cls, drafter: str | None = None, model=None) -> bool | str:
        from ..lantern_core.errors import LanternError

        if drafter is None:  # linked (or left out): checked when it runs
            return True
        try:
            paths.resolve("lantern_drafters", drafter)
        except LanternError as exc:
            return str(exc)
        return True

    @classmethod
    def execute(cls, model: LanternModel, drafter: str) -> io.NodeOutput:
        from ..lantern_core.errors import LanternError

        expect_link("model", model, LanternModel, "Lantern: Load Model")
        if drafter == paths.EMBEDDED and model.name != paths.EMBEDDED:
            raise LanternError(f"the embedded drafter only fits the embedded model, not '{model.name}': put the "
                               "drafter trained for it in models/lantern/drafters and choose it")
        path = paths.resolve("lantern_drafters", drafter)
        try:
            return io.NodeOutput(runtime.load_drafter(path, model, drafter))
        except LanternError as exc:  # e.g. config.json or the weights missing from the downloaded folder
            paths.add_download_hint(exc, "lantern_drafters", drafter)
            raise
