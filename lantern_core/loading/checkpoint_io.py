"""Reading and writing weight files safely.

`.safetensors` is preferred; `.pt`/`.pth`/`.bin`/`.ckpt` are read only through
`torch.load(weights_only=True)` (with `argparse.Namespace` allow-listed, since LlamaGen stores its
training args that way; that class runs no code when unpickled). Every failure is a `CheckpointError`
naming the file. This module knows nothing about model architectures (see `checkpoints.py`).
"""
from __future__ import annotations

import argparse
import json
import logging
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, safe_open, save_file

from ..errors import CheckpointError

log = logging.getLogger(__name__)

SAFETENSORS_SUFFIXES = (".safetensors",)
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
METADATA_KEY = "lantern"  # safetensors metadata entry holding our JSON (kind, config, names)


@dataclass
class RawCheckpoint:
    """Tensors of one file plus whatever descriptive metadata came with it."""

    path: Path
    tensors: dict[str, torch.Tensor]
    metadata: dict = field(default_factory=dict)  # our JSON metadata (safetensors) if present
    args: dict = field(default_factory=dict)  # LlamaGen training args (from a .pt "args" entry)
    wrapper: str | None = None  # "model", "ema", "module", "state_dict" or None for a bare dict


def _read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    try:
        with safe_open(str(path), framework="pt") as f:
            raw_meta = f.metadata() or {}
        tensors = load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError, ... : the bytes are not a valid file
        raise CheckpointError(path, "a complete .safetensors file",
                              f"a file that cannot be parsed ({exc})",
                              "the file is truncated or corrupt: download it again") from exc
    meta = {}
    if METADATA_KEY in raw_meta:
        try:
            meta = json.loads(raw_meta[METADATA_KEY])
        except json.JSONDecodeError as exc:
            raise CheckpointError(path, "JSON in the 'lantern' metadata entry", "unparseable text",
                                  "re-save the file with lantern_core") from exc
        if not isinstance(meta, dict) or not isinstance(meta.get("config", {}), dict):
            raise CheckpointError(path, "a JSON object (with a 'config' object) in the 'lantern' metadata entry",
                                  f"{type(meta).__name__} {str(meta)[:80]}", "re-save the file with lantern_core")
    return tensors, meta


def _read_pickle(path: Path) -> object:
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(str(path), map_location="cpu", weights_only=True, mmap=False)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(path, "plain tensors readable with torch.load(weights_only=True)",
                              f"content that would need arbitrary code to unpickle ({str(exc).splitlines()[0]})",
                              "only use checkpoints from sources you trust, converted to .safetensors; "
                              "this pack never executes pickled code") from exc
    except Exception as exc:  # noqa: BLE001 - any failure of the (sandboxed) parser on this file's bytes
        raise CheckpointError(path, "a complete PyTorch checkpoint",
                              f"a file that cannot be read ({type(exc).__name__}: {exc})",
                              "the file is truncated or corrupt: download it again") from exc


WRAPPER_KEYS = ("model", "ema", "module", "state_dict")


def _unwrap(path: Path, obj: object) -> tuple[dict[str, torch.Tensor], str | None, dict]:
    """Pick the state dict out of a training checkpoint. Prefers "model", as LlamaGen's samplers do."""
    if not isinstance(obj, dict):
        raise CheckpointError(path, "a dict of tensors (a state_dict)", f"a {type(obj).__name__}",
                              "pass a weights file, not a whole pickled model")
    args = obj.get("args")
    args = vars(args) if isinstance(args, argparse.Namespace) else (args if isinstance(args, dict) else {})
    for key in WRAPPER_KEYS:
        if isinstance(obj.get(key), dict):
            return _tensor_dict(path, obj[key]), key, args
    return _tensor_dict(path, obj), None, args


def _tensor_dict(path: Path, sd: dict) -> dict[str, torch.Tensor]:
    tensors = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise CheckpointError(path, "a state_dict of tensors", f"no tensors (keys: {sorted(sd)[:8]})",
                              "pass the weights file (model .pt or .safetensors)")
    return tensors


def read_checkpoint(path: str | Path) -> RawCheckpoint:
    """Read any supported weights file into tensors, without executing code."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "an existing file", "nothing at that path",
                              "check the path, or put the file in ComfyUI/models/lantern/")
    if path.stat().st_size == 0:
        raise CheckpointError(path, "a weights file", "an empty (0-byte) file",
                              "the download failed: fetch the file again")
    suffix = path.suffix.lower()
    if suffix in SAFETENSORS_SUFFIXES:
        tensors, meta = _read_safetensors(path)
        return RawCheckpoint(path, tensors, metadata=meta)
    if suffix in PICKLE_SUFFIXES:
        tensors, wrapper, args = _unwrap(path, _read_pickle(path))
        return RawCheckpoint(path, tensors, args=args, wrapper=wrapper)
    raise CheckpointError(path, f"a weights file ({', '.join(SAFETENSORS_SUFFIXES + PICKLE_SUFFIXES)})",
                          f"the unknown extension '{path.suffix}'",
                          "convert the weights to .safetensors, or point to a folder with config.json")


def read_json_object(path: Path, fix: str) -> dict:
    """A JSON file holding an object (config.json, ...): anything else is a CheckpointError naming it."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(path, "a readable JSON config", f"a missing or unreadable file ({exc})", fix) from exc
    if not isinstance(data, dict):
        raise CheckpointError(path, "a JSON object", f"a JSON {type(data).__name__}", fix)
    return data


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict) -> None:
    """Save contiguous CPU copies of `tensors` with our JSON metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    save_file(clean, str(path), metadata={METADATA_KEY: json.dumps(metadata, sort_keys=True)})
