"""The host's missing-model panel, in a real browser on both frontends: opening an example workflow whose
public files are absent lists them from the workflow's `models` entries, with their folders and a Download
action (the pack's own code opens no connection: tests/core/test_registry.py scans it). Frontend 1.32.9 lists every entry (and offers the download of
`.safetensors` files only, its rule); today's lists the entries whose file a loader widget names (single-file
models such as LlamaGen's) in its Issues panel."""
from __future__ import annotations

import json
from pathlib import Path

import frontends
import pytest

from test_ui import browser, editor, screenshot  # noqa: F401 (browser: the shared fixture)

REPO = Path(__file__).resolve().parents[2]

OPEN = """async (name) => {  // as a person opens it from the Templates browser
    const response = await fetch(`/api/workflow_templates/lantern/${name}.json`);
    await window.app.loadGraphData(await response.json(), true, true, name);
    await new Promise(r => setTimeout(r, 2500));
}"""


def entries(name: str) -> list[dict]:
    return json.loads((REPO / "example_workflows" / f"{name}.json").read_text())["models"]


@pytest.mark.parametrize("frontend", frontends.ALL)
def test_missing_models_of_an_example_workflow_are_listed_by_the_host(browser, frontend_server, frontend):
    server = frontend_server
    server.post("/api/settings/Comfy.VueNodes.Enabled", False)
    errors = []
    with editor(browser, server, errors) as (ctx, page):
        if frontend == frontends.SHIPPED:
            listed = {}
            for name in ("lantern_anole_sjd", "lantern_llamagen_c2i"):
                page.evaluate(OPEN, name)
                dialog = page.locator(".p-dialog", has_text="Missing Models").last
                dialog.wait_for(timeout=30000)
                listed[name] = dialog.inner_text()
                page.keyboard.press("Escape")
                page.wait_for_timeout(500)
            for name, text in listed.items():
                for entry in entries(name):
                    assert f"{entry['directory']} / {entry['name']}" in text, (name, entry, text)
            assert "Only allowed suffixes" in listed["lantern_anole_sjd"]  # vqgan.ckpt: shown, not offered
        else:
            page.evaluate(OPEN, "lantern_llamagen_c2i")
            page.get_by_role("button", name="View details").first.click()
            panel = page.get_by_text("Missing Models").first
            panel.wait_for(timeout=30000)
            page.wait_for_timeout(1000)
            text = page.evaluate("() => document.body.innerText")
            for entry in entries("lantern_llamagen_c2i"):
                assert entry["name"] in text and entry["directory"] in text, (entry, text[-2000:])
            assert "Download" in text
        screenshot(page, f"ui_missing_models_{frontend}.png")
    assert not errors, errors
