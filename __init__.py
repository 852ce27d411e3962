"""ComfyUI entry point of the LANTERN node pack.

The node definitions live in `nodes/`; the plain-PyTorch library they call lives in `lantern_core/`.
"""
from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS, WEB_DIRECTORY

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
