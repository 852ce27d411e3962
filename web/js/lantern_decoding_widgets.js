// LANTERN decoding config: show only the widgets the chosen mode reads (and, below it, the chosen tree and
// relaxed rule), in both node renderers. Hidden widgets keep their values, which the saved workflow still
// holds; switching back shows them again.
// - LiteGraph canvas: `widget.hidden`, which the canvas skips as it draws.
// - Vue nodes (frontend 1.32.9): the renderer copies a node's widgets into a snapshot when a value changes
//   and never re-reads a visibility flag, so a widget hidden through it could not come back. It draws one
//   `.lg-node-widget` row per widget, in order, under the node's `[data-node-id]` element: we hide the
//   unused rows there (display: none), again after every re-render (one document observer, at most once
//   per frame). If the rows do not line up one-to-one with the widgets (another frontend), all stay shown.
import { app } from "../../../scripts/app.js"; // served at /extensions/<pack>/js/

const NODE = "LanternDecodingConfig";
const EAGLE = ["eagle_depth", "eagle_top_k", "eagle_nodes"];
const JACOBI = ["jacobi_window", "jacobi_init", "jacobi_rows"];
const ROWS = ["jacobi_row_window", "jacobi_row_offset"]; // the 2-D geometry, read when jacobi_rows > 1
const USES = {
  ar: [],
  eagle2: EAGLE,
  lantern: [...EAGLE, "lantern_k", "delta"],
  static_tree: ["tree"],
  lantern_pp: ["tree", "lantern_k", "lam"],
  sjd: [...JACOBI, "jacobi_continuation", "jacobi_proactive"],
  sjd_coupled: [...JACOBI, "jacobi_proactive"],
  sjd_relaxed: [...JACOBI, "sjd_relaxation", "lantern_k"],
  sjd_2d_relaxed: [...JACOBI, "jacobi_row_window"], // rows at their own fronts: no fixed offset
};
const ALWAYS = ["mode", "compile"];
const RULE_PARAMETER = { lantern: "delta", lantern_pp: "lam", gsd: "gsd_gap" };
const DEPENDS = ["mode", "tree", "sjd_relaxation", "jacobi_rows"]; // widgets whose value changes what is shown

// The names of the widgets a node with these widget values reads.
export function usedWidgets(values) {
  const shown = new Set([...ALWAYS, ...(USES[values.mode] ?? Object.keys(values))]);
  if (shown.has("tree")) {
    if (values.tree === "chain") shown.add("chain_length");
    if (values.tree === "custom") shown.add("custom_tree");
  }
  if (shown.has("jacobi_rows") && Number(values.jacobi_rows) > 1 && values.mode !== "sjd_2d_relaxed") {
    ROWS.forEach((name) => shown.add(name));
  }
  if (values.mode === "sjd_relaxed" && RULE_PARAMETER[values.sjd_relaxation]) {
    shown.add(RULE_PARAMETER[values.sjd_relaxation]);
  }
  return shown;
}

function vueNodes() {
  return Boolean(window.LiteGraph?.vueNodesMode);
}

function shownWidgets(node) {
  return usedWidgets(Object.fromEntries((node.widgets ?? []).map((w) => [w.name, w.value])));
}

// The Vue renderer's rows of `node`, one per widget in order, or null when they do not line up.
function vueRows(node) {
  const root = document.querySelector(`[data-node-id="${node.id}"]`);
  const list = root?.querySelector(".lg-node-widgets");
  if (!list) return null;
  const rows = [...list.children].filter((el) => el.classList.contains("lg-node-widget"));
  return rows.length === (node.widgets ?? []).length ? rows : null;
}

function hideVueRows(node) {
  const rows = vueRows(node);
  if (!rows) return;
  const shown = shownWidgets(node);
  rows.forEach((row, i) => {
    const display = shown.has(node.widgets[i].name) ? "" : "none";
    if (row.style.display !== display) row.style.display = display;
  });
}

let pending = false;
function hideAllVueRowsSoon() {
  if (pending || !vueNodes()) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    for (const node of app.canvas?.graph?._nodes ?? []) {
      if (node.comfyClass === NODE) hideVueRows(node);
    }
  });
}

function showUsedWidgets(node) {
  const widgets = node.widgets ?? [];
  const shown = shownWidgets(node);
  let changed = false;
  for (const widget of widgets) {
    const hide = !shown.has(widget.name);
    if (Boolean(widget.hidden) === hide) continue;
    widget.hidden = hide;
    changed = true;
  }
  if (vueNodes()) {
    hideAllVueRowsSoon(); // after the renderer's own update
  } else if (changed) {
    const height = node.computeSize?.()[1];
    if (height && node.size) node.setSize?.([node.size[0], height]);
    node.setDirtyCanvas?.(true, true);
  }
}

app.registerExtension({
  name: "lantern.decoding_widgets",
  setup() {
    // Vue nodes mount, re-render and remount (renderer switch, subgraph navigation) on their own schedule
    new MutationObserver(hideAllVueRowsSoon).observe(document.body, { childList: true, subtree: true });
  },
  nodeCreated(node) {
    if (node.comfyClass !== NODE) return;
    for (const name of DEPENDS) {
      const widget = node.widgets?.find((w) => w.name === name);
      if (!widget) continue;
      const previous = widget.callback;
      widget.callback = function (...args) {
        const result = previous?.apply(this, args);
        showUsedWidgets(node);
        return result;
      };
    }
    showUsedWidgets(node);
  },
  loadedGraphNode(node) {
    if (node.comfyClass === NODE) showUsedWidgets(node); // after a saved workflow restored its values
  },
});
