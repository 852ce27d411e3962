"""Tiny random Chameleon and Janus-Pro models built with transformers' own classes and saved as real
model folders (config.json, model.safetensors, tokenizer.json), for the parity and loader tests.

Weights get a larger std than the reference init and randomised norms/biases, so RoPE, QK-norm and
mask bugs cannot hide behind near-uniform attention. The tokenizers are word-level `tokenizers`
models holding each family's special tokens; Chameleon's IMGIMG names are assigned to vocabulary ids
in a shuffled order, so a loader that assumed "code = id - 4" would fail.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

IMAGE_CODES = 64
WORDS = ["a", "cat", "dog", "red", "blue", "photo", "of", "the", "on", "grass", "sky", "painting"]
CHAMELEON_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]


def _randomise(model: torch.nn.Module, seed: int, gain: float = 1.5) -> None:
    """Weights N(0, gain^2 / fan_in) (embeddings N(0, 1)), norms U(0.5, 1.5), biases N(0, 0.1^2): O(1)
    activations, peaked but varied next-token distributions."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif p.dim() == 1 or name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) * gain / fan_in ** 0.5)


def _letters(code: int) -> str:
    return "".join(chr(ord("A") + int(d)) for d in str(code))


def chameleon_vocab(seed: int = 0) -> dict[str, int]:
    """<s>=0, <pad>=1, </s>=2, <unk>=3, 64 image tokens at ids 4..67 in shuffled code order, then
    <eoss>, <racm3:break>, <reserved08706> and words."""
    vocab = {name: i for i, name in enumerate(CHAMELEON_SPECIALS)}
    order = torch.randperm(IMAGE_CODES, generator=torch.Generator().manual_seed(seed)).tolist()
    for offset, code in enumerate(order):
        vocab[f"IMGIMG{_letters(code)}Z"] = 4 + offset
    for name in ["<eoss>", "<racm3:break>", "<reserved08706>", "<image>"] + WORDS:
        vocab[name] = len(vocab)
    return vocab


def janus_vocab() -> dict[str, int]:
    names = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<unk>", "<begin_of_image>",
             "<end_of_image>", "<image_placeholder>", "<|User|>", "<|Assistant|>", ":"] + WORDS
    return {name: i for i, name in enumerate(names)}


def write_tokenizer(path: Path, vocab: dict[str, int], specials: list[str]) -> None:
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    tok.save(str(path))


LUMINA_SPECIALS = ["<reserved08799>"] + [f"<reserved{8800 + i:05d}>" for i in range(33)]  # row end; sizes to 1024 px


