"""LanternDecodingConfig: the decoding mode, its drafter (none for the training-free sjd modes) and
parameters -> LANTERN_DECODING."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace

from comfy_api.latest import io

from ..lantern_core.decoding.drafting import DynamicShape
from ..lantern_core.errors import ConfigError, LanternError
from ..lantern_core.decoding.jacobi import INITS, JacobiConfig
from ..lantern_core.decoding.relaxation import Grouping, Relaxation
from ..lantern_core.decoding.speculative import SpeculativeConfig
from ..lantern_core.decoding.step_graphs import COMPILE_CHOICES
from ..lantern_core.decoding.tree import STATIC_TREES, TreeSpec, chain_tree
from .types import LanternDecoding, LanternDecodingType, LanternDrafter, LanternDrafterType, check_choice, expect_link

MODES = {
    "ar": "plain autoregressive decoding, one forward pass per token (the reference)",
    "eagle2": "EAGLE-2 dynamic draft tree, exact (lossless) acceptance",
    "static_tree": "static draft tree, children sampled without replacement, exact (lossless) acceptance",
    "lantern": "LANTERN: EAGLE-2 tree with relaxed acceptance; latent neighbours share a total-variation budget delta",
    "lantern_pp": "LANTERN++: static tree with relaxed acceptance bounded by lambda x the target probability",
    "sjd": "speculative Jacobi decoding: no drafter, any model; the model drafts a window of future tokens "
           "itself; exact (lossless)",
    "sjd_coupled": "coupled SJD: like sjd, with drafts tied to a per-position noise table so they settle faster; "
                   "exact (lossless)",
    "sjd_relaxed": "relaxed Jacobi: coupled SJD with relaxed acceptance (sjd_relaxation: LANTERN delta, "
                   "LANTERN++ lambda or GSD groups); not lossless",
}
JACOBI_MODES = ("sjd", "sjd_coupled", "sjd_relaxed")
SJD_RELAXATIONS = ("lantern_pp", "lantern", "gsd")
TREES = ["auto", *STATIC_TREES, "chain", "custom"]
CUSTOM_TREE_MAX_NODES = 512  # as many as eagle_nodes allows
CUSTOM_TREE_MAX_DEPTH = 64  # as deep as a dynamic tree may be


@dataclass(frozen=True)
class JacobiWidgets:
    """The Jacobi widgets: window (0 = auto), initialisation, relaxed rule and GSD's probability gap."""

    window: int = 0
    init: str = "sample_left"
    relaxation: str = "lantern_pp"
    gsd_gap: float = 0.15


def parse_custom_tree(text: str) -> TreeSpec:
    """'[[0], [1], [0, 0]]' (child ranks from the root, as in EAGLE's choices.py) -> TreeSpec."""
    try:
        paths = json.loads(text)
        if not isinstance(paths, list) or not paths or not all(isinstance(p, list) for p in paths):
            raise ValueError("not a non-empty list of lists")
        if len(paths) > CUSTOM_TREE_MAX_NODES or max(map(len, paths)) > CUSTOM_TREE_MAX_DEPTH:
            raise ValueError(f"{len(paths)} nodes, depth {max(map(len, paths))}: at most {CUSTOM_TREE_MAX_NODES} "
                             f"nodes and depth {CUSTOM_TREE_MAX_DEPTH}")
        return TreeSpec("custom", tuple(tuple(int(r) for r in p) for p in paths))
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # RecursionError: nesting too deep
        raise ConfigError("custom_tree", "a JSON list of paths of child ranks, e.g. [[0], [1], [0, 0]]",
                          text[:80], f"fix the JSON ({str(exc)[:300]})") from exc


def check_number(name: str, value, low: float, high: float, what: str) -> None:
    """A float widget in [low, high]; NaN fails too (it passes ComfyUI's min/max check)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(name, f"{what} in [{low:g}, {high:g}]", value)


def check_widgets(mode, tree, delta, lam, jacobi: JacobiWidgets) -> None:
    """Every choice and float widget, whether or not the mode reads it."""
    check_choice("mode", mode, MODES)
    check_choice("tree", tree, TREES)
    check_choice("jacobi_init", jacobi.init, INITS)
    check_choice("sjd_relaxation", jacobi.relaxation, SJD_RELAXATIONS)
    check_number("delta", delta, 0.0, 1.0, "a total-variation budget")
    check_number("lambda", lam, 1.0, 100.0, "a multiplicative bound")
    check_number("gsd_gap", jacobi.gsd_gap, 0.0, 1.0, "a GSD group gap (probability difference)")


def build_jacobi(mode: str, jacobi: JacobiWidgets, lantern_k: int, delta: float, lam: float) -> JacobiConfig:
    """The Jacobi modes' widgets -> JacobiConfig (validated, naming the widget)."""
    if jacobi.init not in INITS:
        raise ConfigError("jacobi_init", f"one of {list(INITS)}", jacobi.init)
    if jacobi.relaxation not in SJD_RELAXATIONS:
        raise ConfigError("sjd_relaxation", f"one of {list(SJD_RELAXATIONS)}", jacobi.relaxation)
    if not 0 <= jacobi.window <= 256:
        raise ConfigError("jacobi_window", "0 (auto) or a window of 1..256 drafted tokens", jacobi.window)
    relaxation = grouping = None
    if mode == "sjd_relaxed":
        if lantern_k < 1:
            raise ConfigError("lantern_k", "an integer >= 1 (latent neighbours per token)", lantern_k)
        if jacobi.relaxation == "lantern":
            relaxation = Relaxation(k=lantern_k, delta=delta)
        elif jacobi.relaxation == "lantern_pp":
            relaxation = Relaxation(k=lantern_k, lam=lam)
        else:
            grouping = Grouping(k=lantern_k, gap=jacobi.gsd_gap)
    return JacobiConfig(window=jacobi.window or "auto", coupled=mode != "sjd", init=jacobi.init,
                        relaxation=relaxation, grouping=grouping)


