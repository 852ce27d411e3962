"""lantern_core: a plain-PyTorch library for fast visual autoregressive image generation.

LlamaGen-architecture GPTs and VQ tokenizers, strict checkpoint loading, AR generation with a
static KV cache, speculative decoding with an EAGLE drafter (LANTERN / LANTERN++, `decoding/trees`) and
training-free speculative Jacobi decoding (SJD, coupled and relaxed, `decoding/jacobi`). It never imports ComfyUI, never picks
a device and never seeds global RNGs: callers pass devices, dtypes and `torch.Generator`s.
"""
from .conditioning import Condition
from .config import GPT_PRESETS, VQ_PRESETS, GPTConfig, SamplingConfig, VQConfig, gpt_preset
from .loading.checkpoints import LoadedGPT, LoadedVQ, load_gpt, load_vq
from .loading.embedded import EMBEDDED_DIR, Pipeline, load_embedded
from .errors import CheckpointError, ConfigError, LanternError
from .decoding.generate import GenerationResult, GenerationStats, generate
from .models.gpt import LlamaGenGPT
from .models.vq import VQModel
from .decoding.sampling import make_generators

__all__ = [
    "Condition", "GPT_PRESETS", "VQ_PRESETS", "GPTConfig", "SamplingConfig", "VQConfig", "gpt_preset",
    "LoadedGPT", "LoadedVQ", "load_gpt", "load_vq", "EMBEDDED_DIR", "Pipeline", "load_embedded",
    "CheckpointError", "ConfigError", "LanternError", "GenerationResult", "GenerationStats", "generate",
    "LlamaGenGPT", "VQModel", "make_generators",
]
__version__ = "0.1.0"