def save_chameleon_folder(folder: Path, swin_norm: bool = False, seed: int = 0, text_vocab: int = 96,
                          lumina: bool = False):
    """A transformers ChameleonForConditionalGeneration (QK-norm, GQA) in `folder`; returns the model.
    `lumina`: Lumina-mGPT's vocabulary (end-of-row and size tokens) and config (architectures name and
    z_loss_weight, as Alpha-VLLM's ChameleonXLLMX code writes it)."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    vocab = chameleon_vocab(seed)
    if lumina:
        for name in LUMINA_SPECIALS:
            vocab[name] = len(vocab)
        text_vocab = max(text_vocab, len(vocab) + 4)
    config = ChameleonConfig(
        vocab_size=text_vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, swin_norm=swin_norm, vocabulary_map=vocab,
        vq_config=dict(embed_dim=16, num_embeddings=IMAGE_CODES, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 2], resolution=32, attn_resolutions=[]))
    model = ChameleonForConditionalGeneration(config).eval()
    _randomise(model, seed)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    if lumina:  # Alpha-VLLM's release names its own class, whose config class adds z_loss_weight
        cfg = json.loads((folder / "config.json").read_text())
        cfg["architectures"] = ["ChameleonXLLMXForConditionalGeneration"]
        cfg["z_loss_weight"] = 1e-5
        (folder / "config.json").write_text(json.dumps(cfg))
    specials = [n for n in vocab if n.startswith("<")]
    write_tokenizer(folder / "tokenizer.json", vocab, specials)
    return model


def taming_names(sd: dict[str, torch.Tensor], levels: int) -> dict[str, torch.Tensor]:
    """Our VQ names -> taming's (decoder levels counted from the highest resolution), for writing a
    Chameleon-style vqgan.ckpt from known weights."""
    import re

    out = {}
    for key, value in sd.items():
        m = re.fullmatch(r"(encoder|decoder)\.conv_blocks\.(\d+)\.(res|attn|downsample|upsample)(.*)", key)
        if m:
            top, level, kind, rest = m.group(1), int(m.group(2)), m.group(3), m.group(4)
            level = levels - 1 - level if top == "decoder" else level
            key = f"{top}.{'down' if top == 'encoder' else 'up'}.{level}.{'block' if kind == 'res' else kind}{rest}"
        elif m := re.fullmatch(r"(encoder|decoder)\.mid\.(\d)\.(.*)", key):
            key = f"{m.group(1)}.mid.{['block_1', 'attn_1', 'block_2'][int(m.group(2))]}.{m.group(3)}"
        out[key] = value
    return out


def save_chameleon_vqgan(path: Path, seed: int = 4):
    """A tiny Chameleon VQGAN (IMAGE_CODES codes, 2 levels: 4x downsampling) written as Meta's
    `vqgan.ckpt` (Lightning `state_dict` in the taming layout, with a discriminator `loss.*` entry);
    returns our VQModel holding the same weights."""
    from lantern_core.config import VQConfig
    from lantern_core.models.vq import VQModel

    config = VQConfig(codebook_size=IMAGE_CODES, codebook_embed_dim=16, codebook_l2_norm=False,
                      codebook_show_usage=False, ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2),
                      z_channels=32, num_res_blocks=1, level_attention=False)
    source = VQModel(config).eval()
    _randomise(source, seed=seed)
    sd = taming_names(source.state_dict(), levels=2)
    sd["loss.discriminator.main.0.weight"] = torch.zeros(2, 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": sd, "global_step": 10}, path)
    return source, sd


def save_janus_folder(folder: Path, seed: int = 0, grid: int = 4, kv_heads: int = 2):
    """A transformers JanusForConditionalGeneration (Llama LM, 4 heads, `kv_heads` key/value heads (GQA by
    default; 4 for plain attention, as Janus-Pro), VQ-16-style tokenizer) in `folder`."""
    from transformers import JanusConfig, JanusForConditionalGeneration

    vocab = janus_vocab()
    text_vocab = 48
    config = JanusConfig(
        text_config=dict(model_type="llama", vocab_size=text_vocab, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads,
                         max_position_embeddings=512, bos_token_id=0, pad_token_id=2),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16 * grid,
                           patch_size=16, projection_dim=64, num_image_tokens=grid * grid),
        vq_config=dict(embed_dim=8, num_embeddings=IMAGE_CODES, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 2], num_patches=grid, projection_dim=64, image_token_embed_dim=64,
                       num_res_blocks=1),
        image_token_id=vocab["<image_placeholder>"])
    model = JanusForConditionalGeneration(config).eval()
    _randomise(model, seed)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder / "tokenizer.json", vocab, [n for n in vocab if n.startswith("<")])
    return model


# Janus-Pro-7B's published language_config, every field of it: DeepSeek's loader builds
# transformers.LlamaConfig(**language_config), so its width, heads and FFN size are LlamaConfig's defaults
JANUS_PRO_7B_LANGUAGE_CONFIG = {"max_position_embeddings": 16384, "model_type": "llama", "num_hidden_layers": 30,
                                "torch_dtype": "bfloat16", "vocab_size": 102400}
# the fields of Janus-Pro-1B's published language_config (hidden 2048, 24 layers, 16 heads, intermediate
# 5632): sizes spelled out, but no num_key_value_heads, rms_norm_eps or rope_theta
JANUS_PRO_1B_LANGUAGE_FIELDS = ("hidden_size", "intermediate_size", "max_position_embeddings", "model_type",
                                "num_attention_heads", "num_hidden_layers", "torch_dtype", "vocab_size")


def janus_1b_style_language_config(reference) -> dict:
    """`reference`'s (a tiny transformers Janus) sizes under exactly Janus-Pro-1B's language_config fields."""
    text = reference.config.text_config
    values = {"max_position_embeddings": 16384, "model_type": "llama", "torch_dtype": "bfloat16"}
    values.update({k: getattr(text, k) for k in JANUS_PRO_1B_LANGUAGE_FIELDS if k not in values})
    return {k: values[k] for k in JANUS_PRO_1B_LANGUAGE_FIELDS}


def deepseek_janus_config(language_config: dict, codes: int = IMAGE_CODES, embed_dim: int = 8, width: int = 64,
                          head_embed: int = 64) -> dict:
    """A config.json with the top-level structure of DeepSeek's published Janus-Pro ones (aligner_config,
    architectures, gen_aligner_config, gen_head_config, gen_vision_config, language_config, model_type,
    torch_dtype, transformers_version, vision_config), `language_config` written as given; `codes`,
    `embed_dim`, `width` (the LM's hidden size) and `head_embed` size the generation sections."""
    return {
        "aligner_config": {"cls": "MlpProjector", "model_type": "aligner",
                           "params": {"depth": 2, "input_dim": 1024, "n_embed": width, "projector_type": "mlp_gelu"}},
        "architectures": ["MultiModalityCausalLM"],
        "gen_aligner_config": {"cls": "MlpProjector", "model_type": "gen_aligner",
                               "params": {"depth": 2, "input_dim": embed_dim, "n_embed": width,
                                          "projector_type": "mlp_gelu"}},
        "gen_head_config": {"cls": "vision_head", "model_type": "gen_head",
                            "params": {"image_token_embed": head_embed, "image_token_size": codes, "n_embed": width}},
        "gen_vision_config": {"cls": "VQ-16", "model_type": "gen_vision",
                              "params": {"image_token_size": codes, "n_embed": embed_dim}},
        "language_config": dict(language_config),
        "model_type": "multi_modality",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.33.1",
        "vision_config": {"cls": "CLIPVisionTower", "model_type": "vision",
                          "params": {"image_size": 384, "model_name": "siglip_large_patch16_384",
                                     "select_feature": "same", "select_layer": -1}},
    }


def janus_pro_7b_config() -> dict:
    """Janus-Pro-7B's config.json field set: its published language_config and generation sections
    (16,384 codes of width 8, a 4,096-wide LM)."""
    return deepseek_janus_config(JANUS_PRO_7B_LANGUAGE_CONFIG, codes=16384, embed_dim=8, width=4096, head_embed=4096)


def save_deepseek_janus_folder(folder: Path, reference, language_config: dict | None = None) -> None:
    """The same Janus weights in DeepSeek's original layout (`language_model.model.*`, `gen_embed`,
    `gen_aligner.layers.{0,2}`, `gen_head.*`, `gen_vision_model.*` with LlamaGen VQ names) and config
    (`deepseek_janus_config`); `language_config` replaces the default one, which names every size."""
    from safetensors.torch import save_file

    renames = [("model.language_model.", "language_model.model."), ("lm_head.", "language_model.lm_head."),
               ("model.generation_embeddings.", "gen_embed."), ("model.generation_aligner.fc1.", "gen_aligner.layers.0."),
               ("model.generation_aligner.hidden_layers.0.", "gen_aligner.layers.2."),
               ("model.generation_head.proj_out.", "gen_head.output_mlp_projector."),
               ("model.generation_head.vision_head.", "gen_head.vision_head.")]
    out = {}
    for key, value in reference.state_dict().items():
        if key.startswith(("model.vision_model.", "model.aligner.")):
            continue
        if key.startswith("model.vqmodel."):
            out["gen_vision_model." + _llamagen_vq_name(key[len("model.vqmodel."):])] = value
            continue
        for old, new in renames:
            if key.startswith(old):
                key = new + key[len(old):]
                break
        out[key] = value
    out["gen_vision_model.quantize.codebook_used"] = torch.zeros(65536)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.clone().contiguous() for k, v in out.items()}, str(folder / "model.safetensors"))
    text = reference.config.text_config
    vq = reference.config.vq_config
    if language_config is None:
        language_config = {"hidden_size": text.hidden_size, "num_hidden_layers": text.num_hidden_layers,
                           "num_attention_heads": text.num_attention_heads,
                           "num_key_value_heads": text.num_key_value_heads,
                           "intermediate_size": text.intermediate_size, "vocab_size": text.vocab_size,
                           "rms_norm_eps": text.rms_norm_eps}
    config = deepseek_janus_config(language_config, codes=vq.num_embeddings, embed_dim=vq.embed_dim,
                                   width=vq.projection_dim, head_embed=vq.image_token_embed_dim)
    (folder / "config.json").write_text(json.dumps(config))
    write_tokenizer(folder / "tokenizer.json", janus_vocab(), [n for n in janus_vocab() if n.startswith("<")])