def build_decoding(mode: str, drafter, tree: str, chain_length: int, custom_tree: str, lantern_k: int,
                   delta: float, lam: float, eagle: DynamicShape, jacobi: JacobiWidgets = JacobiWidgets()
                   ) -> LanternDecoding:
    """Widget values -> LanternDecoding (validated; raises LanternError naming the parameter)."""
    check_widgets(mode, tree, delta, lam, jacobi)
    expect_link("drafter", drafter, LanternDrafter, "Lantern: Load Drafter", optional=True)
    if mode == "ar":
        return LanternDecoding("ar")
    if mode in JACOBI_MODES:
        config = build_jacobi(mode, jacobi, lantern_k, delta, lam)
        return LanternDecoding(mode, None, config, config.describe())
    if drafter is None:
        raise LanternError(f"mode '{mode}' needs a drafter: connect Lantern: Load Drafter to 'drafter' "
                           "(or choose mode 'ar')")
    if tree not in TREES:
        raise ConfigError("tree", f"one of {TREES}", tree)
    dynamic = mode in ("eagle2", "lantern")
    if dynamic:
        kind, static, label = "dynamic", STATIC_TREES["naive_extend_57"], f"eagle2 d{eagle.depth} k{eagle.top_k} n{eagle.nodes}"
    elif tree == "custom":
        kind, static = "static", parse_custom_tree(custom_tree)
        label = f"custom ({static.num_nodes} nodes)"
    elif tree == "chain":
        kind, static, label = "static", chain_tree(chain_length), f"chain_{chain_length}"
    elif tree == "auto":
        kind, static, label = "auto", STATIC_TREES["naive_extend_57"], "auto"
    else:
        kind, static, label = "static", STATIC_TREES[tree], tree
    vocab = drafter.config.vocab_size
    if mode in ("lantern", "lantern_pp") and not 1 <= lantern_k < vocab:
        raise ConfigError("lantern_k", f"an integer in 1..{vocab - 1} (neighbours per token; codebook size - 1)",
                          lantern_k)
    relaxation = None
    if mode == "lantern":
        relaxation = Relaxation(k=lantern_k, delta=delta)
    elif mode == "lantern_pp":
        relaxation = Relaxation(k=lantern_k, lam=lam)
    spec = SpeculativeConfig(tree=kind, static_tree=static, dynamic=eagle, relaxation=relaxation)
    return LanternDecoding(mode, drafter, spec, label)


