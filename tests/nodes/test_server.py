"""End to end through a real ComfyUI 0.3.75 server (`main.py --cpu`) over HTTP + websocket: the shipped
example workflow, progress and previews, the stats UI payload, Cancel, errors and `/free`."""
from __future__ import annotations

import asyncio
import copy
import io
import json
import time
from pathlib import Path

import pytest
from PIL import Image

from client import run_prompt, run_prompt_async
from workflow import ui_to_api

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "example_workflows" / "lantern_embedded_model.json"


@pytest.fixture(scope="module")
def object_info(server):
    return server.get("/object_info", timeout=60)


@pytest.fixture(scope="module")
def prompt(object_info):
    return ui_to_api(json.loads(EXAMPLE.read_text()), object_info)


def with_inputs(prompt: dict, node_type: str, **inputs) -> dict:
    out = copy.deepcopy(prompt)
    for node in out.values():
        if node["class_type"] == node_type:
            node["inputs"].update(inputs)
    return out


def saved_image(server, result) -> Image.Image:
    images = [img for out in result.history["outputs"].values() for img in out.get("images", [])
              if img["type"] == "output"]
    assert images, result.history["outputs"]
    data = server.request("GET", f"/view?filename={images[0]['filename']}&subfolder={images[0]['subfolder']}&type=output")
    return Image.open(io.BytesIO(data)).convert("RGB")


def test_nodes_extension_and_templates_are_registered(server, object_info):
    ours = {k: v for k, v in object_info.items() if k.startswith("Lantern")}
    assert sorted(ours) == sorted(["LanternModelLoader", "LanternDrafterLoader", "LanternConditioning",
                                   "LanternDecodingConfig",
                                   "LanternSampler", "LanternDecode", "LanternGenerate"])
    assert all(v["category"].startswith("LANTERN") for v in ours.values())
    assert ours["LanternModelLoader"]["input"]["required"]["checkpoint"][1]["options"][0].endswith("(embedded)") or \
        ours["LanternModelLoader"]["input"]["required"]["checkpoint"][0][0].endswith("(embedded)")
    assert "/extensions/lantern/js/lantern_stats.js" in server.get("/extensions")
    templates = server.get("/workflow_templates")
    assert {"lantern_embedded_model", "lantern_pp_embedded_model", "lantern_sjd_embedded_model"} \
        <= set(templates.get("lantern", []))


def test_example_workflow_runs_with_progress_previews_and_stats(server, prompt):
    result = run_prompt(server.url, with_inputs(prompt, "LanternSampler", seed=11))
    assert result.status == "success", result.messages[-3:]
    image = saved_image(server, result)
    assert image.size == (128, 128)
    sampler_id = next(k for k, v in prompt.items() if v["class_type"] == "LanternSampler")
    progress = [d for d in result.of_type("progress") if d.get("node") == sampler_id]
    assert progress and progress[-1]["value"] == progress[-1]["max"] == 256
    assert result.previews >= 4  # partial-grid previews (server runs with --preview-method auto)
    executed = [d for d in result.of_type("executed") if d["node"] == sampler_id]
    stats = executed[0]["output"]["lantern_stats"][0]
    assert stats["forward_passes"] == 256 and stats["heatmap"] == [[1] * 16] * 16
    assert stats["conditions"] == ["astronaut"]