def _llamagen_vq_name(key: str) -> str:
    """transformers' Janus VQ name -> LlamaGen's (DeepSeek's gen_vision_model): down/up -> conv_blocks,
    block -> res, mid.block_1/attn_1/block_2 -> mid.0/1/2 (decoder levels keep their order)."""
    import re

    key = re.sub(r"^(encoder)\.down\.", r"\1.conv_blocks.", key)
    key = re.sub(r"^(decoder)\.up\.", r"\1.conv_blocks.", key)
    key = re.sub(r"\.block\.(\d+)\.", r".res.\1.", key)
    return key.replace("mid.block_1.", "mid.0.").replace("mid.attn_1.", "mid.1.").replace("mid.block_2.", "mid.2.")


def write_released_anole_drafter(folder, reference, seed=7):
    """LANTERN's `cnets_anole.Model` layout, built from transformers' ChameleonDecoderLayer: config.json
    (model_type chameleon, one layer) + pytorch_model.bin with embed_tokens (the target's text embedding),
    fc (+ bias) and layers.0.* (HF names, rotate-half q/k). Returns (layer, fc, embedding)."""
    from transformers import ChameleonConfig
    from transformers.models.chameleon.modeling_chameleon import ChameleonDecoderLayer

    cfg = reference.config.to_dict()
    cfg.update(num_hidden_layers=1, architectures=["ChameleonForConditionalGeneration"])
    config = ChameleonConfig(**{k: v for k, v in cfg.items() if k not in ("transformers_version",)})
    config._attn_implementation = "eager"
    layer = ChameleonDecoderLayer(config, 0).eval()
    fc = torch.nn.Linear(2 * config.hidden_size, config.hidden_size, bias=True)
    holder = torch.nn.ModuleDict({"layer": layer, "fc": fc})
    _randomise(holder, seed)
    embedding = reference.get_input_embeddings().weight.detach().clone()
    sd = {"embed_tokens.weight": embedding, "fc.weight": fc.weight.detach(), "fc.bias": fc.bias.detach()}
    sd.update({f"layers.0.{k}": v.detach() for k, v in layer.state_dict().items()})
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(sd, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "chameleon"}, default=str))
    return layer, fc, embedding, config