class LanternDecodingConfig(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LanternDecodingConfig",
            display_name="Lantern: Decoding Config",
            category="LANTERN/sampling",
            description="Chooses how tokens are decoded. " + "; ".join(f"{k}: {v}" for k, v in MODES.items()) + ".",
            inputs=[
                io.Combo.Input("mode", options=list(MODES), default="ar",
                               tooltip="; ".join(f"{k}: {v}" for k, v in MODES.items())),
                LanternDrafterType.Input("drafter", optional=True,
                                         tooltip="From Lantern: Load Drafter; needed by every mode except ar."),
                io.Combo.Input("tree", options=TREES, default="auto",
                               tooltip="Static tree for static_tree / lantern_pp. auto measures this machine's "
                                       "verification cost curve and the drafter's acceptance on the first image, "
                                       "then keeps the sub-tree of naive_extend_57 with the best tokens per second "
                                       "(small trees on CPUs, large ones on GPUs). naive_extend_57: LANTERN++'s "
                                       "default (57 nodes, depth 5); mc_sim_7b_63: EAGLE-1's (25 nodes); chain: "
                                       "one path of chain_length; custom: custom_tree."),
                io.Int.Input("chain_length", default=4, min=1, max=32, tooltip="Drafted tokens when tree = chain."),
                io.String.Input("custom_tree", default="[[0], [1], [0, 0], [0, 0, 0]]", multiline=True,
                                tooltip="tree = custom: JSON list of nodes as child ranks from the root (EAGLE's "
                                        "choices format); every prefix must be listed, ranks without gaps."),
                io.Int.Input("lantern_k", default=1000, min=1, max=65535,
                             tooltip="lantern / lantern_pp / sjd_relaxed: latent neighbours per token that may "
                                     "absorb mass (LANTERN: 1000 of LlamaGen's 16384 codes; LANTERN++: 5-10; "
                                     "sjd_relaxed: about 10, the benchmarked setting)."),
                io.Float.Input("delta", default=0.1, min=0.0, max=1.0, step=0.01, round=0.001,
                               tooltip="lantern: total-variation budget per token (0 = exact; the paper used "
                                       "0.05-0.4: larger is faster, with more quality loss)."),
                io.Float.Input("lam", default=5.0, min=1.0, max=100.0, step=0.5, round=0.01,
                               display_name="lambda",
                               tooltip="lantern_pp: the relaxed probability stays <= lambda x the target's "
                                       "(1 = exact; LANTERN++ used 5-20)."),
                io.Int.Input("eagle_depth", default=5, min=1, max=16,
                             tooltip="eagle2 / lantern: drafted levels of the dynamic tree."),
                io.Int.Input("eagle_top_k", default=10, min=1, max=64,
                             tooltip="eagle2 / lantern: children per expanded node and frontier width."),
                io.Int.Input("eagle_nodes", default=58, min=1, max=512,
                             tooltip="eagle2 / lantern: drafted nodes verified per step (EAGLE-2: 58). On a CPU "
                                     "each verified node costs time; 10-20 is usually faster there."),
                io.Int.Input("jacobi_window", default=0, min=0, max=256,
                             tooltip="sjd modes: future tokens drafted and verified per forward pass. 0 = auto: "
                                     "measured once per model, device and setting from this machine's forward-"
                                     "cost curve and a scratch image (wide on GPUs, about 8-16 on CPUs). The "
                                     "papers used 16."),
                io.Combo.Input("jacobi_init", options=list(INITS), default="sample_left",
                               tooltip="sjd modes: how a position entering the window is first drafted. "
                                       "sample_left: sampled from the model's latest prediction (the nearest "
                                       "position to its left); random: a uniform random token; repeat_left / "
                                       "repeat_above: a copy of the token to the left / above. Any choice is "
                                       "lossless for sjd and sjd_coupled; it only changes the speed."),
                io.Combo.Input("sjd_relaxation", options=list(SJD_RELAXATIONS), default="lantern_pp",
                               tooltip="sjd_relaxed: the relaxed acceptance. lantern_pp: a draft may absorb "
                                       "its latent neighbours' probability up to lambda x its own (lantern_k "
                                       "neighbours); lantern: up to a total-variation budget delta; gsd: judged "
                                       "on its group (itself and those of its lantern_k nearest neighbours whose "
                                       "probability is within gsd_gap of its own)."),
                io.Float.Input("gsd_gap", default=0.15, min=0.0, max=1.0, step=0.01, round=0.001,
                               tooltip="sjd_relaxed with gsd: a neighbour joins the group when its probability "
                                       "differs from the draft's by less than this (GSD: 0.15)."),
                io.Combo.Input("compile", options=list(COMPILE_CHOICES), default="auto",
                               tooltip="auto: on an NVIDIA GPU each decoding step is captured once as a CUDA "
                                       "graph (per model, batch and shape; a few ms) and replayed, which removes "
                                       "the per-step launch overhead; the same tokens as off. CPUs and Apple GPUs "
                                       "run eagerly either way. off: always eager (for debugging). Every mode "
                                       "uses it: ar steps, draft-tree and Jacobi iterations."),
            ],
            outputs=[LanternDecodingType.Output(display_name="decoding", tooltip="Feed into Lantern: Sampler.")],
        )

    @classmethod
    def execute(cls, mode: str, tree: str, chain_length: int, custom_tree: str, lantern_k: int, delta: float,
                lam: float, eagle_depth: int, eagle_top_k: int, eagle_nodes: int, jacobi_window: int = 0,
                jacobi_init: str = "sample_left", sjd_relaxation: str = "lantern_pp", gsd_gap: float = 0.15,
                compile: str = "auto", drafter=None) -> io.NodeOutput:
        eagle = DynamicShape(eagle_depth, eagle_top_k, eagle_nodes)
        jacobi = JacobiWidgets(jacobi_window, jacobi_init, sjd_relaxation, gsd_gap)
        check_choice("compile", compile, COMPILE_CHOICES)
        decoding = build_decoding(mode, drafter, tree, chain_length, custom_tree, lantern_k, delta, lam, eagle, jacobi)
        return io.NodeOutput(replace(decoding, compile=compile))
