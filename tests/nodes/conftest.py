"""Node tests against a real ComfyUI 0.3.75 (from `make host`): in-process contract tests import the
pack the way ComfyUI does; server tests start `main.py --cpu` with the pack linked in."""
from __future__ import annotations

import asyncio
import logging
import importlib.util
import socket
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMFY = REPO / ".host" / "ComfyUI"

sys.path.insert(0, str(REPO / "tests" / "host"))


def pytest_configure(config):
    if not (COMFY / "main.py").is_file():
        raise pytest.UsageError(f"ComfyUI is missing at {COMFY}: run `make host` (make test does it)")


@pytest.fixture(scope="session")
def mm(tmp_path_factory):
    """ComfyUI's modules imported in this process (CPU mode), with a scratch models directory."""
    if str(COMFY) not in sys.path:
        sys.path.insert(0, str(COMFY))
    import comfy.cli_args

    comfy.cli_args.args.cpu = True
    import folder_paths

    models = tmp_path_factory.mktemp("models")
    folder_paths.models_dir = str(models)
    import comfy.model_management
    import comfy.utils  # noqa: F401

    return comfy.model_management


@pytest.fixture(scope="session")
def pack(mm):
    """The pack imported as a package under its folder name, as ComfyUI's loader does."""
    spec = importlib.util.spec_from_file_location("lantern_pack", REPO / "__init__.py",
                                                  submodule_search_locations=[str(REPO)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["lantern_pack"] = module
    spec.loader.exec_module(module)
    module.nodes.paths.register_folders()
    return module


@pytest.fixture(scope="session")
def node(pack):
    """The pack's node classes by node id, as ComfyUI registers them."""
    classes = asyncio.run(pack.nodes.LanternExtension().get_node_list())
    return {cls.define_schema().node_id: cls for cls in classes}


@pytest.fixture(scope="session")
def model(pack, node):
    """The embedded model loaded through Lantern: Load Model (fp32 on the CPU)."""
    return node["LanternModelLoader"].execute(checkpoint=pack.nodes.paths.EMBEDDED, vq_tokenizer="auto",
                                              text_encoder="none", dtype="auto").args[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    from comfy_server import ComfyServer

    base = tmp_path_factory.mktemp("comfy_base")
    srv = ComfyServer(base, free_port(), extra_args=("--preview-method", "auto"))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def server_new_frontend(tmp_path_factory):
    """The same server serving frontend 1.58.1 (--front-end-root). Its console shows 404s for endpoints the
    0.3.75 server lacks (the jobs API); the editor and the node pack's extensions work."""
    import frontends
    from comfy_server import ComfyServer

    if not (frontends.NEW_ROOT / "index.html").is_file():
        pytest.fail(f"frontend {frontends.NEW} is missing at {frontends.NEW_ROOT}: run `make host` (make test does it)")
    base = tmp_path_factory.mktemp("comfy_base_new_frontend")
    srv = ComfyServer(base, free_port(), extra_args=("--preview-method", "auto", "--front-end-root",
                                                     str(frontends.NEW_ROOT)))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def frontend_server(request):
    """The server for the test's `frontend` parameter: 1.32.9 (ComfyUI 0.3.75's own) or today's."""
    import frontends

    return request.getfixturevalue("server" if request.getfixturevalue("frontend") == frontends.SHIPPED
                                   else "server_new_frontend")


SERVER_FIXTURES = ("server", "server_new_frontend", "frontend_server")


@pytest.fixture(autouse=True)
def _shared_server_left_clean(request):
    """Tests share a server per session: after each, its models folder, settings file and queue are put back
    (tests/host/server_state.py). Settings are UI choices a test makes for itself; an added model file or a
    prompt still queued or running is a leak that fails the test that left it."""
    names = [n for n in SERVER_FIXTURES if n in request.fixturenames]
    if not names:
        yield
        return
    import server_state

    servers = list({id(s): s for s in (request.getfixturevalue(n) for n in names)}.values())
    before = [server_state.read_state(s) for s in servers]
    yield
    unexpected = [leak for s, state in zip(servers, before) for leak in server_state.restore_state(s, state).unexpected()]
    assert not unexpected, "this test left the shared server changed (now put back): " + "; ".join(unexpected)


@pytest.fixture(autouse=True)
def _runs_are_planned(caplog):
    """Every sampler run in these tests plans its memory: the sampler's fallback (run without a reservation
    when the dry run fails) exists for bugs the tests miss, so here it fails the test."""
    caplog.set_level(logging.WARNING, logger="lantern_pack.sampler")
    yield
    records = caplog.get_records("setup") + caplog.get_records("call")
    failed = [r for r in records if "could not plan this run's memory" in r.getMessage()]
    assert not failed, failed[0].exc_text
