"""Model folders of the pack under ComfyUI's `models/` (respecting extra_model_paths.yaml) and how a
combo choice becomes a path. The embedded default model is always listed first.
"""
from __future__ import annotations

import os
from pathlib import Path

import folder_paths

from ..lantern_core.loading.catalog import download_hint
from ..lantern_core.loading.embedded import EMBEDDED_DRAFTER, EMBEDDED_GPT, EMBEDDED_NAME, EMBEDDED_VQ
from ..lantern_core.errors import CheckpointError, ConfigError, LanternError
from ..lantern_core.errors import shown

# folder name (usable as a key in extra_model_paths.yaml) -> default location under models/
FOLDERS = {
    "lantern_checkpoints": "lantern/checkpoints",
    "lantern_vq": "lantern/vq",
    "lantern_text_encoders": "lantern/text_encoders",
    "lantern_drafters": "lantern/drafters",
}
NEIGHBOR_CACHE = "lantern/neighbors"  # under models/: latent-neighbour tables, built on first use
AUTO_STORE = "lantern/auto_choices.json"  # under models/: `auto` trees and windows measured on this machine
WEIGHT_SUFFIXES = {".safetensors", ".pt", ".pth", ".bin", ".ckpt"}
EMBEDDED = EMBEDDED_NAME
NONE = "none"
WIDGETS = {"lantern_checkpoints": "checkpoint", "lantern_vq": "vq_tokenizer", "lantern_text_encoders": "text_encoder",
           "lantern_drafters": "drafter"}  # the loader input that chooses from each folder


def register_folders() -> None:
    """Add our folders unless the user's extra_model_paths.yaml already configured them."""
    for name, sub in FOLDERS.items():
        default = os.path.join(folder_paths.models_dir, *sub.split("/"))
        if name in folder_paths.folder_names_and_paths:
            paths, _ = folder_paths.folder_names_and_paths[name]
            if default not in paths:
                paths.append(default)
            folder_paths.folder_names_and_paths[name] = (paths, WEIGHT_SUFFIXES)
        else:
            folder_paths.folder_names_and_paths[name] = ([default], WEIGHT_SUFFIXES)


def _model_dirs(name: str) -> list[str]:
    """Sub-folders (HF layout: config.json inside) of every root of `name`, as relative names."""
    out = []
    for root in folder_paths.get_folder_paths(name):
        if not os.path.isdir(root):
            continue
        for entry in sorted(os.scandir(root), key=lambda e: e.name):
            if entry.is_dir() and os.path.isfile(os.path.join(entry.path, "config.json")):
                out.append(entry.name + "/")
    return out


def _weight_files(name: str) -> list[str]:
    """Weight files of `name`, leaving out the files inside HF-layout model folders."""
    roots = folder_paths.get_folder_paths(name)

    def inside_model_dir(rel: str) -> bool:
        parts = rel.replace("\\", "/").split("/")
        return len(parts) > 1 and any(os.path.isfile(os.path.join(r, parts[0], "config.json")) for r in roots)

    return [f for f in folder_paths.get_filename_list(name)
            if Path(f).suffix.lower() in WEIGHT_SUFFIXES and not inside_model_dir(f)]


def family_folder(path: Path) -> tuple[str, str] | None:
    """(family, layout) of a prompted model folder ("chameleon", "hf-lumina2"; "janus", "hf-janus"; ...), or None
    for anything else (one read of its config.json)."""
    from ..lantern_core.loading.families import layout_of

    return layout_of(path)


def list_checkpoints() -> list[str]:
    return [EMBEDDED] + _weight_files("lantern_checkpoints") + _model_dirs("lantern_checkpoints")


def list_vq() -> list[str]:
    return ["auto"] + _weight_files("lantern_vq")


def list_text_encoders() -> list[str]:
    return [NONE] + _model_dirs("lantern_text_encoders")


def list_drafters() -> list[str]:
    return [EMBEDDED] + _weight_files("lantern_drafters") + _model_dirs("lantern_drafters")


def neighbor_cache_dir() -> Path:
    return Path(folder_paths.models_dir) / NEIGHBOR_CACHE


def auto_store_path() -> Path:
    """Where the `auto` tree and window choices are kept across restarts (delete it to measure again)."""
    return Path(folder_paths.models_dir) / AUTO_STORE


def resolve(name: str, choice: str) -> Path:
    """Combo value -> absolute path, or a LanternError naming the folder to put the file in. Only names inside
    the folders: an absolute path or '..' (a value sent through /prompt, not the list) is refused."""
    if choice == EMBEDDED:
        return {"lantern_checkpoints": EMBEDDED_GPT, "lantern_drafters": EMBEDDED_DRAFTER}.get(name, EMBEDDED_VQ)
    relative = Path(choice.rstrip("/")) if isinstance(choice, str) and "\0" not in choice else None
    if relative is None or not relative.parts or relative.anchor or ".." in relative.parts:
        raise ConfigError(WIDGETS.get(name, name), f"a file or model folder name from the {name} folder(s)",
                          shown(choice), "choose an entry of the list")
    for root in folder_paths.get_folder_paths(name):
        candidate = Path(root) / relative
        try:
            if candidate.exists():
                return candidate
        except OSError:  # e.g. a name too long for the file system: not there
            continue
    roots = ", ".join(folder_paths.get_folder_paths(name))
    raise LanternError(f"'{choice[:200]}' was not found in the {name} folder(s) ({roots}). Put the file (or the "
                       f"model folder with its config.json) there, or choose another entry. "
                       f"{where_to_get(name, choice)}".rstrip())


def place(name: str) -> str:
    """The folder a user puts `name`'s files in: its first configured location."""
    return folder_paths.get_folder_paths(name)[0]


def where_to_get(name: str, choice: str) -> str:
    """Where a published model's files are downloaded from and where they go, or "" for a file we do not know."""
    return download_hint(name, choice, place)


def add_download_hint(exc: LanternError, name: str, choice: str) -> LanternError:
    """`exc` with where_to_get appended to its message when it is about the files themselves (a CheckpointError:
    a shard or config.json missing from a downloaded folder, a truncated or foreign file), not about a misfit."""
    hint = where_to_get(name, choice)
    if isinstance(exc, CheckpointError) and hint and hint not in str(exc):
        exc.args = (f"{exc} {hint}",)
    return exc
