"""Tiny random Emu3 models in both published layouts, built with transformers' own classes: transformers'
`Emu3ForConditionalGeneration` folder (config.json with text_config / vq_config / vocabulary_map as
`save_pretrained` writes it, model.safetensors, tokenizer.json) and the original `BAAI/Emu3-Gen` folder (its
config.json field set as released, `model.*` / `lm_head.*` weights, `emu3.tiktoken` + `emu3_vision_tokens.txt`,
and `BAAI/Emu3-VisionTokenizer` in `vision_tokenizer/`), holding the same weights.

The vision tokenizer helpers write transformers' `Emu3VQVAE` under the original key names, with an inverse
renaming written from transformers' conversion script (`convert_emu3_weights_to_hf.py`), independently of the
loader's renaming. Special tokens are numbered as Emu3's tokenizer numbers them: after the rank table,
`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, 205 `<|extra_N|>`, then the vision file's names.
"""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

PUBLISHED = {  # BAAI/Emu3-VisionTokenizer's config.json (592 bytes) as published
    "architectures": ["Emu3VisionVQModel"],
    "attn_resolutions": [3],
    "auto_map": {"AutoConfig": "configuration_emu3visionvq.Emu3VisionVQConfig",
                 "AutoModel": "modeling_emu3visionvq.Emu3VisionVQModel"},
    "ch": 256,
    "ch_mult": [1, 2, 2, 4],
    "codebook_size": 32768,
    "double_z": False,
    "dropout": 0.0,
    "embed_dim": 4,
    "in_channels": 3,
    "model_type": "Emu3VisionVQ",
    "num_res_blocks": 2,
    "out_channels": 3,
    "temporal_downsample_factor": 4,
    "torch_dtype": "float32",
    "transformers_version": "4.44.0",
    "z_channels": 4,
}
TINY = {**PUBLISHED, "attn_resolutions": [2], "ch": 32, "ch_mult": [1, 2, 2], "codebook_size": 24,
        "torch_dtype": "float64"}  # the same fields, sizes shrunk


def reference_vision_tokenizer() -> torch.nn.Module:
    """transformers' Emu3VQVAE sized as TINY (its own field names), with random norms and statistics."""
    from transformers import Emu3VQVAEConfig

    torch.manual_seed(5)
    config = Emu3VQVAEConfig(
        codebook_size=TINY["codebook_size"], embed_dim=TINY["embed_dim"], latent_channels=TINY["z_channels"],
        base_channels=TINY["ch"], channel_multiplier=TINY["ch_mult"], num_res_blocks=TINY["num_res_blocks"],
        attn_resolutions=TINY["attn_resolutions"], temporal_downsample_factor=TINY["temporal_downsample_factor"],
        double_latent=TINY["double_z"], in_channels=TINY["in_channels"], out_channels=TINY["out_channels"],
        hidden_size=TINY["ch"] * TINY["ch_mult"][-1], num_attention_heads=1)  # original: one head, full width
    config._attn_implementation = "sdpa"  # eager attention takes its softmax in float32; sdpa stays in float64
    from transformers.models.emu3.modeling_emu3 import Emu3VQVAE

    model = Emu3VQVAE(config).double().eval()
    randomise_norms(model, torch.Generator().manual_seed(6))
    return model


