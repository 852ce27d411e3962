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