# LANTERN's Lumina-mGPT drafter config.json as released (`sihwanpark/LANTERN-Lumina-mGPT-7B-768`, the
# field set of LANTERN's data/configs/lumina_mgpt_config.json, which its training run writes): every field,
# including those our loader only reads past; the sizes are scaled down by `write_released_lumina_drafter`.
LUMINA_DRAFTER_CONFIG = {
    "architectures": ["ChameleonForConditionalGeneration"], "attention_bias": False, "attention_dropout": 0.0,
    "dropout": 0.05, "boi_token_id": 8197, "bos_token_id": 1, "eoi_token_id": 8196, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "image_token_id": 8711, "initializer_range": 0.02,
    "intermediate_size": 11008, "max_position_embeddings": 4096, "mlp_bias": False, "model_parallel_size": 1,
    "model_type": "chameleon", "num_attention_heads": 32, "num_hidden_layers": 1, "num_key_value_heads": 32,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0, "swin_norm": False,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.3", "use_cache": True,
    "vocab_size": 65536,
    "vq_config": {"attn_resolutions": [], "ch": 128, "ch_mult": [1, 1, 2, 2, 4], "double_z": False,
                  "model_type": "chameleon_vqgan", "n_embed": 8192, "out_ch": 3, "z_channels": 256},
}


