// LANTERN decoding config: on the LiteGraph canvas, show only the widgets the chosen mode reads (and, below it,
// the chosen tree and relaxed rule). Hidden widgets keep their values, which the saved workflow still holds;
// switching back shows them again. The Vue node renderer of frontend 1.32.9 copies a node's widgets when a
// value changes and does not follow later `hidden` changes, so there every widget stays shown (a hidden one
// could never come back); the canvas skips `widget.hidden` as it draws.
import { app } from "../../../scripts/app.js"; // served at /extensions/<pack>/js/

const NODE = "LanternDecodingConfig";
const EAGLE = ["eagle_depth", "eagle_top_k", "eagle_nodes"];
const JACOBI = ["jacobi_window", "jacobi_init"];
const USES = {
  ar: [],
  eagle2: EAGLE,
  lantern: [...EAGLE, "lantern_k", "delta"],
  static_tree: ["tree"],
  lantern_pp: ["tree", "lantern_k", "lam"],
  sjd: JACOBI,
  sjd_coupled: JACOBI,
  sjd_relaxed: [...JACOBI, "sjd_relaxation", "lantern_k"],
};
const ALWAYS = ["mode", "compile"];
const RULE_PARAMETER = { lantern: "delta", lantern_pp: "lam", gsd: "gsd_gap" };
const DEPENDS = ["mode", "tree", "sjd_relaxation"]; // widgets whose value changes what is shown

// The names of the widgets a node with these widget values reads.
export function usedWidgets(values) {
  const shown = new Set([...ALWAYS, ...(USES[values.mode] ?? Object.keys(values))]);
  if (shown.has("tree")) {
    if (values.tree === "chain") shown.add("chain_length");
    if (values.tree === "custom") shown.add("custom_tree");
  }
  if (values.mode === "sjd_relaxed" && RULE_PARAMETER[values.sjd_relaxation]) {
    shown.add(RULE_PARAMETER[values.sjd_relaxation]);
  }
  return shown;
}

function vueNodes() {
  return Boolean(window.LiteGraph?.vueNodesMode);
}

function showUsedWidgets(node) {
  const widgets = node.widgets ?? [];
  const shown = vueNodes() ? new Set(widgets.map((w) => w.name))
    : usedWidgets(Object.fromEntries(widgets.map((w) => [w.name, w.value])));
  let changed = false;
  for (const widget of widgets) {
    const hide = !shown.has(widget.name);
    if (Boolean(widget.hidden) === hide) continue;
    widget.hidden = hide;
    changed = true;
  }
  if (changed) {
    const height = node.computeSize?.()[1];
    if (height && node.size) node.setSize?.([node.size[0], height]);
    node.setDirtyCanvas?.(true, true);
  }
}

app.registerExtension({
  name: "lantern.decoding_widgets",
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
