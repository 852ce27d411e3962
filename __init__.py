"""ComfyUI entry point of the LANTERN node pack: nodes live in `nodes/`, the library in `lantern_core/`.

Outside ComfyUI (no `comfy_api` to import, e.g. when a test runner imports this folder as a package)
the folder stays a plain package and registers nothing.
"""
import importlib.util

if importlib.util.find_spec("comfy_api") is not None:
    from .nodes import WEB_DIRECTORY, comfy_entrypoint

    __all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]
