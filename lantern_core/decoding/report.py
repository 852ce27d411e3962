"""What a finished run reports to a person: the stats the sampler node shows (and its web panel draws) and the
command line prints with --json, built from a `GenerationResult` in one place so both say the same. It does
not decode or time anything."""
from __future__ import annotations

from .batching import SpeculativeStats
from .generate import GenerationResult
from .acceptance.seed_identity import same_image_as_ar  # noqa: F401 -- the sampler node and command line read it here


def stats_payload(result: GenerationResult, mode: str, tree_label: str, drafter: str, conditions: list[str],
                  same_as_ar: bool = False) -> dict:
    """The run's stats as JSON-ready values: speed, forward passes, accepted lengths (per image in a batch),
    the tree or window used, the relaxation spent, image 0's acceptance heat map and how the decode steps ran
    (`steps`: `StepExecution.to_dict`, replayed CUDA graphs or eager, compiled or not). `drafter` names the
    drafter ("none (training-free)" for the Jacobi modes); `conditions` describes each image; `same_as_ar`
    (`same_image_as_ar`) says the run's image is plain AR's for its seed."""
    s = result.stats
    payload = {"mode": mode, "batch": s.batch, "image_tokens": s.image_tokens,
               "forward_passes": s.forward_passes, "wall_time_s": round(s.wall_time_s, 4),
               "tokens_per_s": round(s.tokens_per_s, 2), "ms_per_step": round(s.ms_per_step, 3),
               "mean_accepted_length": round(s.mean_accepted_length, 4), "speculative": mode != "ar",
               "conditions": conditions, "heatmap": result.acceptance_grid(0), "steps": s.steps.to_dict(),
               "same_image_as_ar": bool(same_as_ar)}
    if isinstance(s, SpeculativeStats):
        payload.update(tree=s.tree or tree_label, drafter=drafter, drafter_prefix_states=s.drafter_prefix_states,
                       acceptance_by_depth=[round(a, 4) for a in s.acceptance_by_depth],
                       accepted_histogram=s.accepted_histogram, drafter_forwards=s.drafter_forwards,
                       relaxed_tokens=s.relaxed_tokens, mean_tvd_spent=round(s.mean_absorbed, 5),
                       max_tvd_spent=round(s.max_absorbed, 5), batch_forwards=s.batch_forwards,
                       accepted_length_per_image=[p["mean_accepted_length"] for p in s.per_image])
        if s.row_commits:  # relaxed 2-D: tokens the lower rows committed before the frontier (not lossless)
            payload.update(row_commits=s.row_commits,
                           row_committed_share=round(sum(s.row_commits) / max(s.batch * s.image_tokens, 1), 4))
    payload["heatmap_image"] = 0  # the heat map is image 0's (the first of the batch)
    return payload


def stats_text(payload: dict) -> str:
    """One line of the payload for a person (the node's text output, the command line's summary), ending with
    the fallback when the run's steps fell back from the CUDA graphs or compile they asked for."""
    text = (f"{payload['mode']}: {payload['batch']} x {payload['image_tokens']} tokens in "
            f"{payload['wall_time_s']:.2f} s ({payload['tokens_per_s']:.1f} tok/s), "
            f"{payload['forward_passes']} forward passes, mean accepted length {payload['mean_accepted_length']:.2f}")
    if payload.get("speculative"):
        depth = " ".join(f"{a:.2f}" for a in payload["acceptance_by_depth"])
        text += f", tree {payload['tree']}, acceptance by depth [{depth}]"
        if payload.get("same_image_as_ar"):
            text += ", same image as ar for this seed"
        if payload.get("drafter_prefix_states") == "hf_port":
            text += ", drafter fed LANTERN's HF-port caption states"
        if payload.get("row_commits"):
            text += (f", {100 * payload['row_committed_share']:.0f}% of tokens committed by lower rows "
                     f"(relaxed 2-D, not lossless; per row window {payload['row_commits']})")
        if payload["relaxed_tokens"]:
            text += f", TVD spent mean {payload['mean_tvd_spent']:.3f} max {payload['max_tvd_spent']:.3f}"
        if payload["batch"] > 1:
            lengths = " ".join(f"{a:.2f}" for a in payload["accepted_length_per_image"])
            text += (f", the batch decoded together in {payload['batch_forwards']} forwards, mean accepted length "
                     f"per image [{lengths}]")
    return text + fallback_text(payload.get("steps") or {})


def fallback_text(steps: dict) -> str:
    """'; fell back to eager for ...' when the run's `steps` (a `StepExecution.to_dict`) fell back from the CUDA
    graphs or the Inductor compile it asked for, else '' (a run that was eager by choice says nothing)."""
    if not steps.get("fell_back"):
        return ""
    parts = []
    if steps.get("graphs") in ("partial", "none"):
        total = steps.get("replayed", 0) + steps.get("eager", 0)
        parts.append(f"fell back to eager for {steps.get('eager', 0)} of {total} steps "
                     "(not replayed from a CUDA graph)")
    if steps.get("compile") == "failed":
        parts.append("fell back to uncompiled steps (the Inductor compile failed)")
    if steps.get("capture_error"):
        parts.append(f"capture failed: {str(steps['capture_error'])[:120]}")
    return "; " + ", ".join(parts or ["fell back to eager"]) + "; same tokens, slower"
