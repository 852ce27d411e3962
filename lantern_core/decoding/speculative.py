"""The tree decoders' public names at the import path they had before `trees/` held them: callers that
import `speculative_generate`, `SpeculativeConfig` or `SpeculativeStats` from here keep working. The code is
in `trees/` (`driver`, `config`) and `batching`; new code imports from `lantern_core.decoding`."""
from .batching import SpeculativeStats
from .trees.config import SpeculativeConfig
from .trees.driver import speculative_generate

__all__ = ["SpeculativeConfig", "SpeculativeStats", "speculative_generate"]
