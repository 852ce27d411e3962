"""Packaging: pyproject fit for the Comfy Registry, requirements.txt equal to its dependencies and free of
torch, the fixed top-level layout, and the two-command quick start."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_is_fit_for_the_comfy_registry():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project, comfy = data["project"], data["tool"]["comfy"]
    assert "comfyui" not in project["name"].lower()
    assert re.fullmatch(r"\d+\.\d+\.\d+", project["version"])
    assert project["urls"]["Repository"]
    for key in ("PublisherId", "DisplayName", "includes", "requires-comfyui"):
        assert key in comfy, key
    assert comfy["requires-comfyui"].startswith(">=0.3.75")


def test_requirements_match_dependencies_and_never_name_torch():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = sorted(data["project"]["dependencies"])
    reqs = sorted(line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
                  if line.strip() and not line.startswith("#"))
    assert deps == reqs
    assert not any(re.match(r"(torch|torchvision|torchaudio)\b", r) for r in reqs)
    dev = (ROOT / "requirements-dev.txt").read_text()
    assert "torch==2.14.1" in dev and "torchvision==0.29.1" in dev


def test_top_level_layout_and_quick_start():
    allowed = {"__init__.py", "nodes", "lantern_core", "web", "tests", "pyproject.toml", "README.md",
               "example_workflows", "docs", "Makefile", ".ci", "bench", ".gitignore", "requirements.txt",
               "requirements-dev.txt", "requirements-host.txt", "requirements-registry.txt", "SECURITY.md",
               "LICENSE", ".comfyignore"}
    dotted = (".ci", ".gitignore", ".comfyignore")
    tracked = {p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name in dotted}
    tracked -= {".venv", ".host", "outputs"}
    assert tracked <= allowed, tracked - allowed
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```")[1]
    assert [line for line in block.strip().splitlines()] == ["make demo", "make test"]
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("make test")
