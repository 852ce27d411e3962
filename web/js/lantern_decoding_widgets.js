// LANTERN decoding config: show only the widgets the chosen mode reads (and, below it, the chosen tree and
// relaxed rule), in both node renderers, and fit the node to them. Hidden widgets keep their values, which the
// saved workflow still holds; switching back shows them again. Tested on frontends 1.32.9 and 1.58.1.
// - The supported flags first: `widget.hidden` (the canvas skips it) and `widget.options.hidden` (what Vue
//   nodes read; 1.58.1's `hidden` setter writes both). Then node.setSize to the height computeSize gives.
// - Fallbacks, each only where the running frontend is seen to need it (1.32.9):
//   - its canvas layout gives hidden widgets their height and grows the node back: hidden widgets then
//     measure zero (giveNoHeight);
//   - its Vue renderer copies a node's widgets into a snapshot and never re-reads options.hidden (a widget
//     hidden through it could not come back): options stay untouched there, and the renderer's one
//     `.lg-node-widget` row per widget is hidden in the DOM (display: none), again after every re-render;
//     if the rows do not line up one-to-one with the widgets, all stay shown;
//   - its Vue nodes take their height from a layout store node.setSize does not reach: the element's
//     --node-height floor is released so it shrinks to its rows (the renderer stores the measured size).
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

// A Vue node (re)mounts with the size its layout store holds, which a loaded workflow sets after
// loadedGraphNode: fit each newly mounted node element once, and again after its widgets changed.
const fittedElements = new WeakSet();
const refit = new WeakSet();

// Frontend 1.32.9's Vue nodes draw their height from a layout store that node.setSize does not reach; the
// element's --node-height is its minimum height. There (only) it is released so the element shrinks to its
// rows; the renderer measures the element and stores that size itself.
function releaseVueHeight(node, root) {
  if (hasVisibilityModel(node.widgets?.[0] ?? {})) return;
  if (root.style.getPropertyValue("--node-height") !== "0px") root.style.setProperty("--node-height", "0px");
}

let pending = false;
function visitVueNodesSoon() {
  if (pending || !vueNodes()) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    for (const node of app.canvas?.graph?.nodes ?? app.canvas?.graph?._nodes ?? []) {
      if (node.comfyClass !== NODE) continue;
      hideVueRows(node);
      const root = document.querySelector(`[data-node-id="${node.id}"]`);
      if (root && (!fittedElements.has(root) || refit.has(node))) {
        fittedElements.add(root);
        refit.delete(node);
        fitHeight(node);
        releaseVueHeight(node, root);
      }
    }
  });
}

function setHidden(widget, hide) {
  widget.hidden = hide; // the canvas skips it
  if (hasVisibilityModel(widget) && widget.options && Boolean(widget.options.hidden) !== hide) {
    widget.options.hidden = hide; // what Vue nodes read (1.58.1's hidden setter already wrote it)
  }
  if (!hide || layoutCountsHidden) giveNoHeight(widget, hide);
}

// Frontends with a widget visibility model define `hidden` as an accessor and re-render Vue nodes when it or
// options.hidden changes. Frontend 1.32.9 has a plain property and a Vue snapshot that never re-reads
// options.hidden (a row hidden through it could not come back): there options stay untouched and the rows
// are hidden in the DOM instead (hideVueRows).
function hasVisibilityModel(widget) {
  for (let proto = Object.getPrototypeOf(widget); proto; proto = Object.getPrototypeOf(proto)) {
    const descriptor = Object.getOwnPropertyDescriptor(proto, "hidden");
    if (descriptor) return typeof descriptor.set === "function";
  }
  return false;
}

// Frontend 1.32.9's canvas layout (LGraphNode.arrange) still gives hidden widgets their height and grows the
// node back to hold them; there, and only where that is seen, a hidden widget measures zero.
let layoutCountsHidden = false;
const OWN_SIZE = Symbol("lantern.computeSize");

function giveNoHeight(widget, hide) {
  if (hide && !(OWN_SIZE in widget)) {
    widget[OWN_SIZE] = Object.hasOwn(widget, "computeSize") ? widget.computeSize : undefined;
    widget.computeSize = () => [0, -4]; // the layout adds 4 px between widgets
  } else if (!hide && OWN_SIZE in widget) {
    if (widget[OWN_SIZE]) widget.computeSize = widget[OWN_SIZE];
    else delete widget.computeSize;
    delete widget[OWN_SIZE];
  }
}

// Shrink (or grow) the node to its visible widgets, in either renderer: both size a node from node.size.
function fitHeight(node) {
  const height = node.computeSize?.()[1];
  if (!height || !node.size) return;
  if (Math.abs(node.size[1] - height) > 0.5) node.setSize?.([node.size[0], height]);
  if (!layoutCountsHidden && node.graph && typeof node.arrange === "function") {
    try {
      node.arrange(); // what the canvas does before it draws the node
    } catch {
      return; // not laid out yet (no canvas): the next change fits it
    }
    if (node.size[1] > height + 0.5) {
      layoutCountsHidden = true;
      for (const widget of node.widgets ?? []) if (widget.hidden) giveNoHeight(widget, true);
      node.setSize?.([node.size[0], height]);
    }
  }
  node.setDirtyCanvas?.(true, true);
}

function showUsedWidgets(node) {
  const widgets = node.widgets ?? [];
  const shown = shownWidgets(node);
  let changed = false;
  for (const widget of widgets) {
    const hide = !shown.has(widget.name);
    if (Boolean(widget.hidden) === hide && Boolean(widget.options?.hidden) === hide) continue;
    setHidden(widget, hide);
    changed = true;
  }
  if (changed) fitHeight(node);
  if (changed) refit.add(node);
  if (vueNodes()) visitVueNodesSoon(); // after the renderer's own update
}

app.registerExtension({
  name: "lantern.decoding_widgets",
  setup() {
    // Vue nodes mount, re-render and remount (renderer switch, subgraph navigation) on their own schedule
    new MutationObserver(visitVueNodesSoon).observe(document.body, { childList: true, subtree: true });
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
    if (node.comfyClass !== NODE) return;
    showUsedWidgets(node); // after a saved workflow restored its values
    fitHeight(node); // and its saved size, which may hold widgets another mode showed
  },
});