@pytest.mark.parametrize("path", sorted((REPO / "example_workflows").glob("*.json")), ids=lambda p: p.stem)
def test_every_example_workflow_matches_the_node_schemas(object_info, path):
    """Every widget value of every shipped workflow lines up with the live server's schema (none missing or
    left over) and every combo value the server lists is valid; model files aside, they would run."""
    workflow = json.loads(path.read_text())
    prompt = ui_to_api(workflow, object_info)
    for node in workflow["nodes"]:
        info = object_info[node["type"]]
        specs = {**info["input"].get("required", {}), **info["input"].get("optional", {})}
        widgets = [n for n, spec in specs.items() if isinstance(spec[0], list) or spec[0] in
                   ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")]
        extra = sum(1 for n in widgets if n == "seed")  # control_after_generate value
        assert len(node.get("widgets_values", [])) == len(widgets) + extra, (path.name, node["type"])
        for name, value in prompt[str(node["id"])]["inputs"].items():
            options = specs[name][0] if isinstance(specs[name][0], list) else specs[name][1].get("options") \
                if specs[name][0] == "COMBO" and len(specs[name]) > 1 else None
            if options and name in ("mode", "tree", "dtype"):  # fixed choices (file lists depend on the machine)
                assert value in options, (path.name, node["type"], name, value)


@pytest.mark.parametrize("name,mode", [("lantern_pp_embedded_model", "lantern_pp"),
                                       ("lantern_sjd_embedded_model", "sjd_coupled")])
def test_speculative_examples_run_on_a_fresh_install(server, object_info, name, mode):
    """The shipped LANTERN++ workflow (embedded model + embedded drafter, auto tree) and the training-free
    coupled-SJD workflow (no drafter, auto window), end to end over HTTP."""
    workflow = json.loads((REPO / "example_workflows" / f"{name}.json").read_text())
    pp = ui_to_api(workflow, object_info)
    result = run_prompt(server.url, pp)
    assert result.status == "success", result.messages[-3:]
    assert saved_image(server, result).size == (128, 128)
    sampler_id = next(k for k, v in pp.items() if v["class_type"] == "LanternSampler")
    stats = next(d for d in result.of_type("executed") if d["node"] == sampler_id)["output"]["lantern_stats"][0]
    assert stats["mode"] == mode and stats["speculative"]
    assert stats["forward_passes"] < 256 and stats["mean_accepted_length"] > 1.2
    assert max(max(row) for row in stats["heatmap"]) > 1
    if mode == "lantern_pp":
        assert stats["tree"].startswith("auto_")
    else:
        assert stats["tree"].startswith("coupled jacobi w") and "(auto;" in stats["tree"]
        assert stats["drafter"] == "none (training-free)"
    progress = [d for d in result.of_type("progress") if d.get("node") == sampler_id]
    assert progress and progress[-1]["value"] == progress[-1]["max"] == 256


def test_same_seed_same_image_across_runs_and_other_seed_differs(server, prompt):
    a = saved_image(server, run_prompt(server.url, with_inputs(prompt, "LanternSampler", seed=21)))
    # a different save prefix forces re-execution of the whole graph instead of a cache hit
    again = with_inputs(with_inputs(prompt, "LanternSampler", seed=21), "SaveImage", filename_prefix="again")
    b = saved_image(server, run_prompt(server.url, with_inputs(again, "LanternModelLoader", dtype="fp32")))
    c = saved_image(server, run_prompt(server.url, with_inputs(prompt, "LanternSampler", seed=22)))
    assert a.tobytes() == b.tobytes()
    assert a.tobytes() != c.tobytes()


def test_cancel_stops_the_run_and_the_next_run_succeeds(server, prompt):
    slow = with_inputs(prompt, "LanternSampler", seed=31, batch_size=32)  # seconds of work, even on 2 cores
    sent = []

    async def interrupt_on_progress(kind, data, session):
        if kind == "progress" and data.get("value", 0) >= 8 and not sent:
            sent.append(data["value"])
            async with session.post(f"{server.url}/interrupt", json={}) as resp:
                assert resp.status == 200

    started = time.perf_counter()
    result = asyncio.run(run_prompt_async(server.url, slow, interrupt_on_progress))
    assert result.status == "interrupted", [t for t, _ in result.messages]
    values = [d["value"] for d in result.of_type("progress")]
    assert sent and max(values) < 256 and time.perf_counter() - started < 120  # stopped long before the end
    # (that the flag is honoured within one step is checked exactly in test_contract.py)
    after = run_prompt(server.url, with_inputs(prompt, "LanternSampler", seed=32))
    assert after.status == "success"


@pytest.mark.parametrize("node_type,inputs", [
    ("LanternModelLoader", {"checkpoint": "c2i_B_256.pt"}),  # a file that is not in models/lantern
    ("LanternSampler", {"top_k": 0, "top_p": 0.0}),
    ("LanternSampler", {"batch_size": 0}),
    ("LanternSampler", {"cfg": "strong"}),  # wrong type
    ("LanternSampler", {"seed": -1}),
], ids=["missing-file", "top_k0-top_p0", "batch0", "wrong-type", "negative-seed"])
def test_invalid_inputs_are_rejected_before_running(server, prompt, node_type, inputs):
    with pytest.raises(ValueError, match="node_errors") as err:
        run_prompt(server.url, with_inputs(prompt, node_type, **inputs))
    assert node_type in str(err.value)
    assert server.get("/system_stats")["system"]


@pytest.mark.parametrize("class_name,fragment", [("dog", "astronaut"), ("99", "0..7")])
def test_bad_classes_are_node_errors_that_name_the_fix(server, prompt, class_name, fragment):
    result = run_prompt(server.url, with_inputs(prompt, "LanternConditioning", class_name=class_name))
    assert result.status == "error"
    error = result.of_type("execution_error")[0]
    assert error["node_type"] == "LanternConditioning"
    assert class_name in error["exception_message"] and fragment in error["exception_message"]
    assert run_prompt(server.url, with_inputs(prompt, "LanternSampler", seed=51)).status == "success"


def test_free_releases_models(server, prompt):
    assert run_prompt(server.url, with_inputs(prompt, "LanternSampler", seed=41)).status == "success"
    assert server.get("/lantern/status")["live_models"] >= 1
    server.post("/free", {"unload_models": True, "free_memory": True})
    for _ in range(100):
        if server.get("/lantern/status")["live_models"] == 0:
            break
        time.sleep(0.1)
    assert server.get("/lantern/status")["live_models"] == 0
    assert run_prompt(server.url, with_inputs(prompt, "LanternSampler", seed=42)).status == "success"
