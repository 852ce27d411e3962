"""Lumina-mGPT 2.0's decoder as its own code computes it (Alpha-VLLM/Lumina-mGPT-2.0,
lumina_mgpt/model/chameleon/modeling_chameleon.py: read and re-written here, not copied), in float64, straight
from the released tensors: RMSNorm in float32 arithmetic, cast back, then times its weight (here all float64);
q / k / v projections; QK-norm as its ChameleonLayerNorm does it, a LayerNorm without affine over each head's
vector (eps 1e-5), then times the (model_parallel_size, head_dim) weight and plus the bias, each row repeated over
its block of consecutive heads; rotate-half RoPE (theta from the config) after the norm; causal attention; o_proj;
the SwiGLU MLP; the final norm and `lm_head`. Pre-norm layers (`swin_norm` false, as the fixture)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def head_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """x (B, T, H, D); weight / bias (mp, D), each row shared by H / mp consecutive heads."""
    heads = x.shape[2]
    x = F.layer_norm(x, x.shape[-1:], eps=1e-5)
    per = heads // weight.shape[0]
    return x * weight.repeat_interleave(per, 0) + bias.repeat_interleave(per, 0)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def logits(tensors: dict[str, torch.Tensor], cfg: dict, ids: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary logits (B, T, V) of token ids (B, T), positions 0..T-1."""
    t = {k: v.double() for k, v in tensors.items()}
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    eps, theta = cfg.get("rms_norm_eps", 1e-5), cfg.get("rope_theta", 10000.0)
    h = t["model.embed_tokens.weight"][ids]
    B, T, dim = h.shape
    hd = dim // heads
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()  # (T, hd)
    layer = 0
    while f"model.layers.{layer}.self_attn.q_proj.weight" in t:
        p = f"model.layers.{layer}."
        x = rms_norm(h, t[p + "input_layernorm.weight"], eps)
        q = (x @ t[p + "self_attn.q_proj.weight"].T).view(B, T, heads, hd)
        k = (x @ t[p + "self_attn.k_proj.weight"].T).view(B, T, kv_heads, hd)
        v = (x @ t[p + "self_attn.v_proj.weight"].T).view(B, T, kv_heads, hd)
        q = head_norm(q, t[p + "self_attn.q_norm.weight"], t[p + "self_attn.q_norm.bias"]).transpose(1, 2)
        k = head_norm(k, t[p + "self_attn.k_norm.weight"], t[p + "self_attn.k_norm.bias"]).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        v = v.transpose(1, 2)
        if kv_heads != heads:
            k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, dim)
        h = h + out @ t[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, t[p + "post_attention_layernorm.weight"], eps)
        gate, up = x @ t[p + "mlp.gate_proj.weight"].T, x @ t[p + "mlp.up_proj.weight"].T
        h = h + (F.silu(gate) * up) @ t[p + "mlp.down_proj.weight"].T
        layer += 1
    return rms_norm(h, t["model.norm.weight"], eps) @ t["lm_head.weight"].T
