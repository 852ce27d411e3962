"""Shared fixtures (tiny models from tiny_models.py); puts the repository root on sys.path."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from tiny_models import TINY_C2I, TINY_T2I, random_gpt, random_vq  # noqa: E402
from lantern_core.models.gpt import LlamaGenGPT  # noqa: E402
from lantern_core.models.vq import VQModel  # noqa: E402


@pytest.fixture
def c2i_model() -> LlamaGenGPT:
    return random_gpt(TINY_C2I)


@pytest.fixture
def t2i_model() -> LlamaGenGPT:
    return random_gpt(TINY_T2I, seed=1)


@pytest.fixture
def tiny_vq() -> VQModel:
    return random_vq()


def pytest_collection_modifyitems(config, items):
    """`cuda` tests need an NVIDIA GPU: on a machine without one they are skipped, and the summary says so."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run `make test-cuda` on one)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "NVIDIA GPU" in str(r.longrepr)]
    if skipped:
        terminalreporter.write_line(f"{len(skipped)} CUDA tests skipped: this machine has no NVIDIA GPU; "
                                    "run `make test-cuda` on one")