@torch.no_grad()
def randomise_norms(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Random affine norms and BatchNorm statistics (float64), so that every stored value changes the image."""
    for module in model.modules():
        if isinstance(module, (torch.nn.BatchNorm3d, torch.nn.GroupNorm)):
            module.weight.copy_(1 + 0.3 * torch.randn(module.weight.shape, generator=generator, dtype=torch.float64))
            module.bias.copy_(0.3 * torch.randn(module.bias.shape, generator=generator, dtype=torch.float64))
        if isinstance(module, torch.nn.BatchNorm3d):
            module.running_mean.copy_(0.2 * torch.randn(module.running_mean.shape, generator=generator,
                                                        dtype=torch.float64))
            module.running_var.copy_(0.5 + torch.rand(module.running_var.shape, generator=generator,
                                                      dtype=torch.float64))


VQ_TOLERANCE = 1e5 * torch.finfo(torch.float64).eps  # relative to the image's scale, float64 on both sides


def check_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """A float64 decode within VQ_TOLERANCE of a float64 reference, relative to the image's largest value."""
    scale = ref.abs().max().item()
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= VQ_TOLERANCE * scale, (ours - ref).abs().max().item() / scale


# transformers' name -> the original one: convert_emu3_weights_to_hf.py's KEYS_TO_MODIFY_MAPPING read backwards
TO_ORIGINAL = (
    (r"\.middle_block\.attn_norm\.", ".mid.attn_1.norm."),
    (r"\.middle_block\.", ".mid."),
    (r"\.up_block\.up\.", ".up."),
    (r"\.down_block\.down\.", ".down."),
    (r"\.attn_norms\.(\d+)\.", r".attn.\1.norm."),
    (r"\.q_proj\.", ".q."),
    (r"\.k_proj\.", ".k."),
    (r"\.v_proj\.", ".v."),
    (r"\.out_proj\.", ".proj_out."),
)


def original_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole tokenizer (encoder and quant_conv too) as Emu3VisionVQModel names and shapes its tensors."""
    out = {}
    for key, tensor in model.state_dict().items():
        for pattern, replacement in TO_ORIGINAL:
            key = re.sub(pattern, replacement, key)
        if re.search(r"\.(q|k|v|proj_out)\.weight$", key):
            tensor = tensor[:, :, None, None]  # the original's 1x1 Conv2d kernels
        out[key] = tensor.contiguous()
    return out


def write_folder(folder, tensors: dict[str, torch.Tensor], config: dict = TINY):
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return folder




# ------------------------------------------------------------------------------------------- language model

# BAAI/Emu3-Gen's config.json field set as released (BAAI/Emu3-Chat's file has these same 30 fields; Emu3-Gen's
# image_area 518400 and max_position_embeddings 9216 are read from the Emu3-Gen-12B derivative's copy of it)
PUBLISHED_GEN = {
    "architectures": ["Emu3ForCausalLM"], "attention_dropout": 0.1,
    "auto_map": {"AutoConfig": "configuration_emu3.Emu3Config",
                 "AutoModelForCausalLM": "modeling_emu3.Emu3ForCausalLM"},
    "boi_token_id": 151852, "bos_token_id": 151849, "eof_token_id": 151847, "eoi_token_id": 151853,
    "eol_token_id": 151846, "eos_token_id": 151850, "hidden_act": "silu", "hidden_size": 4096, "image_area": 518400,
    "img_token_id": 151851, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 9216,
    "model_type": "Emu3", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pad_token_id": 151643, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000.0,
    "tie_word_embeddings": False, "torch_dtype": "float32", "transformers_version": "4.44.0", "use_cache": True,
    "vocab_size": 184622,
}
CODES = TINY["codebook_size"]
EXTRAS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *(f"<|extra_{i}|>" for i in range(205)))
VISION_NAMES = ("<|image token|>", "<|image start|>", "<|image end|>",
                *(f"<|visual token {c:06d}|>" for c in range(CODES)))
WORDS = "a red cat dog photo of the on grass sky painting masterpiece, film grained best quality. lowres bad".split()
TINY_AREA = 32 * 32  # 1:1 -> 4 x 4 codes of 8 pixels


def tiny_ranks() -> dict[bytes, int]:
    """A byte-level rank table: the 256 bytes, then merges spelling a few words (so some merge and some don't)."""
    ranks = {bytes([b]): b for b in range(256)}
    for word in ("at", "ca", "cat", " c", " cat", "re", " re", "ed", " red", "in", "ing", "th", "the", " the", "**"):
        ranks.setdefault(word.encode(), len(ranks))
    return ranks


def special_ids(ranks: dict[bytes, int]) -> dict[str, int]:
    start = len(ranks)
    return {name: start + i for i, name in enumerate((*EXTRAS, *VISION_NAMES))}


def text_vocab_size() -> int:
    return len(tiny_ranks()) + len(EXTRAS) + len(VISION_NAMES)


def word_vocab(size: int) -> dict[str, int]:
    """tokenizer.json's ordinary vocabulary, `size` entries: <unk>, the prompt words, numbers, fillers."""
    names = ["<unk>", *WORDS, "*", ",", ".", *(str(n) for n in range(100))]
    names += [f"filler{i}" for i in range(size - len(names))]
    return {name: i for i, name in enumerate(names[:size])}


def reference_emu3(seed: int = 3):
    """transformers' Emu3ForConditionalGeneration: 2 layers, 4 heads, 2 key/value heads (GQA), theta 1e6 and
    eps 1e-5 left to Emu3TextConfig's defaults; its VQ is `reference_vision_tokenizer`'s, in float32."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    from tiny_families import _randomise

    names = special_ids(tiny_ranks())
    vq = reference_vision_tokenizer()
    config = Emu3Config(
        text_config=dict(vocab_size=text_vocab_size(), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=names["<|extra_203|>"], eos_token_id=names["<|extra_204|>"],
                         pad_token_id=names["<|endoftext|>"]),
        vq_config=vq.config.to_dict(), vocabulary_map=dict(names))
    model = Emu3ForConditionalGeneration(config).eval()
    _randomise(model.model.text_model, seed)
    _randomise(model.lm_head, seed + 1)
    model.model.vqmodel.load_state_dict(vq.float().state_dict())
    return model


def write_hf_folder(folder: Path, model, published_names: bool = False) -> Path:
    """transformers' layout as `save_pretrained` writes it (`model.text_model.*`, `lm_head.weight`,
    `model.vqmodel.*`) or, `published_names`, as BAAI/Emu3-Gen-hf's shards name them (`text_model.model.*`,
    `text_model.lm_head.weight`, `vqmodel.*`); a word-level tokenizer.json with Emu3's special tokens at the
    original numbering."""
    from tiny_families import write_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    if published_names:
        from safetensors.torch import load_file

        renames = (("model.text_model.", "text_model.model."), ("lm_head.", "text_model.lm_head."),
                   ("model.vqmodel.", "vqmodel."))
        tensors = load_file(str(folder / "model.safetensors"))
        renamed = {}
        for key, value in tensors.items():
            for old, new in renames:
                if key.startswith(old):
                    key = new + key[len(old):]
                    break
            renamed[key] = value
        save_file(renamed, str(folder / "model.safetensors"), metadata={"format": "pt"})
    ranks = tiny_ranks()
    vocab = {**word_vocab(len(ranks)), **special_ids(ranks)}
    write_tokenizer(folder / "tokenizer.json", vocab, [*EXTRAS, *VISION_NAMES])
    return folder


def original_config(model) -> dict:
    """PUBLISHED_GEN's fields with the tiny model's sizes and the tiny tokenizer's special ids."""
    text = model.config.text_config
    ids = special_ids(tiny_ranks())
    return {**PUBLISHED_GEN, "hidden_size": text.hidden_size, "intermediate_size": text.intermediate_size,
            "num_attention_heads": text.num_attention_heads, "num_hidden_layers": text.num_hidden_layers,
            "num_key_value_heads": text.num_key_value_heads, "vocab_size": text.vocab_size, "image_area": TINY_AREA,
            "max_position_embeddings": 512, "bos_token_id": ids["<|extra_203|>"], "eos_token_id": ids["<|extra_204|>"],
            "pad_token_id": ids["<|endoftext|>"], "img_token_id": ids["<|image token|>"],
            "boi_token_id": ids["<|image start|>"], "eoi_token_id": ids["<|image end|>"],
            "eol_token_id": ids["<|extra_200|>"], "eof_token_id": ids["<|extra_201|>"]}


def write_original_folder(folder: Path, model, with_vision_tokenizer: bool = True) -> Path:
    """The original layout (BAAI/Emu3-Gen + BAAI/Emu3-VisionTokenizer in vision_tokenizer/) of `model`'s weights."""
    folder.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    lm = {"model." + k[len("model.text_model."):]: v.contiguous() for k, v in state.items()
          if k.startswith("model.text_model.")}
    lm["lm_head.weight"] = state["lm_head.weight"].contiguous()
    save_file(lm, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(original_config(model), indent=2, sort_keys=True) + "\n")
    ranks = tiny_ranks()
    (folder / "emu3.tiktoken").write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    (folder / "emu3_vision_tokens.txt").write_text("\n".join(VISION_NAMES) + "\n")
    if with_vision_tokenizer:
        vq = {k[len("model.vqmodel."):]: v for k, v in state.items() if k.startswith("model.vqmodel.")}
        holder = reference_vision_tokenizer()
        holder.load_state_dict(vq)
        write_folder(folder / "vision_tokenizer", original_state(holder.float()), {**TINY, "torch_dtype": "float32"})
    return folder
