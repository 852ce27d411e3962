"""Registry readiness: the archive the Comfy Registry would receive (packed by comfy-cli's own `comfy node pack`,
checked by its `comfy node validate`, pyproject parsed by its parser) holds the runtime files only and passes
every check except the one placeholder to fill at publication; and the check itself catches a broken pack.
Needs `.host/registry` (comfy-cli + ruff), which `make test` installs."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".host" / "registry" / "bin" / "python"
SCRIPT = ROOT / "tests" / "host" / "registry_check.py"

pytestmark = pytest.mark.slow


def run_check(source: Path, *flags: str) -> tuple[int, dict]:
    if not PYTHON.is_file():
        pytest.fail(f"the registry tools are missing at {PYTHON.parent.parent}: run `make test` (it installs them) "
                    "or `make registry-check`")
    done = subprocess.run([str(PYTHON), str(SCRIPT), "--source", str(source), "--json", *flags],
                          capture_output=True, text=True, timeout=600)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def copy_source(tmp_path: Path) -> Path:
    """This checkout's committable files in a scratch git repository, to break on purpose."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    copy = tmp_path / "pack"
    for rel in filter(None, listed):
        if (ROOT / rel).is_file():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, copy / rel)
    subprocess.run(["git", "init", "-q", str(copy)], check=True)
    return copy


def test_the_published_archive_passes_the_registry_checks_but_for_the_repository_placeholder():
    code, report = run_check(ROOT)
    assert code == 1  # the placeholder blocks publication ...
    assert [p["what"].split(" is the placeholder")[0] for p in report["problems"]] == ["[project.urls] Repository"]
    assert all(p["placeholder"] for p in report["problems"]), report["problems"]
    assert run_check(ROOT, "--allow-placeholders")[0] == 0  # ... and is the only thing that does
    assert "All validation checks passed" in report["validate_output"]
    shipped = set(report["shipped"])
    assert {"LICENSE", "__init__.py", "example_workflows/lantern_embedded_model.json",
            "lantern_core/assets/default/drafter/config.json"} <= shipped
    assert not {p for p in shipped if p.split("/")[0] in ("tests", "bench", ".ci")}, "development files ship"
    readme = (ROOT / "README.md").read_text()
    assert "example.invalid" in readme and "make registry-check" in readme  # the README says what to fill in


def test_the_registry_check_catches_a_broken_pack(tmp_path):
    source = copy_source(tmp_path)
    (source / "nodes" / "shortcut.py").write_text('VALUE = eval("1 + 1")\n')
    (source / "web" / "js" / "loader.js").write_text('const run = new Function("return 1");\n')
    (source / "lantern_core" / "fetch.py").write_text("import urllib.request\nimport torch\n"
                                                      "state = torch.load('x.pt', map_location='cpu')\n")
    (source / "LICENSE").unlink()
    ignore = source / ".comfyignore"
    ignore.write_text(ignore.read_text().replace("/tests/\n", ""))
    pyproject = source / "pyproject.toml"
    text = pyproject.read_text().replace('PublisherId = "lantern"', 'PublisherId = "lantern"\nIcon = ""')
    pyproject.write_text(text.replace('"Operating System :: OS Independent"', '"Operating System :: Plan 9"'))
    code, report = run_check(source, "--allow-placeholders")
    found = "\n".join(f"{p['where']}: {p['what']}" for p in report["problems"])
    assert code == 1
    for expected in ("comfy node validate: failed",  # ruff's S307 on the eval
                     "nodes/shortcut.py:1: 'eval(' runs code",
                     "web/js/loader.js:1: 'new Function(' runs code",
                     "lantern_core/fetch.py:1: 'import urllib' opens network",
                     "lantern_core/fetch.py:3: torch.load without weights_only=True",
                     "license file 'LICENSE' is not in the archive",
                     "Operating System classifiers",
                     "Icon '' is not an https address",
                     "tests/conftest.py: ships, but is for development only"):
        assert expected in found, (expected, found)
