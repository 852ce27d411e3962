"""Where the `auto` tree and window choices are kept between processes: one JSON file chosen by the caller
(the nodes: under ComfyUI's models folder; the command line: the user's cache folder), each entry keyed by
what the choice depends on (the device's name, dtype, batch rows, the weights' digest, the sampling setting
and the acceptance rule). A missing, unreadable or corrupted store is ignored and rewritten on the next
save, so a restarted process makes the same choice without calibrating again. Nothing here picks a
location by itself: without `use_store` choices live in memory only.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import weakref
from pathlib import Path

import torch

log = logging.getLogger("lantern_core.auto_store")
MAX_BYTES = 4 << 20  # a store is a few kilobytes; anything larger is not ours
_STATE: dict = {"path": None}


def use_store(path: str | Path | None) -> None:
    """Keep `auto` choices in the JSON file `path` (created on the first save), or in memory only (None)."""
    _STATE["path"] = None if path is None else Path(path)


def store_path() -> Path | None:
    return _STATE["path"]


def device_name(device: torch.device) -> str:
    """What a cost curve depends on: the GPU's name, or the CPU's architecture and core count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":  # (not platform.processor(): it would start `uname -p`)
        return f"cpu {platform.machine()} x{os.cpu_count()} threads {torch.get_num_threads()}"
    return device.type


def image_shape(model) -> tuple[int, int]:
    """(image tokens, row stride): what a grid view of one model's weights draws (part of every auto key)."""
    return model.config.num_image_tokens, model.config.row_stride


def entry_key(*parts) -> str:
    """A stable key for the parts a choice depends on (their repr, hashed)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _read(path: Path) -> dict:
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ValueError(f"{path.stat().st_size} bytes")
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            raise ValueError("not an object of entries")
        return data
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        log.warning("ignoring the auto-choice store %s (%s); it is rebuilt as choices are measured", path, exc)
        return {}


def recall(key: str) -> dict | None:
    """The stored choice for `key`, or None (no store, no entry, or an unreadable store)."""
    path = store_path()
    if path is None:
        return None
    entry = _read(path).get(key)
    return entry.get("value") if isinstance(entry, dict) and isinstance(entry.get("value"), dict) else None


def remember(key: str, value: dict, description: str) -> None:
    """Save a choice (atomically: a crash never leaves half a file); failures to write only log."""
    path = store_path()
    if path is None:
        return
    data = _read(path)
    data[key] = {"value": value, "for": description}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(path.name + f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(scratch, path)
    except OSError as exc:
        log.warning("could not save the auto choice to %s (%s); it is kept for this process only", path, exc)


def forget_all() -> None:
    """Drop every stored choice (the user asked to measure again)."""
    path = store_path()
    if path is not None and path.exists():
        try:
            path.unlink()
        except OSError as exc:
            log.warning("could not remove %s (%s)", path, exc)


_DIGESTS: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()


def weights_digest(module: torch.nn.Module) -> tuple:
    """Identity of a module's weights that survives unloading and reloading the same file: its class,
    config, and a hash of every parameter's shape, dtype and first and last 1,024 values (cheap on a 7B;
    computed once per module object)."""
    if module not in _DIGESTS:
        _DIGESTS[module] = _digest(module)
    return _DIGESTS[module]


def _digest(module: torch.nn.Module) -> tuple:
    digest = hashlib.sha256()
    for name, p in module.named_parameters():
        flat = p.detach().reshape(-1)
        sample = torch.cat([flat[:1024], flat[-1024:]]).float().cpu()
        digest.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        digest.update(sample.numpy().tobytes())
    return type(module).__name__, getattr(module, "config", None), digest.hexdigest()
