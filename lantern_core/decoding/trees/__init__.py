"""Drafter-tree decoders: an EAGLE drafter drafts a tree of tokens, one target forward verifies it, the walk
accepts a path (exactly, or LANTERN-relaxed). EAGLE-2's dynamic trees, LANTERN++'s static trees and an `auto`
sub-tree sized on this machine.

* `specs`: static tree shapes (`TreeSpec`, the published trees, chains, custom trees) and their buffers;
* `config`: `SpeculativeConfig` (which tree, which rule) and the check that a tree fits the vocabulary;
* `prefix_states`: the target features a drafter reads over the prompt, in the convention it was trained with;
* `drafting`: the drafter's session and how it drafts static and dynamic trees;
* `attention`: one target forward over a tree against the static KV cache, and the accepted path's compaction;
* `walk`: the walk down a verified tree (rejection sampling among siblings, greedy passes);
* `iteration`: one static-shape iteration (draft, verify, walk, commit), replayed from a CUDA graph on CUDA;
* `batch`: the loop over iterations for a batch of images; `auto`: choosing the `auto` tree;
  `driver`: `speculative_generate`.

May import the shared ground of `decoding/` (and `acceptance/`), `models/`, and the library's top-level
modules; never `jacobi/` or the modules over both families (`modes`, `report`, `reservation`).
"""
from .config import SpeculativeConfig
from .driver import speculative_generate
from .specs import TreeSpec

__all__ = ["SpeculativeConfig", "TreeSpec", "speculative_generate"]
