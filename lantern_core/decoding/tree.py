"""The static trees' public names at the import path they had before `trees/` held them (`TreeSpec`, the
published trees, `chain_tree`). The code is in `trees/specs.py`; new code imports from there or from
`lantern_core.decoding`."""
from .trees.specs import MC_SIM_7B_63, NAIVE_EXTEND_57, STATIC_TREES, TreeSpec, chain_tree

__all__ = ["MC_SIM_7B_63", "NAIVE_EXTEND_57", "STATIC_TREES", "TreeSpec", "chain_tree"]
