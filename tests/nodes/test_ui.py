"""The web extension in a real browser: Debian's Chromium driven by Playwright against the real server, serving
frontend 1.32.9 (ComfyUI 0.3.75's) or today's (`frontends.NEW`). Loads the shipped example workflow into the
editor, clicks Run like a user, and checks that the sampler node shows the stats text and a 16x16 heat map
(rendered as text/DOM, never as HTML from the server)."""
from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import frontends
import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


ARTIFACTS = REPO / "tests" / "artifacts"  # screenshots for people to look at; git-ignored; one file name per test
_SHARED: dict = {}  # this process's Chromium (one per pytest session, i.e. per xdist worker)


def shared_chromium() -> str:
    """The process's one Chromium (headless, its own profile folder, a DevTools port the OS picks), started on
    first use and again should it have exited; returns its CDP endpoint. A plain process rather than Playwright's
    launch(): Playwright's sync API keeps its event loop marked running between calls for as long as it is
    started, which would break asyncio.run() in the tests that follow on this worker (tests/host/client.py);
    each test connects with a short-lived Playwright instead (editor)."""
    process = _SHARED.get("process")
    if process is None or process.poll() is not None:
        assert Path(CHROMIUM).exists(), "install Debian's chromium (make browser)"
        profile = Path(tempfile.mkdtemp(prefix="chromium-"))
        process = subprocess.Popen([CHROMIUM, "--headless=new", "--remote-debugging-port=0",
                                    f"--user-data-dir={profile}", *ARGS, "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        for _ in range(600):  # written once the DevTools server listens
            if port_file.is_file() and port_file.read_text().strip():
                break
            assert process.poll() is None, f"chromium exited with {process.returncode}"
            time.sleep(0.05)
        _SHARED.update(process=process, profile=profile,
                       endpoint=f"http://127.0.0.1:{port_file.read_text().splitlines()[0].strip()}")
    return _SHARED["endpoint"]


def close_shared_chromium() -> None:
    process, profile = _SHARED.pop("process", None), _SHARED.pop("profile", None)
    if process is not None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if profile is not None:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="session")
def browser():
    """The CDP endpoint of one Chromium for the session (the browser test modules import this fixture; they
    share the process's Chromium); every test opens its own browser context in it (editor), so cookies,
    localStorage and caches never carry over."""
    yield shared_chromium()
    close_shared_chromium()  # at the session's end; a second module's copy of this fixture finds nothing to close


def screenshot(page, name: str) -> None:
    """A screenshot under tests/artifacts/, named after the test's parameters (one writer per file)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name))


@contextlib.contextmanager
def editor(browser: str, server, errors: list):
    """A fresh context of the shared Chromium (`browser`: its CDP endpoint) on the ComfyUI editor, once the
    pack's nodes are registered; page errors go to `errors`. The context (its storage, cookies, pages) is
    closed on the way out, and the connection with it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        connection = p.chromium.connect_over_cdp(browser)
        ctx = connection.new_context(viewport={"width": 1600, "height": 900})
        try:
            page = ctx.new_page()
            page.add_init_script("localStorage.setItem('vueNodesBannerDismissed', 'true')")
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server.url, wait_until="domcontentloaded", timeout=90000)
            page.wait_for_function("() => window.app?.graph && window.LiteGraph?.registered_node_types"
                                   " && 'LanternSampler' in window.LiteGraph.registered_node_types", timeout=120000)
            yield ctx, page
        finally:
            ctx.close()
            connection.close()  # disconnects; the shared Chromium keeps running


def run_in_browser(browser, server, workflow: dict, vue_nodes: bool, shot: str) -> dict:
    """Load `workflow` into the editor, click Run, wait for the stats panel and the saved image."""
    server.post("/api/settings/Comfy.VueNodes.Enabled", vue_nodes)
    errors = []
    with editor(browser, server, errors) as (ctx, page):
        assert page.evaluate("() => window.app.extensions.some(e => e.name === 'lantern.stats')")
        page.evaluate("async (wf) => { await window.app.loadGraphData(wf); }", workflow)
        sampler_id = page.evaluate("() => String(window.app.graph._nodes.find(n => n.type === 'LanternSampler').id)")
        page.get_by_role("button", name="Run").first.click()
        page.wait_for_selector(".lantern-stats .lantern-heatmap", timeout=150000)
        info = page.evaluate("""() => {
            const root = document.querySelector('.lantern-stats');
            const colours = new Set([...root.querySelectorAll('.lantern-heatmap-cell')].map(c => c.style.background));
            return {text: root.innerText, cells: root.querySelectorAll('.lantern-heatmap-cell').length,
                    colours: colours.size, html: root.innerHTML.includes('<script')};
        }""")
        save_id = page.evaluate("() => String(window.app.graph._nodes.find(n => n.type === 'SaveImage').id)")
        page.wait_for_function(f"() => window.app.nodeOutputs?.['{save_id}']?.images?.length > 0", timeout=150000)
        info["saved"] = page.evaluate(f"() => window.app.nodeOutputs['{save_id}'].images[0]")
        page.wait_for_timeout(500)
        screenshot(page, shot)
        info["widgets"] = page.evaluate(f"() => window.app.graph.getNodeById({sampler_id}).widgets.map(w => w.name)")
        info["workflow"] = page.evaluate("() => window.app.graph.serialize()")
    info["errors"] = errors
    return info


def with_seed(workflow: dict, seed: int, class_name: str = "cat") -> dict:
    for node in workflow["nodes"]:
        if node["type"] == "LanternConditioning":
            node["widgets_values"][0] = class_name
        if node["type"] == "LanternSampler":  # a seed of its own: an identical prompt would be served from cache
            node["widgets_values"][4] = seed
    return workflow


