"""What a test can leave behind in a shared ComfyUI test server, and putting it back.

The node tests share one server per pytest session (per xdist worker). Between tests this module takes the
server's state (files under its models folder, the user's settings file, the prompt queue), and after a test
restores it: added model files are removed, the settings file is written back, queued or running prompts
are cleared and interrupted. It does not touch outputs, history, the server's in-memory model cache
(tests that care ask /free themselves) or the pack's own caches under models/ (PACK_CACHES: the latent-
neighbour tables and the `auto` choices a run measures and keeps, as on a user's install).
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path


PACK_CACHES = ("lantern/neighbors", "lantern/auto_choices.json")  # nodes/paths.py NEIGHBOR_CACHE, AUTO_STORE


def is_pack_cache(name: str) -> bool:
    return any(name == cache or name.startswith(cache + "/") for cache in PACK_CACHES)


@dataclass(frozen=True)
class ServerState:
    models: dict  # path relative to models/ -> (size, mtime_ns)
    folders: frozenset  # folders under models/, relative
    settings: str  # the settings file's text ("" when absent)
    queue: tuple  # (running, pending) prompt counts


@dataclass
class Leaks:
    """What a test left changed; every entry was put back by restore_state."""
    models: list = field(default_factory=list)
    settings: list = field(default_factory=list)
    queue: list = field(default_factory=list)

    def unexpected(self) -> list:
        """Leaks a test must not leave (settings are per-test UI choices: restored without complaint)."""
        return self.models + self.queue


def settings_file(server) -> Path:
    return Path(server.base_dir) / "user" / "default" / "comfy.settings.json"


def queue_counts(server) -> tuple:
    queue = server.get("/queue")
    return len(queue.get("queue_running", [])), len(queue.get("queue_pending", []))


def read_state_folders(models: Path) -> list:
    return [name for name in (str(p.relative_to(models)) for p in models.rglob("*") if p.is_dir())
            if not is_pack_cache(name)]


def read_state(server) -> ServerState:
    models = Path(server.base_dir) / "models"
    files = {str(p.relative_to(models)): (p.stat().st_size, p.stat().st_mtime_ns)
             for p in sorted(models.rglob("*"))
             if (p.is_file() or p.is_symlink()) and not is_pack_cache(str(p.relative_to(models)))}
    folders = frozenset(read_state_folders(models))
    path = settings_file(server)
    return ServerState(files, folders, path.read_text() if path.exists() else "", queue_counts(server))


def settings_changes(before: str, after: str) -> list:
    old, new = (json.loads(text) if text.strip() else {} for text in (before, after))
    return [f"setting {key}: {old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r}"
            for key in sorted(set(old) | set(new)) if old.get(key, object()) != new.get(key, object())]


def restore_state(server, before: ServerState, timeout: float = 120.0) -> Leaks:
    """Put `server` back to `before`; return what had changed."""
    after = read_state(server)
    leaks = Leaks()
    models = Path(server.base_dir) / "models"
    for name in sorted(set(after.models) - set(before.models)):
        leaks.models.append(f"models/{name} was added (removed)")
        (models / name).unlink()
    for name in sorted(set(before.models) - set(after.models)):
        leaks.models.append(f"models/{name} was deleted (cannot be put back)")
    for name in sorted(set(before.models) & set(after.models)):
        if before.models[name] != after.models[name]:
            leaks.models.append(f"models/{name} was rewritten (cannot be put back)")
    for name in sorted(set(read_state_folders(models)) - before.folders, reverse=True):  # deepest first
        leaks.models.append(f"models/{name}/ was made (removed)")
        shutil.rmtree(models / name, ignore_errors=True)
    if after.settings != before.settings:
        leaks.settings = settings_changes(before.settings, after.settings)
        settings_file(server).write_text(before.settings)  # the server reads the file on every request
    if after.queue != (0, 0):
        leaks.queue.append(f"{after.queue[0]} running and {after.queue[1]} pending prompts (cleared)")
        server.post("/queue", {"clear": True})
        server.post("/interrupt", {})
        deadline = time.monotonic() + timeout
        while queue_counts(server) != (0, 0):
            if time.monotonic() > deadline:
                leaks.queue.append(f"the queue did not empty within {timeout:.0f} s")
                break
            time.sleep(0.2)
    return leaks
