"""LlamaGen-architecture GPT (class- and text-conditional), written from the public description.

Parameter names follow LlamaGen's checkpoints exactly (`tok_embeddings`, `layers.{i}.attention.wqkv`,
`feed_forward.w1/w2/w3`, `attention_norm`, `ffn_norm`, `norm`, `output`, `cls_embedding.*`) so official
weights load with strict key checks. The forward pass takes explicit positions, cache slots and an
attention mask, so the same module serves AR decoding, teacher-forced training and (later) tree
verification. Sampling, caching policy and loops live in `generate.py`, not here.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import GPTConfig
from .kv_cache import KVCache
from .rope import apply_rope, build_rope_2d

# Spare zero RoPE rows past the grid, so speculative positions that overrun the image stay valid.
ROPE_EXTRA_ROWS = 16


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x * rsqrt(mean(x^2) + eps) in fp32, cast back, then the weight (LlamaGen's order), as one fused op
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x) * self.weight


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), no biases."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Attention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.head_dim = config.head_dim
        self.q_size = config.n_head * config.head_dim
        self.kv_size = config.n_kv_head * config.head_dim
        self.wqkv = nn.Linear(config.dim, self.q_size + 2 * self.kv_size, bias=False)
        self.wo = nn.Linear(self.q_size, config.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, step: "ForwardStep", layer: int) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.wqkv(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(q.view(B, T, self.n_head, self.head_dim), rope)
        k = apply_rope(k.view(B, T, self.n_kv_head, self.head_dim), rope)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if step.cache is not None:  # keys/values of every slot up to kv_len, (B, H_kv, kv_len, D)
            k, v = step.cache.update(layer, step.slots, k, v, step.kv_len)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=step.mask, is_causal=step.mask is None and step.cache is None,
            enable_gqa=self.n_kv_head != self.n_head,
        )  # (B, H, T, D)
        return self.wo(out.transpose(1, 2).reshape(B, T, self.q_size))


class TransformerBlock(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config.dim, config.ffn_dim)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, step: "ForwardStep", layer: int) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope, step, layer)
        return h + self.feed_forward(self.ffn_norm(h))


class LabelEmbedder(nn.Module):
    """Class label -> one prefix token. Row `num_classes` is the null class used for CFG."""

    def __init__(self, num_classes: int, dim: int):
        super().__init__()
        self.num_classes = num_classes
        self.embedding_table = nn.Embedding(num_classes + 1, dim)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        return self.embedding_table(labels)[:, None, :]  # (B, 1, dim)


class CaptionMLP(nn.Module):
    def __init__(self, in_features: int, hidden: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    """T5 caption features (B, T_cap, caption_dim) -> prefix tokens; `uncond_embedding` is a saved buffer."""

    def __init__(self, caption_dim: int, dim: int, token_num: int):
        super().__init__()
        self.cap_proj = CaptionMLP(caption_dim, dim, dim)
        self.register_buffer("uncond_embedding", torch.zeros(token_num, caption_dim))

    def forward(self, caption: torch.Tensor) -> torch.Tensor:
        return self.cap_proj(caption)


class ForwardStep:
    """Where one forward reads and writes: RoPE rows, cache slots, visible prefix and mask."""

    __slots__ = ("positions", "slots", "kv_len", "mask", "cache")

    def __init__(self, positions: torch.Tensor, cache: KVCache | None = None, kv_len: int = 0,
                 mask: torch.Tensor | None = None, slots: torch.Tensor | None = None):
        self.positions = positions  # (T,) RoPE rows
        self.slots = positions if slots is None else slots  # (T,) cache slots written
        self.kv_len = kv_len
        self.mask = mask  # (B, 1, T, kv_len) bool or None (causal)
        self.cache = cache


class Fp32Rope(nn.Module):
    """Base for modules with a non-persistent `rope_table` rebuilt by `_build_rope`: .to(bf16) / .half()
    must not round the RoPE table, so it is rebuilt in float32 (as upstream keeps freqs_cis)."""

    def _build_rope(self) -> torch.Tensor:
        raise NotImplementedError

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self.rope_table.dtype != torch.float32:
            self.rope_table = self._build_rope().to(self.rope_table.device)
        return self


class LlamaGenGPT(Fp32Rope):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        if config.model_type == "c2i":
            self.cls_embedding = LabelEmbedder(config.num_classes, config.dim)
        else:
            self.cls_embedding = CaptionEmbedder(config.caption_dim, config.dim, config.cls_token_num)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.register_buffer("rope_table", self._build_rope(), persistent=False)  # not in checkpoints, as upstream

    def _build_rope(self) -> torch.Tensor:
        c = self.config
        return build_rope_2d(c.grid_size, c.head_dim, c.rope_base, c.cls_token_num, extra_rows=ROPE_EXTRA_ROWS)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None, std: float = 0.02) -> None:
        """LlamaGen's initialisation: N(0, std) for linear and embedding weights, zero output layer."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std, generator=generator)
        nn.init.zeros_(self.output.weight)
        if isinstance(self.cls_embedding, CaptionEmbedder):
            buf = self.cls_embedding.uncond_embedding
            buf.copy_(torch.randn(buf.shape, generator=generator) / buf.shape[1] ** 0.5)

    def embed_condition(self, condition: torch.Tensor) -> torch.Tensor:
        """c2i: labels (B,) long -> (B, 1, dim). t2i: caption features (B, T_cap, caption_dim) -> (B, T_cap, dim)."""
        return self.cls_embedding(condition)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok_embeddings(tokens)

    def forward(self, h: torch.Tensor, step: ForwardStep) -> torch.Tensor:
        """Run the trunk on embeddings h (B, T, dim); returns final-normed hidden states (B, T, dim)."""
        rope = self.rope_table[step.positions]  # (T, D/2, 2)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, step, i)
        return self.norm(h)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(hidden).float()

    def allocate_cache(self, batch: int, max_len: int | None = None, device=None, dtype=None) -> KVCache:
        weight = self.tok_embeddings.weight
        c = self.config
        return KVCache.allocate(c.n_layer, batch, c.n_kv_head, max_len or c.max_seq_len, c.head_dim,
                                device or weight.device, dtype or weight.dtype)

    def training_logits(self, condition: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: logits (B, N, V) predicting tokens (B, N) from the prefix and tokens[:, :-1]."""
        prefix = self.embed_condition(condition)
        h = torch.cat([prefix, self.embed_tokens(tokens[:, :-1])], dim=1)  # (B, cls + N - 1, dim)
        positions = torch.arange(h.shape[1], device=h.device)
        hidden = self.forward(h, ForwardStep(positions))
        return self.logits(hidden[:, self.config.cls_token_num - 1:])
