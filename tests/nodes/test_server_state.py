"""The shared test server is put back between tests (tests/host/server_state.py, run after every test that
uses a server by tests/nodes/conftest.py): a change a test leaks is caught, named and undone."""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import server_state
from workflow import ui_to_api

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "example_workflows" / "lantern_embedded_model.json"


def test_leaked_model_files_settings_and_queued_prompts_are_caught_and_undone(server):
    before = server_state.read_state(server)
    models = Path(server.base_dir) / "models"
    (models / "lantern" / "leaked").mkdir()
    (models / "lantern" / "leaked" / "stray.safetensors").write_bytes(b"x")
    (models / "lantern" / "checkpoints" / "left_behind.safetensors").write_bytes(b"y")
    (models / "lantern" / "neighbors").mkdir(exist_ok=True)
    cache = models / "lantern" / "neighbors" / "neighbors_test.safetensors"  # the pack's own cache: kept
    cache.write_bytes(b"z")
    server.post("/settings/Comfy.VueNodes.Enabled", True)
    prompt = ui_to_api(json.loads(EXAMPLE.read_text()), server.get("/object_info", timeout=60))
    slow = copy.deepcopy(prompt)
    for node in slow.values():
        if node["class_type"] == "LanternSampler":
            node["inputs"].update(seed=5, batch_size=32)  # seconds of work: still running when we look
    for seed in (5, 6):
        for node in slow.values():
            if node["class_type"] == "LanternSampler":
                node["inputs"]["seed"] = seed
        server.post("/prompt", {"prompt": slow})
    deadline = time.monotonic() + 30
    while server_state.queue_counts(server) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)

    leaks = server_state.restore_state(server, before)

    assert any("left_behind.safetensors was added" in leak for leak in leaks.models), leaks
    assert any("leaked/stray.safetensors was added" in leak for leak in leaks.models), leaks
    assert any("lantern/leaked/ was made" in leak for leak in leaks.models), leaks
    assert [s for s in leaks.settings if "Comfy.VueNodes.Enabled" in s and s.endswith("-> True")], leaks
    assert leaks.queue and "prompts (cleared)" in leaks.queue[0], leaks
    assert len(leaks.unexpected()) == len(leaks.models) + len(leaks.queue)
    assert cache.exists() and not any("neighbors" in leak for leak in leaks.models), leaks
    cache.unlink()
    after = server_state.read_state(server)
    assert after == before  # files, folders, settings text and an empty queue
    assert server.get("/settings").get("Comfy.VueNodes.Enabled") == json.loads(before.settings or "{}").get(
        "Comfy.VueNodes.Enabled")
    assert server_state.restore_state(server, before) == server_state.Leaks()  # nothing left to undo


def test_an_untouched_server_has_no_leaks(server):
    before = server_state.read_state(server)
    assert server_state.restore_state(server, before) == server_state.Leaks()
