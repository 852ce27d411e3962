"""Pixel conversions between VQ outputs ([-1, 1], channels first) and saved images; no model code."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def to_unit_range(images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) in about [-1, 1] -> (B, H, W, 3) float32 in [0, 1] (ComfyUI's IMAGE layout)."""
    return ((images.float().clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1).contiguous()


def save_png(images_hwc: torch.Tensor, paths: list[Path]) -> None:
    """(B, H, W, 3) in [0, 1] -> one PNG per sample."""
    from PIL import Image

    arrays = (images_hwc.cpu().numpy() * 255.0).round().clip(0, 255).astype(np.uint8)
    for array, path in zip(arrays, paths):
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(array).save(path)
