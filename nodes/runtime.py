"""Everything that touches ComfyUI's runtime: model placement (ModelPatcher + model_management),
the shared-load registry, progress bars with partial-grid previews, interrupts and memory release.

Node modules call these helpers and lantern_core; nothing else in the pack imports
comfy.model_management, comfy.model_patcher or comfy.utils.
"""
from __future__ import annotations

import logging
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

import comfy.model_management as mm
import comfy.model_patcher
import comfy.utils
from comfy.patcher_extension import CallbacksMP

from ..lantern_core.decoding import step_graphs
from ..lantern_core.loading.checkpoints import load_gpt, load_vq

from ..lantern_core.config import KV_CACHE_FORMATS as KV_CACHE_CHOICES
from ..lantern_core.errors import check_choice
from ..lantern_core.models.quantized import WEIGHT_CHOICES
from .types import LanternDrafter, LanternModel, target_key

log = logging.getLogger("lantern.nodes")

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Precision:
    """How a target's weights are held: the compute dtype, and "none", "int8" or "fp8" for the blocks' linears;
    and how its runs keep keys and values ("auto": in the dtype, "int8": 8-bit with scales)."""

    dtype: torch.dtype
    weights: str = "none"
    kv_cache: str = "auto"

    def __post_init__(self):
        check_choice("weights", self.weights, WEIGHT_CHOICES)
        check_choice("kv_cache", self.kv_cache, KV_CACHE_CHOICES)


_REGISTRY: "weakref.WeakValueDictionary[tuple, LanternModel]" = weakref.WeakValueDictionary()
_REGISTRY_LOCK = threading.Lock()


def choose_dtype(choice: str) -> torch.dtype:
    """'auto' follows ComfyUI's policy for the compute device (bf16 where fast, else fp32)."""
    check_choice("dtype", choice, ["auto", *DTYPES])
    if choice != "auto":
        return DTYPES[choice]
    device = mm.get_torch_device()
    if mm.should_use_bf16(device):
        return torch.bfloat16
    if mm.should_use_fp16(device):
        return torch.float16
    return torch.float32


class Holder(torch.nn.Module):
    """Wraps a module whose class forbids the attributes ModelPatcher sets (HF models' `device`)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner


def _release_graphs(patcher: comfy.model_patcher.ModelPatcher, *_) -> None:
    """ComfyUI moved the weights off the device (unload, "Free model and node cache"): drop the model's
    captured CUDA graphs and their static buffers; the next run captures again."""
    if step_graphs.release(patcher.model):
        log.info("released the captured decoding steps of %s", type(patcher.model).__name__)


def _patcher(module: torch.nn.Module) -> comfy.model_patcher.ModelPatcher:
    size = sum(p.numel() * p.element_size() for p in module.parameters())
    size += sum(b.numel() * b.element_size() for b in module.buffers())
    patcher = comfy.model_patcher.ModelPatcher(module, load_device=mm.get_torch_device(),
                                               offload_device=mm.unet_offload_device(), size=size)
    patcher.add_callback(CallbacksMP.ON_DETACH, _release_graphs)
    return patcher


def load_model(gpt_path: Path, vq_path: Path, text_encoder_path: Path | None, precision: Precision,
               name: str) -> LanternModel:
    """Load (or reuse) a model. Identical loads share one copy; weights wait on the offload device."""
    dtype = precision.dtype
    key = (str(gpt_path), str(vq_path), str(text_encoder_path), str(dtype), precision.weights, precision.kv_cache)
    with _REGISTRY_LOCK:
        cached = _REGISTRY.get(key)
        if cached is not None:
            return cached
        offload = mm.unet_offload_device()
        gpt = load_gpt(gpt_path, device=offload, dtype=dtype, weights=precision.weights)
        gpt.model.set_kv_cache(precision.kv_cache)
        vq = load_vq(vq_path, device=offload, dtype=torch.float32)  # small; fp32 keeps decodes exact
        encoder = tokenizer = None
        if gpt.config.model_type == "t2i":
            if text_encoder_path is None:
                from ..lantern_core.errors import LanternError

                raise LanternError(f"'{name}' is a text-to-image model: choose its Flan-T5-XL folder in "
                                   "text_encoder (put google/flan-t5-xl in models/lantern/text_encoders/)")
            from ..lantern_core.text_encoder import T5CaptionEncoder, text_encoder_dtype

            t5 = T5CaptionEncoder(text_encoder_path, device=offload, dtype=text_encoder_dtype(dtype))
            encoder, tokenizer = _patcher(Holder(t5.model)), t5.tokenizer
        handle = LanternModel(name=name, gpt=_patcher(gpt.model), vq=_patcher(vq.model), text_encoder=encoder,
                              tokenizer=tokenizer, class_names=list(gpt.class_names or []), dtype=dtype)
        _REGISTRY[key] = handle
        return handle


def load_family_model(folder: Path, vq_path: Path | None, precision: Precision, name: str) -> LanternModel:
    """Load (or reuse) a prompted-family folder (Anole / Chameleon, Lumina-mGPT, Janus-Pro, Emu3): model, its
    tokenizer and template, and its image tokenizer (from the folder, or a Chameleon VQGAN file from
    models/lantern/vq)."""
    from ..lantern_core.loading.families import load_prompted

    dtype = precision.dtype
    key = ("family", str(folder), str(vq_path), str(dtype), precision.weights, precision.kv_cache)
    with _REGISTRY_LOCK:
        cached = _REGISTRY.get(key)
        if cached is not None:
            return cached
        offload = mm.unet_offload_device()
        loaded = load_prompted(folder, device=offload, dtype=dtype, vq_dtype=torch.float32, vqgan=vq_path,
                               weights=precision.weights)
        loaded.model.set_kv_cache(precision.kv_cache)
        vq = loaded.vq
        from ..lantern_core.errors import LanternError

        if vq is None:
            where = {"emu3": "put BAAI/Emu3-VisionTokenizer's files (config.json, model.safetensors) in its "
                              "vision_tokenizer/ subfolder",
                     "hf-lumina2": "put movqgan_270M.ckpt (ai-forever/MoVQGAN) in the folder or choose it in "
                                   "vq_tokenizer"}.get(loaded.source_format, "put Chameleon's vqgan.ckpt in the folder "
                                                                            "or choose it in vq_tokenizer")
            raise LanternError(f"'{name}' has no image tokenizer: {where}")
        codes = loaded.config.vocab_size - int(loaded.config.row_end)  # Lumina's end-of-row token is no VQ code
        if vq.config.codebook_size != codes:
            raise LanternError(f"the image tokenizer {vq_path or folder} has {vq.config.codebook_size} codes but "
                               f"'{name}' draws {codes}: choose the VQGAN released with the model")
        handle = LanternModel(name=name, gpt=_patcher(loaded.model), vq=_patcher(vq), text_encoder=None,
                              tokenizer=None, dtype=dtype, prompt_encoder=loaded.encoder,
                              layout=loaded.source_format)
        _REGISTRY[key] = handle
        return handle


def load_drafter(path: Path, model: LanternModel, name: str) -> LanternDrafter:
    """Load (or reuse) a drafter for `model`, in the target's dtype; refuses one that does not fit it."""
    from ..lantern_core.loading.drafter_io import load_drafter as load

    key = ("drafter", str(path), model.name, str(model.config), str(model.dtype))
    with _REGISTRY_LOCK:
        cached = _REGISTRY.get(key)
        if cached is not None:
            return cached
        image_ids = getattr(getattr(model.gpt.model, "image", None), "token_ids", None)  # Chameleon code -> token id
        loaded = load(path, model.config, device=mm.unet_offload_device(), dtype=model.dtype,
                      image_token_ids=None if image_ids is None else image_ids.cpu())
        handle = LanternDrafter(name=name, drafter=_patcher(loaded.model), target_name=model.name,
                                target_key=target_key(model))
        _REGISTRY[key] = handle
        return handle


