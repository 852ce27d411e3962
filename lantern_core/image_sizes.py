"""Image sizes: which (width, height) in pixels a model family draws, and the token grid each size gives.

Lumina-mGPT draws the sizes of Alpha-VLLM's bucket list for its target size (768 for Lumina-mGPT-7B-768):
widths and heights in 32-pixel steps on the staircase of largest areas within target², aspect ratio at
most 4, as its item processor builds them; its prompt names the size, and two forced size tokens carry the
height and width in 32-pixel steps (`prompts.lumina_format`). Each 16-pixel VQ code is one token, each row
closed by an end-of-row token; Lumina-mGPT 2.0 takes the same sizes in 8-pixel MoVQGAN codes (96 x 96 at
768 px). Emu3 draws any aspect ratio at its config's `image_area` (518,400 px² for
Emu3-Gen): its processor turns a ratio w:h into rows = round(h * t / 8), cols = round(w * t / 8) with
t = sqrt(area / (w * h)) (Python's rounding, halves to even) and names the grid in the prompt; each 8-pixel
code is one token, each row closed by an end-of-line token. LlamaGen, Anole and Janus-Pro draw the one size
their weights were trained at (their grid comes from the files). This module only computes sizes; loaders and
nodes apply them.
"""
from __future__ import annotations

from .errors import ConfigError

LUMINA_STEP = 32  # pixels per size-token step
LUMINA_PATCH = 16  # pixels per VQ code (Chameleon's VQGAN)
LUMINA_MAX_RATIO = 4.0


def lumina_sizes(target: int = 768, max_ratio: float = LUMINA_MAX_RATIO) -> list[tuple[int, int]]:
    """(width, height) pixel sizes Lumina-mGPT trained on for `target`, widest first.

    Walks the boundary of {w * h <= (target / 32)^2} in 32-px steps from (all width, one step of height) down
    to one step of width: at each point it grows the height while the area allows, else narrows by a step,
    keeping every visited point whose aspect ratio is within `max_ratio`."""
    budget = (target // LUMINA_STEP) ** 2
    sizes, wide, high = [], budget, 1
    while wide > 0:
        if max(wide, high) <= max_ratio * min(wide, high):
            sizes.append((wide * LUMINA_STEP, high * LUMINA_STEP))
        if (high + 1) * wide <= budget:
            high += 1
        else:
            wide -= 1
    return sizes


def parse_size(text: str, name: str = "image_size") -> tuple[int, int]:
    """'768x512' (width x height, pixels) -> (768, 512)."""
    parts = str(text).lower().replace(" ", "").split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ConfigError(name, "a size as WIDTHxHEIGHT in pixels, e.g. 768x768", text)
    return int(parts[0]), int(parts[1])


def format_size(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def lumina_grid(size: tuple[int, int]) -> tuple[int, int]:
    """(width, height) pixels -> (rows, cols) of Lumina-mGPT's code grid, checking the 32-pixel steps."""
    width, height = size
    if width % LUMINA_STEP or height % LUMINA_STEP:
        raise ConfigError("image_size", f"a width and height in {LUMINA_STEP}-pixel steps for Lumina-mGPT (its size "
                          "tokens count them)", format_size(size), "choose one of the listed sizes")
    if max(width, height) > LUMINA_MAX_RATIO * min(width, height):
        raise ConfigError("image_size", f"an aspect ratio of at most {LUMINA_MAX_RATIO:g}:1 for Lumina-mGPT",
                          format_size(size), "choose one of the listed sizes")
    return height // LUMINA_PATCH, width // LUMINA_PATCH


EMU3_PATCH = 8  # pixels per code of Emu3's vision tokenizer (its spatial scale factor)
EMU3_AREA = 518400  # Emu3-Gen's image_area (720 x 720)
EMU3_RATIOS = ((1, 1), (4, 3), (3, 4), (3, 2), (2, 3), (16, 9), (9, 16), (21, 9), (9, 21))
EMU3_MAX_RATIO = 4.0


def emu3_ratio_grid(ratio: tuple[int, int], area: int = EMU3_AREA) -> tuple[int, int]:
    """(rows, cols) Emu3's processor gives an aspect ratio (w, h) at `area` pixels."""
    w, h = ratio
    scale = (area / (w * h)) ** 0.5
    return int(round(h * scale / EMU3_PATCH)), int(round(w * scale / EMU3_PATCH))


def emu3_sizes(area: int = EMU3_AREA) -> list[tuple[int, int]]:
    """(width, height) pixel sizes of the common aspect ratios at `area`, square first."""
    return [(cols * EMU3_PATCH, rows * EMU3_PATCH) for rows, cols in (emu3_ratio_grid(r, area) for r in EMU3_RATIOS)]


def emu3_grid(size: tuple[int, int]) -> tuple[int, int]:
    """(width, height) pixels -> (rows, cols) of Emu3's code grid, checking the 8-pixel steps."""
    width, height = size
    if width % EMU3_PATCH or height % EMU3_PATCH:
        raise ConfigError("image_size", f"a width and height in {EMU3_PATCH}-pixel steps for Emu3 (one code per "
                          f"{EMU3_PATCH} pixels)", format_size(size), "choose one of the listed sizes")
    if max(width, height) > EMU3_MAX_RATIO * min(width, height):
        raise ConfigError("image_size", f"an aspect ratio of at most {EMU3_MAX_RATIO:g}:1 for Emu3",
                          format_size(size), "choose one of the listed sizes")
    return height // EMU3_PATCH, width // EMU3_PATCH


LUMINA2_PATCH = 8  # pixels per MoVQGAN code (Lumina-mGPT 2.0): a 32-pixel size step is 4 codes


def lumina2_grid(size: tuple[int, int]) -> tuple[int, int]:
    """(width, height) pixels -> (rows, cols) of Lumina-mGPT 2.0's 8-pixel codes: the same 32-pixel steps and
    aspect ratios as Lumina-mGPT (its size tokens), four codes a step."""
    rows, cols = lumina_grid(size)
    scale = LUMINA_PATCH // LUMINA2_PATCH
    return rows * scale, cols * scale
