"""Every decoder of image tokens, in rooms (docs/layout.md draws the map):

* here, the shared ground every decoder stands on: plain AR (`generate`, and `ar_step`, its static-shape
  step), `sampling` (filters, CFG and the target's law at each drafted position), `batching` (what a batch
  loop keeps on the host: requests, progress, counters and stats, the one read of tokens done per
  iteration), `step_graphs` (CUDA-graph capture and compiled steps), `cost_curve` (measured forward costs
  the `auto` choices read) and `auto_store` (`auto` choices kept across restarts);
* `acceptance/`: how a draft is judged: exact rejection sampling among siblings, LANTERN's relaxation and
  GSD's grouping, the latent-neighbour tables they read;
* `trees/`: the drafter-tree decoders (EAGLE-2 dynamic trees, static trees, LANTERN, LANTERN++);
* `jacobi/`: the training-free Jacobi decoders (SJD, coupled, continuation, proactive, 2-D, relaxed);
* over all of them: `modes` (the settings the node and the command line share), `report` (the stats they
  show) and `reservation` (what a run will allocate: a dry run on the meta device).

Imports go one way: shared ground, then `acceptance/`, then the two families, which never import each
other, then the modules over all of them (`tests/core/test_import_layers.py`). `speculative` and `tree`
are the tree decoders' names at their older import paths.

The speculative entry points are re-exported here, imported on first use (importing any module of the
package does not load both families); plain AR's `generate` stays in its module
(`lantern_core.decoding.generate.generate`, also `lantern_core.generate`), so that the name
`lantern_core.decoding.generate` keeps meaning the module.
"""
import importlib

_EXPORTS = {"SamplingConfig": "..config", "GenerationResult": ".generate", "JacobiConfig": ".jacobi",
            "jacobi_generate": ".jacobi", "SpeculativeConfig": ".trees", "TreeSpec": ".trees",
            "speculative_generate": ".trees"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value
