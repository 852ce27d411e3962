"""LanternModelLoader: target checkpoint + VQ tokenizer (+ text encoder for t2i) -> LANTERN_MODEL."""
from __future__ import annotations

from pathlib import Path

from comfy_api.latest import io

from . import paths, runtime
from ..lantern_core.errors import LanternError, shown
from ..lantern_core.loading.catalog import CHAMELEON_VQGAN, PublicFile
from .types import LanternModelType

DESCRIPTION = ("Loads a visual autoregressive model (LlamaGen c2i/t2i, Anole / Chameleon, Lumina-mGPT, Janus-Pro, "
               "Emu3, or the embedded default) with its VQ tokenizer and, for LlamaGen text-to-image models, its "
               "Flan-T5 text encoder. Family, size and grid are read from the files. LlamaGen files go in "
               "models/lantern/checkpoints, models/lantern/vq and models/lantern/text_encoders; Anole, Lumina-mGPT, "
               "Janus-Pro and Emu3 are their downloaded folders (config.json, tokenizer files, *.safetensors) in "
               "models/lantern/checkpoints, which hold their own tokenizers (the original Emu3-Gen: "
               "BAAI/Emu3-VisionTokenizer in its vision_tokenizer/ subfolder).")


DTYPE_CHOICES = ["auto", *runtime.DTYPES]
WEIGHT_CHOICES = list(runtime.WEIGHT_CHOICES)
KV_CACHE_CHOICES = list(runtime.KV_CACHE_CHOICES)
CHAMELEON_VQGAN_URL = PublicFile(*CHAMELEON_VQGAN, "lantern_vq", "vqgan.ckpt").url
MOVQGAN_URL = "https://huggingface.co/ai-forever/MoVQGAN/resolve/main/movqgan_270M.ckpt"


def resolve_family_vq(folder: Path, family: str, layout: str, vq_tokenizer: str) -> Path | None:
    """Prompted families: None = the VQ inside the folder (Janus-Pro's and Emu3-Gen-hf's checkpoints, Chameleon's
    vqgan file, the original Emu3's vision_tokenizer/ subfolder, Lumina-mGPT 2.0's movqgan_270M.ckpt), or a file
    chosen from models/lantern/vq (Chameleon's VQGAN, MoVQGAN)."""
    from ..lantern_core.errors import LanternError
    from ..lantern_core.loading.emu3 import find_vision_tokenizer
    from ..lantern_core.loading.families import VQGAN_NAMES, find_file
    from ..lantern_core.loading.lumina2 import find_movqgan

    emu3 = layout in ("emu3", "hf-emu3")
    if vq_tokenizer != "auto":
        if family == "janus" or emu3:
            name = "Emu3" if emu3 else "Janus-Pro"
            raise LanternError(f"{name}'s image tokenizer comes with '{folder.name}': set vq_tokenizer to 'auto'")
        return paths.resolve("lantern_vq", vq_tokenizer)
    if layout == "emu3" and find_vision_tokenizer(folder, None) is None:
        raise LanternError(f"'{folder.name}' (Emu3, original layout) has no vision tokenizer: put the files of "
                           "BAAI/Emu3-VisionTokenizer (config.json, model.safetensors) into its vision_tokenizer/ "
                           "subfolder, or use BAAI/Emu3-Gen-hf, which holds it")
    if layout == "hf-lumina2":
        if find_movqgan(folder, None) is None:
            raise LanternError(f"'{folder.name}' (Lumina-mGPT 2.0) has no MoVQGAN: put movqgan_270M.ckpt into the "
                               "folder, or into models/lantern/vq and choose it in vq_tokenizer. It is published at "
                               f"{MOVQGAN_URL}")
        return None
    if family == "chameleon" and not emu3 and find_file(folder, VQGAN_NAMES) is None:
        raise LanternError(f"'{folder.name}' has no Chameleon VQGAN: put vqgan.ckpt (or vqgan.safetensors) into the "
                           "folder (or its tokenizer/ subfolder), or put it in models/lantern/vq and choose it in "
                           f"vq_tokenizer. It is published at {CHAMELEON_VQGAN_URL}")
    return None


def resolve_files(checkpoint: str, vq_tokenizer: str, text_encoder: str) -> tuple[Path, Path | None, Path | None]:
    """Combo choices -> (GPT, VQ, T5 or None) paths, or a LanternError that names the folder to use. For a
    prompted family's folder the VQ is None when it comes from the folder and the T5 is always None."""
    from ..lantern_core.errors import LanternError

    gpt_path = paths.resolve("lantern_checkpoints", checkpoint)  # a missing checkpoint is reported first
    found = paths.family_folder(gpt_path)
    if found is not None:
        return gpt_path, resolve_family_vq(gpt_path, *found, vq_tokenizer), None
    if vq_tokenizer == "auto" and checkpoint != paths.EMBEDDED:
        raise LanternError(f"choose the VQ tokenizer for '{checkpoint}' in vq_tokenizer (put vq_ds16_c2i.pt or "
                           "vq_ds16_t2i.pt in models/lantern/vq); 'auto' only fits the embedded model")
    vq_path = paths.resolve("lantern_vq", paths.EMBEDDED if vq_tokenizer == "auto" else vq_tokenizer)
    t5_path = None if text_encoder == paths.NONE else paths.resolve("lantern_text_encoders", text_encoder)
    return gpt_path, vq_path, t5_path


class LanternModelLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LanternModelLoader",
            display_name="Lantern: Load Model",
            category="LANTERN/loaders",
            description=DESCRIPTION,
            inputs=[
                io.Combo.Input("checkpoint", options=paths.list_checkpoints(), default=paths.EMBEDDED,
                               tooltip="Target model: a LlamaGen .pt/.safetensors file, or a model folder "
                                       "(LlamaGen HF, Anole-7b-v0.1-hf, Lumina-mGPT, Janus-Pro-1B/7B, Emu3-Gen) in "
                                       "models/lantern/checkpoints. The embedded default needs no files."),
                io.Combo.Input("vq_tokenizer", options=paths.list_vq(), default="auto",
                               tooltip="VQ tokenizer file in models/lantern/vq (vq_ds16_c2i.pt, vq_ds16_t2i.pt, "
                                       "or Chameleon's vqgan.ckpt). 'auto' is right for the embedded model and "
                                       "for Anole / Janus-Pro folders, whose image tokenizer is in the folder."),
                io.Combo.Input("text_encoder", options=paths.list_text_encoders(), default=paths.NONE,
                               tooltip="Flan-T5-XL folder in models/lantern/text_encoders; needed by LlamaGen "
                                       "text-to-image models, ignored by the others."),
                io.Combo.Input("dtype", options=DTYPE_CHOICES, default="auto",
                               tooltip="Weight precision. 'auto' follows ComfyUI: bf16 on GPUs that support it, "
                                       "fp32 on CPU."),
                io.Combo.Input("weights", options=WEIGHT_CHOICES, default="none",
                               tooltip="Weight-only quantization of the transformer blocks, done while loading: "
                                       "int8 or fp8 (per-channel scales) halves a 7B model's bf16 weights "
                                       "(Janus-Pro-7B, Anole-7b, Lumina-mGPT-7B fit a 12 GB GPU). Embeddings, "
                                       "norms, the image head and the drafter keep the dtype above. 'none' keeps "
                                       "every weight in that dtype. Files already quantized load as they are."),
                io.Combo.Input("kv_cache", options=KV_CACHE_CHOICES, default="auto",
                               tooltip="How runs keep the attention keys and values: 'auto' in the dtype above; "
                                       "'int8' in 8 bits with one scale per head and position, about half the "
                                       "memory (Lumina-mGPT 2.0 at 768 px: 9.2 to 4.6 GiB at batch 1), a slightly "
                                       "different sampling law (exact decoding modes sample the law of that cache). "
                                       "Drafter caches stay in the dtype.")
            ],
            outputs=[LanternModelType.Output(display_name="model", tooltip="The loaded model.")],
        )

    @classmethod
    def validate_inputs(cls, checkpoint: str | None = None, vq_tokenizer: str | None = None,
                        text_encoder: str | None = None, dtype: str | None = None,
                        weights: str | None = None, kv_cache: str | None = None) -> bool | str:
        """Reject missing files and misfits before anything runs (ComfyUI shows the message on the node).
        None: linked (or left out, which ComfyUI reports itself), checked when the node runs."""
        from ..lantern_core.errors import LanternError

        if dtype is not None and dtype not in DTYPE_CHOICES:
            return f"dtype must be one of {DTYPE_CHOICES}, not {shown(dtype)!r}"
        if weights is not None and weights not in WEIGHT_CHOICES:
            return f"weights must be one of {WEIGHT_CHOICES}, not {shown(weights)!r}"
        if kv_cache is not None and kv_cache not in KV_CACHE_CHOICES:
            return f"kv_cache must be one of {KV_CACHE_CHOICES}, not {shown(kv_cache)!r}"
        if None in (checkpoint, vq_tokenizer, text_encoder):
            return True
        try:
            resolve_files(checkpoint, vq_tokenizer, text_encoder)
        except LanternError as exc:
            return str(exc)
        return True

    @classmethod
    def execute(cls, checkpoint: str, vq_tokenizer: str, text_encoder: str, dtype: str,
                weights: str = "none", kv_cache: str = "auto") -> io.NodeOutput:
        gpt_path, vq_path, t5_path = resolve_files(checkpoint, vq_tokenizer, text_encoder)
        precision = runtime.Precision(runtime.choose_dtype(dtype), weights, kv_cache)
        try:
            if paths.family_folder(gpt_path) is not None:
                model = runtime.load_family_model(gpt_path, vq_path, precision, name=checkpoint)
            else:
                model = runtime.load_model(gpt_path, vq_path, t5_path, precision, name=checkpoint)
        except LanternError as exc:  # e.g. a shard or config.json missing from a downloaded folder
            paths.add_download_hint(exc, *culprit(exc, checkpoint, vq_tokenizer, text_encoder))
            raise
        return io.NodeOutput(model)


def culprit(exc: LanternError, checkpoint: str, vq_tokenizer: str, text_encoder: str) -> tuple[str, str]:
    """(folder kind, choice) of the file a loading error is about: the text encoder's or VQ's when the message
    names it, else the checkpoint's."""
    message = str(exc)
    for name, choice in (("lantern_text_encoders", text_encoder), ("lantern_vq", vq_tokenizer)):
        if choice not in (paths.NONE, "auto") and choice.rstrip("/") in message:
            return name, choice
    return "lantern_checkpoints", checkpoint