@pytest.mark.parametrize("vue_nodes", [False, True], ids=["litegraph-nodes", "vue-nodes"])
@pytest.mark.parametrize("frontend", frontends.ALL)
def test_stats_panel_and_heat_map_render_after_run(browser, frontend_server, frontend, vue_nodes):
    workflow = with_seed(json.loads((REPO / "example_workflows" / "lantern_embedded_model.json").read_text()),
                         100 + int(vue_nodes) + 10 * frontends.ALL.index(frontend))
    info = run_in_browser(browser, frontend_server, workflow, vue_nodes,
                          f"ui_stats_heatmap_{frontend}_{'vue' if vue_nodes else 'litegraph'}.png")
    assert info["saved"]["type"] == "output" and info["saved"]["filename"].endswith(".png")
    assert info["cells"] == 256, info
    assert "tok/s" in info["text"] and "256 forward passes" in info["text"] and "for: cat" in info["text"]
    assert "plain AR" in info["text"] and "fell back" not in info["text"]  # eager by choice on a CPU: no fallback
    assert "lantern_stats" in info["widgets"] and not info["html"]
    sampler = next(n for n in info["workflow"]["nodes"] if n["type"] == "LanternSampler")
    assert len(sampler["widgets_values"]) == 7  # the stats widget is never saved into the workflow
    assert not info["errors"], info["errors"]


@pytest.mark.parametrize("name,seed,label,expected,absent", [
    ("lantern_pp_embedded_model", 300, "rocket",
     ["mode: lantern_pp", "tree: auto_", "acceptance by depth:", "drafter: lantern-tiny-photos (embedded)"],
     "(plain AR: one token per forward)"),
    ("lantern_sjd_embedded_model", 301, "cat",
     ["mode: sjd_coupled", "window: coupled jacobi w", "acceptance by window position:",
      "drafter: none (training-free)"], "tree:"),
], ids=["lantern_pp", "sjd_coupled"])
def test_speculative_workflows_show_their_tree_or_window_and_a_lit_heat_map(browser, server, name, seed, label,
                                                                             expected, absent):
    workflow = with_seed(json.loads((REPO / "example_workflows" / f"{name}.json").read_text()), seed, label)
    info = run_in_browser(browser, server, workflow, False, f"ui_{name}_stats.png")
    assert info["cells"] == 256 and info["colours"] > 1  # speculative steps accept different counts
    for text in expected:
        assert text in info["text"], (text, info["text"])
    assert absent not in info["text"] and not info["html"]
    assert not info["errors"], info["errors"]


HOSTILE = ['<img src=x onerror="window.__pwned=1">', "<script>window.__pwned=1</script>", "<b>bold</b>"]


@pytest.mark.parametrize("frontend", frontends.ALL)
def test_stats_panel_renders_hostile_strings_as_text_not_html(browser, frontend_server, frontend):
    """Stats whose every shown field (names, prompts, numbers as strings) carries markup: the panel shows the
    markup literally, builds no img/script/b element, runs no handler, and the page reports no error."""
    hostile = "".join(HOSTILE)
    text_fields = ["mode", "tokens_per_s", "forward_passes", "batch", "image_tokens", "wall_time_s",
                   "mean_accepted_length", "tree", "drafter", "mean_tvd_spent", "max_tvd_spent"]
    stats = {name: f"{name}={hostile}" for name in text_fields}
    stats.update(speculative=True, relaxed_tokens="3", acceptance_by_depth=[hostile, 0.5],
                 conditions=[f"condition={hostile}", *HOSTILE], heatmap=[[1, 2], [3, hostile]],
                 steps={"fell_back": True, "graphs": "partial", "eager": f"eager={hostile}", "replayed": 2,
                        "compile": "failed", "capture_error": f"capture_error={hostile}"})
    server = frontend_server
    server.post("/api/settings/Comfy.VueNodes.Enabled", False)
    errors = []
    with editor(browser, server, errors) as (ctx, page):
        page.evaluate("""(stats) => {
            window.app.graph.clear();
            const node = window.LiteGraph.createNode('LanternSampler');
            node.pos = [400, 120];
            window.app.graph.add(node);
            node.onExecuted({lantern_stats: [stats]});
            window.app.graph.setDirtyCanvas(true, true);
        }""", stats)
        page.wait_for_selector(".lantern-stats .lantern-stats-mode", state="attached", timeout=30000)
        page.wait_for_timeout(1000)  # time for an <img onerror> to fire, had one been made
        info = page.evaluate("""() => {
            const node = window.app.graph._nodes.find(n => n.type === 'LanternSampler');
            const root = node.widgets.find(w => w.name === 'lantern_stats').element;
            return {text: root.textContent, made: root.querySelectorAll('img, script, b').length,
                    anywhere: document.querySelectorAll('.lantern-stats img, .lantern-stats script, .lantern-stats b').length,
                    inDocument: document.contains(root), pwned: typeof window.__pwned,
                    lines: [...root.children].map(c => c.className)};
        }""")
        screenshot(page, f"ui_stats_hostile_{frontend}.png")
    assert info["inDocument"], info
    assert {k: info[k] for k in ("made", "anywhere", "pwned")} == {"made": 0, "anywhere": 0, "pwned": "undefined"}
    for name in text_fields:
        assert f"{name}={hostile}" in info["text"], (name, info["text"])
    assert f"for: condition={hostile}, {', '.join(HOSTILE)}" in info["text"], info["text"]
    assert "lantern-stats-relaxed" in info["lines"] and "lantern-heatmap" in info["lines"], info["lines"]
    assert "lantern-stats-fallback" in info["lines"], info["lines"]  # a fallback is never hidden
    assert f"fell back to eager for eager={hostile}" in info["text"] and f"capture_error={hostile}" in info["text"]
    assert not errors, errors
