"""The embedded default model that ships inside the pack (`assets/default/`): a tiny class-conditional
LlamaGen-architecture GPT, its VQ tokenizer, its EAGLE drafter (`drafter/`, released layout) and the
photo classifier used to score samples.

See `assets/default/MODEL_CARD.md` for data, training command and measured quality. This module only
locates and loads those files; `train_embedded.py` creates them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoints import LoadedGPT, LoadedVQ, load_gpt, load_vq
from .drafter_io import LoadedDrafter, load_drafter

EMBEDDED_DIR = Path(__file__).resolve().parent.parent / "assets" / "default"
EMBEDDED_GPT = EMBEDDED_DIR / "gpt.safetensors"
EMBEDDED_VQ = EMBEDDED_DIR / "vq.safetensors"
EMBEDDED_CLASSIFIER = EMBEDDED_DIR / "classifier.safetensors"
EMBEDDED_DRAFTER = EMBEDDED_DIR / "drafter"
EMBEDDED_NAME = "lantern-tiny-photos (embedded)"


@dataclass
class Pipeline:
    """A GPT with the VQ tokenizer that decodes its tokens."""

    gpt: LoadedGPT
    vq: LoadedVQ
    drafter: LoadedDrafter | None = None

    @property
    def image_size(self) -> int:
        return self.gpt.config.grid_size * self.vq.config.downsample

    def class_index(self, name_or_index: str | int) -> int:
        """A class given by index or (case-insensitive) name -> index, with a helpful error."""
        from ..errors import ConfigError

        names = self.gpt.class_names or []
        if isinstance(name_or_index, int) or str(name_or_index).strip().lstrip("-").isdigit():
            index = int(name_or_index)
            if not 0 <= index < self.gpt.config.num_classes:
                raise ConfigError("class", f"an index in 0..{self.gpt.config.num_classes - 1}", index)
            return index
        lowered = [n.lower() for n in names]
        key = str(name_or_index).strip().lower()
        if key not in lowered:
            raise ConfigError("class", f"one of {names} or an index", name_or_index)
        return lowered.index(key)


def load_classifier(device: torch.device | str = "cpu"):
    """The shipped photo classifier (scores generated samples; `train_embedded.PhotoClassifier`)."""
    from .checkpoint_io import read_checkpoint
    from ..training.train_embedded import PhotoClassifier

    clf = PhotoClassifier(8)
    clf.load_state_dict({k: v.float() for k, v in read_checkpoint(EMBEDDED_CLASSIFIER).tensors.items()})
    return clf.to(device).eval()


def load_embedded(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                  drafter: bool = False) -> Pipeline:
    gpt = load_gpt(EMBEDDED_GPT, device=device, dtype=dtype)
    vq = load_vq(EMBEDDED_VQ, device=device, dtype=dtype)
    return Pipeline(gpt, vq, load_drafter(EMBEDDED_DRAFTER, gpt.config, device, dtype) if drafter else None)