def live_models() -> int:
    """How many distinct loaded models are still referenced (by ComfyUI's output cache or a run)."""
    return len(_REGISTRY)


def place(patchers: list, memory_required: int = 0) -> torch.device:
    """Load patchers onto the compute device, reserving `memory_required` bytes for activations/caches."""
    mm.load_models_gpu(patchers, memory_required=memory_required, force_full_load=True)
    return patchers[0].load_device


def free_memory(device: torch.device) -> int:
    """Bytes free on `device` for a run, as ComfyUI's model management counts them (the CUDA driver's free
    memory plus what PyTorch's allocator holds unused; system memory for the CPU)."""
    return int(mm.get_free_memory(device))


@contextmanager
def run_scope() -> Iterator[None]:
    """Around one generation: whatever happens, give transient memory back to the allocator."""
    try:
        yield
    finally:
        mm.soft_empty_cache()


def intermediate_device() -> torch.device:
    """Where IMAGE outputs live (CPU unless ComfyUI runs with --gpu-only)."""
    return mm.intermediate_device()


def check_interrupt() -> None:
    mm.throw_exception_if_processing_interrupted()


def previews_enabled() -> bool:
    from comfy.cli_args import LatentPreviewMethod, args

    return args.preview_method != LatentPreviewMethod.NoPreviews


def progress_callback(total_tokens: int, preview: Callable[[torch.Tensor, int], object] | None,
                      preview_every: int) -> Callable[[int, int, torch.Tensor], None]:
    """A lantern_core step callback: advances a ProgressBar in image tokens (which also raises on
    Cancel) and, when previews are on, sends a partial-grid preview of image 0 each time another
    `preview_every` tokens are done (speculative steps jump several tokens). `done` counts the tokens of the
    whole batch; image 0's own progress is read from its row of `tokens` when images advance unevenly
    (speculative batches mark cells not decoded yet with -1), else `done` is per image (plain AR)."""
    bar = comfy.utils.ProgressBar(total_tokens)
    last = [0]

    def on_step(done: int, total: int, tokens: torch.Tensor) -> None:
        image = None
        crossed = done // preview_every > last[0] // preview_every
        if preview is not None and crossed:
            per_image = tokens.shape[1]
            in_image = done if total == per_image else int((tokens[0] >= 0).sum())  # one read, only when previewing
            if in_image < per_image:
                image = preview(tokens, in_image)
        last[0] = done
        bar.update_absolute(done, total, image)
        check_interrupt()

    return on_step


def progress_text() -> Callable[[str], None]:
    """Show a status line (e.g. "compiling the ar step ...") as the executing node's progress text, where this
    ComfyUI can (`send_progress_text` and the executing-node context); otherwise a no-op."""
    try:
        from comfy_execution.utils import get_executing_context
        from server import PromptServer
    except ImportError:
        return lambda text: None

    def show(text: str) -> None:
        context = get_executing_context()
        if context is not None and hasattr(PromptServer.instance, "send_progress_text"):
            PromptServer.instance.send_progress_text(text, context.node_id)

    return show


def preview_size() -> int:
    from comfy.cli_args import args

    return args.preview_size
