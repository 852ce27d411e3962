"""ComfyUI glue for lantern_core (V3 schema nodes, registered through `comfy_entrypoint`).

Each node converts inputs, places models through ComfyUI's model management (`runtime.py`), makes one
lantern_core call and converts the result back. Imports `comfy_api.latest`, which exists in ComfyUI
0.3.75 and later releases.
"""
from __future__ import annotations

from comfy_api.latest import ComfyExtension, io

from . import paths

WEB_DIRECTORY = "./web"


class LanternExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        from .conditioning import LanternConditioning
        from .decode import LanternDecode
        from .decoding import LanternDecodingConfig
        from .drafters import LanternDrafterLoader
        from .generate import LanternGenerate
        from .loaders import LanternModelLoader
        from .sampler import LanternSampler

        return [LanternModelLoader, LanternDrafterLoader, LanternConditioning, LanternDecodingConfig,
                LanternSampler, LanternDecode, LanternGenerate]


async def comfy_entrypoint() -> LanternExtension:
    paths.register_folders()
    from . import routes  # noqa: F401  (registers /lantern/status)

    return LanternExtension()
