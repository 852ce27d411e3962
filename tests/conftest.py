"""Shared fixtures (tiny models from tiny_models.py, built once per session and guarded against changes);
puts the repository root on sys.path; under pytest-xdist gives each worker its own scratch cache folder and
one torch thread (two workers on two cores)."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from shared_fixtures import GUARDED, GuardedModule  # noqa: E402
from tiny_models import TINY_C2I, TINY_T2I, random_gpt, random_vq  # noqa: E402
from lantern_core.models.gpt import LlamaGenGPT  # noqa: E402
from lantern_core.models.vq import VQModel  # noqa: E402

WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1"... under `pytest -n`; None in one process


def pytest_configure(config):
    """Under xdist: one torch thread per worker (the workers already fill the cores; more threads only
    contend) and a scratch XDG_CACHE_HOME per worker, inherited by the CLI subprocesses the tests start, so the
    `auto` model store and neighbour-table caches are never shared between workers or with the user's."""
    if WORKER is None:
        return
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    config._lantern_scratch = Path(tempfile.mkdtemp(prefix=f"lantern-tests-{WORKER}-"))
    os.environ["XDG_CACHE_HOME"] = str(config._lantern_scratch / "cache")


def pytest_unconfigure(config):
    scratch = getattr(config, "_lantern_scratch", None)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


# Session-scoped tiny modules: built once, checked after every test that used them (GuardedModule).
def _guarded(name: str, module: torch.nn.Module) -> torch.nn.Module:
    GUARDED[name] = GuardedModule.of(name, module)
    return module


@pytest.fixture(scope="session")
def c2i_model() -> LlamaGenGPT:
    """Read-only tiny c2i GPT; a test that changes it fails (deepcopy it first)."""
    return _guarded("c2i_model", random_gpt(TINY_C2I))


@pytest.fixture(scope="session")
def t2i_model() -> LlamaGenGPT:
    """Read-only tiny t2i GPT; a test that changes it fails (deepcopy it first)."""
    return _guarded("t2i_model", random_gpt(TINY_T2I, seed=1))


@pytest.fixture(scope="session")
def tiny_vq() -> VQModel:
    """Read-only tiny VQ tokenizer; a test that changes it fails (deepcopy it first)."""
    return _guarded("tiny_vq", random_vq())


@pytest.fixture(autouse=True)
def _shared_fixtures_stay_unchanged(request):
    yield
    for name in request.fixturenames:
        if name in GUARDED:
            GUARDED[name].check_and_restore()


def pytest_collection_modifyitems(config, items):
    """`cuda` tests need an NVIDIA GPU: on a machine without one they are skipped, and the summary says so."""
    import torch

    for item in items:
        mark = item.get_closest_marker("alone")
        if mark is not None and not (mark.kwargs.get("reason") or mark.args):
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.alone needs a reason (why it cannot share the "
                                    "machine), e.g. @pytest.mark.alone(reason=\"measures the machine's free memory\")")
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


@pytest.fixture(scope="module")
def one_torch_thread():
    """For modules of kilobyte-sized models: one thread is faster than two there (less sync per tiny op)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