def write_released_lumina_drafter(folder, reference, seed=8, **overrides):
    """LANTERN's `cnets_lumina_mgpt.Model` as its training run saves it: config.json with the released field
    set (LUMINA_DRAFTER_CONFIG, sizes of the tiny `reference` target, then `overrides`) + model.safetensors
    with embed_tokens (the target's text embedding), fc (+ bias) and layers.0.* in HF names, q/k in
    rotate-half order, and QK-norm parameters of shape (model_parallel_size = 1, head_dim): its
    ChameleonLayerNorm keeps one row per shard and repeat-interleaves it over the heads. Returns
    (transformers' ChameleonDecoderLayer with the same weights, its per-head norms expanded; fc; embedding;
    the layer's config)."""
    from safetensors.torch import save_file
    from transformers import ChameleonConfig
    from transformers.models.chameleon.modeling_chameleon import ChameleonDecoderLayer

    t = reference.config
    cfg = {**LUMINA_DRAFTER_CONFIG, "hidden_size": t.hidden_size, "intermediate_size": t.intermediate_size,
           "num_attention_heads": t.num_attention_heads, "num_key_value_heads": t.num_key_value_heads,
           "vocab_size": t.vocab_size, **overrides}
    config = ChameleonConfig(hidden_size=t.hidden_size, intermediate_size=t.intermediate_size, num_hidden_layers=1,
                             num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads,
                             rms_norm_eps=1e-5, vocab_size=t.vocab_size, max_position_embeddings=4096)
    config._attn_implementation = "eager"
    layer = ChameleonDecoderLayer(config, 0).eval()
    fc = torch.nn.Linear(2 * config.hidden_size, config.hidden_size, bias=True)
    _randomise(torch.nn.ModuleDict({"layer": layer, "fc": fc}), seed)
    sd = {"embed_tokens.weight": reference.get_input_embeddings().weight.detach().clone(),
          "fc.weight": fc.weight.detach().clone(), "fc.bias": fc.bias.detach().clone()}
    with torch.no_grad():
        for name, param in layer.state_dict().items():
            if "_norm." in name and "self_attn" in name:  # one shard's row, shared by every head
                row = param[:1].clone()
                param.copy_(row.expand_as(param))
                sd[f"layers.0.{name}"] = row
            else:
                sd[f"layers.0.{name}"] = param.detach().clone()
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return layer, fc, sd["embed_tokens.weight"], config


def lumina_reference_greedy(reference, encoder, config, image_ids, prompt: str, cfg: float) -> list[int]:
    """Lumina-mGPT's generator (1.0 and 2.0 alike), step by step, on transformers' model: full forwards (no cache)
    of the conditional and unconditional contexts, CFG on raw logits, then the row constraint (the row end after
    every `config.cols` codes, image tokens `image_ids` elsewhere)."""
    cond = encoder.token_ids(prompt)
    uncond = encoder.uncond_ids(cond)
    row_end = encoder.tokenizer.token_to_id("<reserved08799>")
    out: list[int] = []
    for i in range(config.num_image_tokens):
        with torch.no_grad():
            logits = [reference.lm_head(reference.model(input_ids=torch.tensor([ctx + out])).last_hidden_state)[0, -1]
                      for ctx in (cond, uncond)]
        mixed = logits[1] + cfg * (logits[0] - logits[1])
        if (i + 1) % (config.cols + 1) == 0:
            out.append(row_end)
            continue
        allowed = torch.full_like(mixed, float("-inf"))
        allowed[image_ids] = 0
        out.append(int((mixed + allowed).argmax()))
    return out
