// LANTERN stats panel: after each run, the sampler nodes show their statistics and an acceptance heat map
// (tokens accepted per forward pass, per token-grid cell) in a DOM widget. Everything is rendered with
// textContent and styled elements: no HTML from the server is ever interpreted, no canvas drawing.
import { app } from "../../../scripts/app.js"; // served at /extensions/<pack>/js/

const NODES = new Set(["LanternSampler", "LanternGenerate"]);
const WIDGET = "lantern_stats";

function cellColour(value, max) {
  if (max <= 1) return "hsl(210, 25%, 45%)"; // plain AR: one token per forward everywhere
  const t = Math.min(1, Math.max(0, (value - 1) / (max - 1)));
  return `hsl(${Math.round(210 - 170 * t)}, 80%, ${Math.round(35 + 20 * t)}%)`;
}

function line(text, cls) {
  const div = document.createElement("div");
  div.className = cls;
  div.textContent = text;
  return div;
}

export function renderStats(root, stats) {
  root.replaceChildren();
  const fmt = (x, d) => (typeof x === "number" ? x.toFixed(d) : String(x));
  root.append(line(`mode: ${stats.mode}`, "lantern-stats-mode"));
  root.append(line(`${fmt(stats.tokens_per_s, 1)} tok/s · ${stats.forward_passes} forward passes · ` +
                   `${stats.batch}×${stats.image_tokens} tokens in ${fmt(stats.wall_time_s, 2)} s`, "lantern-stats-speed"));
  root.append(line(`mean accepted length ${fmt(stats.mean_accepted_length, 2)}` +
                   (stats.speculative ? "" : " (plain AR: one token per forward)"), "lantern-stats-accept"));
  const steps = stats.steps && typeof stats.steps === "object" ? stats.steps : null;
  if (steps && steps.fell_back === true) { // a requested CUDA graph or compile did not run: never hidden
    const eager = Number(steps.eager) || 0;
    const total = eager + (Number(steps.replayed) || 0);
    let text = steps.graphs === "off" ? "fell back to uncompiled steps"
      : `fell back to eager for ${String(steps.eager)} of ${total} steps (not replayed from a CUDA graph)`;
    if (steps.compile === "failed") text += " · the Inductor compile failed";
    if (steps.capture_error) text += ` · capture failed: ${String(steps.capture_error)}`;
    root.append(line(text + " · same tokens, slower", "lantern-stats-fallback"));
  }
  if (stats.speculative) {
    const jacobi = String(stats.mode).startsWith("sjd");  // training-free: a draft window, no drafter
    root.append(line(`${jacobi ? "window" : "tree"}: ${stats.tree} · drafter: ${stats.drafter}`, "lantern-stats-tree"));
    const depths = Array.isArray(stats.acceptance_by_depth) ? stats.acceptance_by_depth : [];
    root.append(line(`acceptance by ${jacobi ? "window position" : "depth"}: ` +
                     `${depths.map((a) => fmt(Number(a), 2)).join(" ") || "-"}`, "lantern-stats-depth"));
    const perImage = Array.isArray(stats.accepted_length_per_image) ? stats.accepted_length_per_image : [];
    if (Number(stats.batch) > 1 && perImage.length) {
      root.append(line(`batch of ${Number(stats.batch)} decoded together in ${Number(stats.batch_forwards)} forwards · ` +
                       `accepted length per image: ${perImage.map((a) => fmt(Number(a), 2)).join(" ")}`,
                       "lantern-stats-batch"));
    }
    if (Number(stats.relaxed_tokens) > 0) {
      root.append(line(`relaxed: ${stats.relaxed_tokens} tokens · TVD spent mean ${fmt(stats.mean_tvd_spent, 3)}` +
                       ` max ${fmt(stats.max_tvd_spent, 3)}`, "lantern-stats-relaxed"));
    }
  }
  if (Array.isArray(stats.conditions) && stats.conditions.length) {
    root.append(line(`for: ${stats.conditions.join(", ")}`, "lantern-stats-conditions"));
  }
  const rows = Array.isArray(stats.heatmap) ? stats.heatmap : [];
  if (!rows.length) return;
  const side = Math.max(1, Math.min(1024, Math.trunc(Number(rows[0]?.length)) || 1)); // a number, never text
  const max = Math.max(1, ...rows.flat().map(Number));
  const grid = document.createElement("div");
  grid.className = "lantern-heatmap";
  grid.style.cssText = `display:grid;grid-template-columns:repeat(${side},1fr);gap:0;width:100%;` +
                       "aspect-ratio:1/1;margin-top:4px;border:1px solid #444";
  for (const row of rows) {
    for (const value of row) {
      const cell = document.createElement("div");
      cell.className = "lantern-heatmap-cell";
      cell.title = `${Number(value)} token(s) accepted by this forward`;
      cell.style.background = cellColour(Number(value), max);
      grid.append(cell);
    }
  }
  root.append(grid);
  const which = Number(stats.batch) > 1 ? ` of image ${Number(stats.heatmap_image ?? 0)} (the first of ${Number(stats.batch)})` : "";
  root.append(line(`heat map${which}: tokens accepted per forward (max ${max})`, "lantern-stats-legend"));
}

function addStatsWidget(node) {
  const root = document.createElement("div");
  root.className = "lantern-stats";
  root.style.cssText = "font:11px monospace;color:var(--input-text,#ddd);padding:2px 4px;overflow:hidden";
  root.append(line("run the graph to see speed and acceptance here", "lantern-stats-empty"));
  const widget = node.addDOMWidget(WIDGET, "lantern_stats", root, {
    serialize: false, // display only: never part of the saved widget values
    hideOnZoom: false,
    getMinHeight: () => 90 + Math.min(360, Math.max(120, (node.size?.[0] ?? 260) - 20)),
  });
  widget.serialize = false; // LiteGraph reads this flag when it writes widgets_values
  return widget;
}

app.registerExtension({
  name: "lantern.stats",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODES.has(nodeData.name)) return;
    // The widget exists from creation on (both LiteGraph and Vue node rendering mount it then);
    // runs only replace its contents.
    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const r = onNodeCreated?.apply(this, arguments);
      addStatsWidget(this);
      return r;
    };
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (output) {
      const r = onExecuted?.apply(this, arguments);
      const stats = output?.lantern_stats?.[0];
      if (!stats) return r;
      const widget = this.widgets?.find((w) => w.name === WIDGET) ?? addStatsWidget(this);
      renderStats(widget.element, stats);
      this.setSize?.([Math.max(this.size[0], 260), this.computeSize?.()[1] ?? this.size[1]]);
      this.graph?.setDirtyCanvas?.(true, true);
      return r;
    };
  },
});
