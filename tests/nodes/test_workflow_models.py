"""Models the host can fetch: each example workflow that needs public files lists them in its `models` entries
(name, hub URL of the exact file, directory) as ComfyUI's frontend reads them; each entry names a folder our
loaders read and a file name the host lists there and our loaders accept, so a file put where the entry says
counts as present; and a loader that finds no file says which one it needs and where to get it. Nothing
downloads: the catalog is data."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tiny_families import save_chameleon_folder, save_chameleon_vqgan

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / "example_workflows").glob("*.json"))
LOADER_WIDGETS = {"LanternModelLoader": {"checkpoint": 0, "vq_tokenizer": 1, "text_encoder": 2},
                  "LanternDrafterLoader": {"drafter": 0}}
# The frontend 1.32.9 offers a download only from these hosts (its MissingModelsWarning's allow-list).
ALLOWED_SOURCES = ("https://huggingface.co/", "https://civitai.com/")


def choices(workflow: dict, folder_of: dict) -> list[tuple[str, str]]:
    """(folder kind, choice) of every loader widget in the workflow."""
    out = []
    for node in workflow["nodes"]:
        for widget, index in LOADER_WIDGETS.get(node["type"], {}).items():
            out.append((folder_of[widget], node["widgets_values"][index]))
    return out


@pytest.fixture(scope="module")
def folder_of(pack):
    return {widget: name for name, widget in pack.nodes.paths.WIDGETS.items()}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_each_workflow_lists_exactly_the_public_files_its_loaders_need(pack, folder_of, path):
    from lantern_pack.lantern_core.loading.catalog import public_model

    workflow = json.loads(path.read_text())
    expected = []
    for folder, choice in choices(workflow, folder_of):
        model = public_model(folder, choice)
        if choice in ("auto", "none", pack.nodes.paths.EMBEDDED):
            continue
        assert model is not None, f"{path.name}: {choice!r} in {folder} is not in lantern_core/loading/catalog.py"
        expected += [f.workflow_entry() for f in model.files if f.workflow_entry() not in expected]
    assert workflow.get("models", []) == expected, (path.name, json.dumps(expected, indent=1))


def test_every_entry_names_a_folder_and_a_file_our_loaders_read(pack, folder_of, monkeypatch, tmp_path):
    """Put an empty file where each entry says: ComfyUI's model listing (what the frontend compares `name`
    with) shows exactly that name in that folder, and our loaders' own lists offer the choice."""
    import folder_paths
    from app.model_manager import ModelFileManager

    paths = pack.nodes.paths
    entries = {json.dumps(e, sort_keys=True): e for p in WORKFLOWS for e in json.loads(p.read_text()).get("models", [])}
    assert len(entries) >= 10
    for name in paths.FOLDERS:
        monkeypatch.setitem(folder_paths.folder_names_and_paths, name, ([str(tmp_path / name)], paths.WEIGHT_SUFFIXES))
    for entry in entries.values():
        assert entry["directory"] in paths.FOLDERS, entry
        assert entry["url"].startswith(ALLOWED_SOURCES) and "/resolve/main/" in entry["url"], entry
        assert entry["url"].endswith("/" + entry["url"].split("/resolve/main/")[1]), entry
        assert Path(entry["name"]).suffix in paths.WEIGHT_SUFFIXES & set(folder_paths.supported_pt_extensions), entry
        target = tmp_path / entry["directory"] / entry["name"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"")
        if "/" in entry["name"]:  # a model folder: our loaders list it by its config.json
            (target.parent / "config.json").write_text("{}")
    manager = ModelFileManager()
    for name in paths.FOLDERS:
        listed = {f["name"].replace("\\", "/") for f in manager.get_model_file_list(name)}
        wanted = {e["name"] for e in entries.values() if e["directory"] == name}
        assert wanted <= listed, (name, wanted - listed)
    offered = set(paths.list_checkpoints()) | set(paths.list_vq()) | set(paths.list_text_encoders()) | \
        set(paths.list_drafters())
    for path in WORKFLOWS:
        for folder, choice in choices(json.loads(path.read_text()), folder_of):
            assert choice in offered, (path.name, choice)


def test_a_missing_published_file_is_named_with_where_to_get_it(node, pack):
    loader = node["LanternModelLoader"]
    message = loader.validate_inputs(checkpoint="c2i_XL_384.pt", vq_tokenizer="vq_ds16_c2i.pt", text_encoder="none",
                                     dtype="auto")
    assert "https://huggingface.co/FoundationVision/LlamaGen/resolve/main/c2i_XL_384.pt" in message, message
    assert pack.nodes.paths.place("lantern_checkpoints") in message
    import folder_paths

    absent = "llamagen2_drafter/"  # a published drafter no test writes into the shared folders
    assert not any((Path(root) / absent).exists() for root in folder_paths.get_folder_paths("lantern_drafters"))
    message = node["LanternDrafterLoader"].validate_inputs(drafter=absent)
    assert isinstance(message, str) and "https://huggingface.co/jadohu/llamagen2_drafter" in message, message
    unknown = loader.validate_inputs(checkpoint="my_own.pt", vq_tokenizer="auto", text_encoder="none", dtype="auto")
    assert "was not found" in unknown and "huggingface" not in unknown  # no made-up source for unknown files


def test_a_downloaded_folder_missing_a_shard_says_which_and_where(node, pack):
    import folder_paths

    root = Path(folder_paths.get_folder_paths("lantern_checkpoints")[0])
    folder = root / "Anole-7b-v0.1-hf"
    try:
        save_chameleon_folder(folder, seed=5)
        save_chameleon_vqgan(folder / "vqgan.ckpt")
        weights = folder / "model.safetensors"
        shards = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"]
        weights.rename(folder / shards[0])
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"a": shards[0], "b": shards[1]}}))  # the second shard never arrived
        with pytest.raises(pack.lantern_core.errors.CheckpointError) as caught:
            node["LanternModelLoader"].execute(checkpoint="Anole-7b-v0.1-hf/", vq_tokenizer="auto",
                                               text_encoder="none", dtype="fp32")
        message = str(caught.value)
        assert "1 missing" in message and shards[1] in message, message
        assert "https://huggingface.co/leloy/Anole-7b-v0.1-hf" in message, message
        (folder / "vqgan.ckpt").unlink()
        message = node["LanternModelLoader"].validate_inputs(checkpoint="Anole-7b-v0.1-hf/", vq_tokenizer="auto",
                                                             text_encoder="none", dtype="auto")
        assert "https://huggingface.co/GAIR/Anole-7b-v0.1/resolve/main/tokenizer/vqgan.ckpt" in message, message
    finally:
        shutil.rmtree(folder, ignore_errors=True)
