"""LanternDecodingConfig: the decoding mode, its drafter (none for the training-free sjd modes) and
parameters -> LANTERN_DECODING."""
from __future__ import annotations

from dataclasses import replace

from comfy_api.latest import io

from ..lantern_core.decoding.trees.drafting import DynamicShape
from ..lantern_core.decoding.jacobi import INITS
from ..lantern_core.decoding.modes import MODES, SJD_RELAXATIONS, TREES, JacobiWidgets, ModeSettings, build_mode
from ..lantern_core.decoding.step_graphs import COMPILE_CHOICES
from ..lantern_core.errors import check_choice
from .types import LanternDecoding, LanternDecodingType, LanternDrafter, LanternDrafterType, expect_link


def build_decoding(settings: ModeSettings, drafter) -> LanternDecoding:
    """Widget values -> LanternDecoding (validated by `modes.build_mode`; raises LanternError naming the
    parameter)."""
    expect_link("drafter", drafter, LanternDrafter, "Lantern: Load Drafter", optional=True)
    built = build_mode(settings, vocab=None if drafter is None else drafter.config.vocab_size,
                       has_drafter=drafter is not None)
    if built.spec is None:
        return LanternDecoding("ar")
    return LanternDecoding(settings.mode, drafter if built.needs_drafter else None, built.spec, built.label)


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
                               tooltip="auto: on an NVIDIA GPU each decoding step is fused by PyTorch's "
                                       "compiler (Inductor; the first image of a model and shape compiles for a "
                                       "minute or more, later ones reuse it; it rounds where eager rounds, so the "
                                       "images are off's), then captured once as a CUDA graph and replayed. graphs: capture without compiling (a few ms; the same "
                                       "tokens as off). CPUs and Apple GPUs run eagerly with every choice. off: "
                                       "always eager (for debugging). Every mode uses it: ar steps, draft-tree "
                                       "and Jacobi iterations."),
                io.Int.Input("jacobi_rows", default=1, min=0, max=8,
                             tooltip="sjd modes: draft windows open at once. 0: auto (the geometry, 1-D or 2-D, "
                                     "with the most tokens per second on this machine, measured once on scratch "
                                     "images; seeds unaffected). 1: the frontier's window only (1-D "
                                     "Jacobi). 2 or more: also a window on each of the next image rows, drafted in "
                                     "the same forward pass; when the frontier reaches those positions it starts "
                                     "from their drafts. Lossless for sjd and sjd_coupled: only the frontier "
                                     "accepts, by the exact rule. sjd_2d_relaxed: rows decoded at once, each "
                                     "committing its own tokens; 0 or 1 = auto: the rows and drafts per row with the "
                                     "most tokens per second on this machine, measured once per model and "
                                     "setting on scratch images (seeds unaffected)."),
                io.Int.Input("jacobi_row_window", default=4, min=1, max=64,
                             tooltip="sjd modes with jacobi_rows > 1: drafts per lower-row window (with "
                                     "sjd_2d_relaxed and jacobi_rows 1, auto chooses it)."),
                io.Int.Input("jacobi_row_offset", default=-5, min=-64, max=64,
                             tooltip="sjd modes with jacobi_rows > 1: where each lower row's window starts, in "
                                     "columns from the column below the frontier (negative: to its left, where "
                                     "the tokens above are already decoded). The window must start past the "
                                     "frontier's drafts; the error says what to change if not."),
                io.Boolean.Input("jacobi_continuation", default=False,
                                 tooltip="sjd: SJD-PAC's adaptive continuation. A re-drafted position keeps its "
                                         "current draft with probability min(1, p/q), else draws from the residual "
                                         "max(0, p - q): drafts settle faster and the output stays exactly AR's "
                                         "(lossless). On the embedded model it lifts sjd from about 2.3 to 3.2 "
                                         "accepted tokens per forward."),
                io.Int.Input("jacobi_proactive", default=1, min=1, max=8,
                             tooltip="sjd and sjd_coupled: proactive drafting (SJD-PAC's tree at the rejection "
                                     "point). Candidates drafted at each of the first 3 positions past the "
                                     "frontier, judged in the same forward pass by recursive rejection sampling, "
                                     "so when the usual draft is rejected another candidate may still be "
                                     "accepted. 1: off. Lossless: the output stays exactly AR's. On the embedded "
                                     "model 4 lifts sjd_coupled from 2.9 to 3.25 accepted tokens per forward; each "
                                     "candidate widens the forward pass (nearly free on a GPU, slower on a CPU)."),
            ],
            outputs=[LanternDecodingType.Output(display_name="decoding", tooltip="Feed into Lantern: Sampler.")],
        )

    @classmethod
    def execute(cls, mode: str, tree: str, chain_length: int, custom_tree: str, lantern_k: int, delta: float,
                lam: float, eagle_depth: int, eagle_top_k: int, eagle_nodes: int, jacobi_window: int = 0,
                jacobi_init: str = "sample_left", sjd_relaxation: str = "lantern_pp", gsd_gap: float = 0.15,
                compile: str = "auto", jacobi_rows: int = 1, jacobi_row_window: int = 4,
                jacobi_row_offset: int = -5, jacobi_continuation: bool = False, jacobi_proactive: int = 1,
                drafter=None) -> io.NodeOutput:
        check_choice("compile", compile, COMPILE_CHOICES)
        settings = ModeSettings(mode, tree, chain_length, custom_tree, lantern_k, delta, lam,
                                DynamicShape(eagle_depth, eagle_top_k, eagle_nodes),
                                JacobiWidgets(jacobi_window, jacobi_init, sjd_relaxation, gsd_gap, jacobi_rows,
                                              jacobi_row_window, jacobi_row_offset,
                                              continuation=bool(jacobi_continuation),
                                              proactive=jacobi_proactive))
        decoding = build_decoding(settings, drafter)
        return io.NodeOutput(replace(decoding, compile=compile))
