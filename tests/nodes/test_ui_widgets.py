"""Lantern: Decoding Config in a real browser, on frontend 1.32.9 (ComfyUI 0.3.75's) and today's, in both node
renderers (the LiteGraph canvas and Vue nodes): it shows only the widgets the chosen mode reads, switching as
the mode, tree or relaxed rule changes, back and forth, and the node fits them (no empty band where hidden
widgets were, also when a saved workflow brings a larger size); the hidden widgets keep their values in the
saved workflow. In the Vue renderer what is checked is what the page draws: the labels in the node's
rendered text, the widget rows on screen and the node's drawn height."""
from __future__ import annotations

import frontends
import pytest

from test_ui import browser, editor, screenshot  # noqa: F401 (browser: the shared fixture)

ALWAYS = ["mode", "compile"]
LABELS = {"lam": "lambda"}  # widgets shown under another name
EXPECTED = {  # (mode, tree, sjd_relaxation) -> the widgets shown besides mode and compile
    ("ar", "auto", "lantern_pp"): [],
    ("eagle2", "auto", "lantern_pp"): ["eagle_depth", "eagle_top_k", "eagle_nodes"],
    ("lantern", "auto", "lantern_pp"): ["lantern_k", "delta", "eagle_depth", "eagle_top_k", "eagle_nodes"],
    ("static_tree", "auto", "lantern_pp"): ["tree"],
    ("static_tree", "chain", "lantern_pp"): ["tree", "chain_length"],
    ("lantern_pp", "custom", "lantern_pp"): ["tree", "custom_tree", "lantern_k", "lam"],
    ("sjd", "custom", "lantern_pp"): ["jacobi_window", "jacobi_init", "jacobi_rows", "jacobi_continuation",
                                      "jacobi_proactive"],
    ("sjd_coupled", "auto", "lantern_pp"): ["jacobi_window", "jacobi_init", "jacobi_rows", "jacobi_proactive"],
    ("sjd_relaxed", "auto", "lantern_pp"): ["lantern_k", "lam", "jacobi_window", "jacobi_init", "sjd_relaxation",
                                            "jacobi_rows"],
    ("sjd_relaxed", "auto", "gsd"): ["lantern_k", "jacobi_window", "jacobi_init", "sjd_relaxation", "gsd_gap",
                                     "jacobi_rows"],
    ("sjd_relaxed", "auto", "lantern"): ["lantern_k", "delta", "jacobi_window", "jacobi_init", "sjd_relaxation",
                                         "jacobi_rows"],
    ("sjd_2d_relaxed", "auto", "lantern_pp"): ["jacobi_window", "jacobi_init", "jacobi_rows", "jacobi_row_window"],
    ("ar", "auto", "lantern"): [],
}

# How well the node fits its visible widgets: on the canvas node.size against what the frontend computes for
# them (after a frame, so the canvas has laid the node out); in the Vue renderer the drawn node's bottom against
# its last visible widget row (what is left is the footer badge and padding, about 30 px).
FIT = """async (node) => {
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    const root = document.querySelector(`[data-node-id="${node.id}"]`);
    const rows = root ? [...root.querySelectorAll('.lg-node-widget')].filter(r => r.getClientRects().length > 0) : [];
    return {excess: node.size[1] - node.computeSize()[1],
            gap: rows.length ? root.getBoundingClientRect().bottom - Math.max(...rows.map(r => r.getBoundingClientRect().bottom)) : null};
}"""
GAP_PX = 60  # more than the footer; an empty band of hidden widgets is 100-400 px

SWITCH = """async ([mode, tree, relaxation, shown, hidden, vue]) => {
    const node = window.app.graph._nodes.find(n => n.type === 'LanternDecodingConfig');
    for (const [name, value] of [['tree', tree], ['sjd_relaxation', relaxation], ['mode', mode]]) {
        const widget = node.widgets.find(w => w.name === name);
        widget.value = value;
        widget.callback?.(value);  // what a person's choice in the combo does
    }
    const drawn = () => {  // the Vue renderer redraws on its next update, not at once
        const root = document.querySelector(`[data-node-id="${node.id}"]`);
        return root ? new Set(root.innerText.split('\\n')) : new Set();
    };
    for (let i = 0; vue && i < 100; i++) {
        const lines = drawn();
        if (shown.every(l => lines.has(l)) && !hidden.some(l => lines.has(l))) break;
        await new Promise(r => setTimeout(r, 100));
    }
    const rows = [...document.querySelectorAll(`[data-node-id="${node.id}"] .lg-node-widget`)];
    return {canvas: node.widgets.filter(w => node.isWidgetVisible(w)).map(w => w.name), lines: [...drawn()],
            rows: rows.filter(r => r.getClientRects().length > 0).length, fit: await (FIT)(node)};
}""".replace("FIT", FIT)


RELOAD = """async ([mode, vue, rowCount]) => {
    const workflow = window.app.graph.serialize();
    const saved = workflow.nodes.find(n => n.type === 'LanternDecodingConfig');
    saved.widgets_values[0] = mode;
    saved.size = [400, 640];  // as saved while another mode showed many widgets
    await window.app.loadGraphData(workflow);
    const node = window.app.graph._nodes.find(n => n.type === 'LanternDecodingConfig');
    const rows = () => [...document.querySelectorAll(`[data-node-id="${node.id}"] .lg-node-widget`)]
        .filter(r => r.getClientRects().length > 0);
    for (let i = 0; vue && i < 100 && rows().length !== rowCount; i++) await new Promise(r => setTimeout(r, 100));
    const root = document.querySelector(`[data-node-id="${node.id}"]`);
    return {canvas: node.widgets.filter(w => node.isWidgetVisible(w)).map(w => w.name), rows: rows().length,
            lines: root ? root.innerText.split('\\n') : [], fit: await (FIT)(node)};
}""".replace("FIT", FIT)


@pytest.mark.parametrize("vue_nodes", [False, True], ids=["litegraph-nodes", "vue-nodes"])
@pytest.mark.parametrize("frontend", frontends.ALL)
def test_decoding_config_shows_only_the_widgets_its_mode_reads(browser, frontend_server, frontend, vue_nodes):
    server = frontend_server
    server.post("/api/settings/Comfy.VueNodes.Enabled", vue_nodes)
    errors = []
    with editor(browser, server, errors) as (ctx, page):
        assert page.evaluate("() => window.app.extensions.some(e => e.name === 'lantern.decoding_widgets')")
        page.evaluate("""() => {
            window.app.graph.clear();
            const node = window.LiteGraph.createNode('LanternDecodingConfig');
            node.pos = [300, 100];
            window.app.graph.add(node);
            window.app.graph.setDirtyCanvas(true, true);
        }""")
        page.wait_for_timeout(1500)
        every = {name for shown in EXPECTED.values() for name in shown} | set(ALWAYS)
        label = lambda names: sorted(LABELS.get(n, n) for n in names)  # noqa: E731
        seen = {}
        plain = every - {"custom_tree", "lam"}  # a text area and a renamed widget draw their labels otherwise
        for key, shown in EXPECTED.items():
            visible = set(ALWAYS + shown)
            seen[key] = page.evaluate(SWITCH, [*key, label(visible & plain), label(plain - visible), vue_nodes])
        saved = page.evaluate("() => window.app.graph.serialize().nodes.find(n => n.type === 'LanternDecodingConfig')")
        shown_after_reload = len(ALWAYS + EXPECTED["sjd_coupled", "auto", "lantern_pp"])  # 6: jacobi_proactive joined
        # a saved workflow opens with its mode's widgets, fitted
        reloaded = page.evaluate(RELOAD, ["sjd_coupled", vue_nodes, shown_after_reload])
        screenshot(page, f"ui_widgets_{frontend}_{'vue' if vue_nodes else 'litegraph'}.png")
    assert sorted(reloaded["canvas"]) == sorted(ALWAYS + EXPECTED["sjd_coupled", "auto", "lantern_pp"]), reloaded
    if vue_nodes:
        assert reloaded["rows"] == shown_after_reload, reloaded
        assert "jacobi_window" in reloaded["lines"] and "tree" not in reloaded["lines"], reloaded
    for key, result in [*seen.items(), ("reloaded", reloaded)]:
        fit = result["fit"]
        if vue_nodes:
            assert fit["gap"] is not None and 0 <= fit["gap"] <= GAP_PX, (key, fit)
        else:
            assert abs(fit["excess"]) <= 1, (key, fit)  # node.size is what the canvas draws
    for key, shown in EXPECTED.items():
        visible = set(ALWAYS + shown)
        assert sorted(seen[key]["canvas"]) == sorted(visible), (key, seen[key])  # the canvas renderer's own test
        if vue_nodes:  # what the Vue renderer drew: the labels that render as a line of their own, and the rows
            lines = set(seen[key]["lines"])
            assert set(label(visible & plain)) <= lines, (key, seen[key]["lines"])
            assert not set(label(plain - visible)) & lines, (key, seen[key]["lines"])
            assert seen[key]["rows"] == len(visible), (key, seen[key]["rows"])
    assert len(saved["widgets_values"]) == 20 and saved["widgets_values"][0] == "ar"  # every value is kept
    assert not errors, errors
