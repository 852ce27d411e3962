"""The shared decoder-only transformer (attention, block, trunk) and the LlamaGen GPT built on it.

Every model family runs on these modules: `ImageTransformer` is the trunk (blocks, final norm, RoPE
table, KV-cache allocation) and a family adds only its embeddings and output head (`LlamaGenGPT` here,
Chameleon and Janus in `prompted.py`). Family differences are config flags, not copies: Chameleon's
per-head QK LayerNorm (`qk_norm`), norms after the sub-layers (`swin_norm`), 1-D or 2-D RoPE.

Parameter names follow LlamaGen's checkpoints exactly (`tok_embeddings`, `layers.{i}.attention.wqkv`,
`feed_forward.w1/w2/w3`, `attention_norm`, `ffn_norm`, `norm`, `output`, `cls_embedding.*`) so official
weights load with strict key checks; other layouts are mapped onto these names by their loaders. The
forward pass takes explicit positions, cache slots and an attention mask, so the same module serves AR
decoding, teacher-forced training, tree verification and Jacobi windows. Sampling, caching policy and
loops live in the decoders, not here.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import GPTConfig
from ..errors import ConfigError
from ..layout import constrain
from .kv_cache import KVCache, attention_mask
from .rope import apply_rope, build_rope_1d, build_rope_2d

# Spare zero RoPE rows past the grid, so speculative positions that overrun the image stay valid.
ROPE_EXTRA_ROWS = 16


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x * rsqrt(mean(x^2) + eps) * weight in one op: one fused kernel on CUDA and MPS (statistics in float32
        # inside it); LlamaGen casts to float32, rounds the normalised x to the model dtype and then multiplies by
        # the weight. In float32 both are the same arithmetic; in half precision ours rounds once instead of
        # twice (within one unit in the last place of LlamaGen's result).
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), no biases. w1 and w3 are held as one (2 * hidden, dim) matrix `w13`
    (one GEMM instead of two); checkpoints keep LlamaGen's separate `w1.weight` and `w3.weight`, which
    `state_dict()` writes and `load_state_dict()` reads (strictly: both or an error)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.w13 = nn.Linear(dim, 2 * hidden, bias=False)  # rows [w1; w3]: init draws w1's numbers, then w3's
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self._register_state_dict_hook(_split_w13)
        self._register_load_state_dict_pre_hook(_join_w13, with_module=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split(self.hidden, dim=-1)
        return self.w2(F.silu(gate) * up)


def _split_w13(module: FeedForward, state: dict, prefix: str, local_metadata) -> None:
    """state_dict(): `w13.weight` -> LlamaGen's `w1.weight` and `w3.weight` (views, no copy); a quantized
    layer's `w13.scale` likewise -> `w1.scale` and `w3.scale`."""
    for suffix in ("weight", "scale"):
        w13 = state.pop(prefix + "w13." + suffix, None)
        if w13 is not None:
            state[prefix + "w1." + suffix], state[prefix + "w3." + suffix] = w13.split(module.hidden, dim=0)


def _join_w13(module: FeedForward, state: dict, prefix: str, *args) -> None:
    """load_state_dict(): LlamaGen's `w1.weight` and `w3.weight` -> `w13.weight` (and a quantized file's
    `w1.scale`, `w3.scale` -> `w13.scale`). With only one of a pair the keys stay as they are, so the strict
    load names what is missing."""
    for suffix, dims in (("weight", 2), ("scale", 1)):
        w1, w3 = prefix + "w1." + suffix, prefix + "w3." + suffix
        if w1 in state and w3 in state and state[w1].shape == state[w3].shape and state[w1].dim() == dims:
            state[prefix + "w13." + suffix] = torch.cat([state.pop(w1), state.pop(w3)], dim=0)


class HeadLayerNorm(nn.Module):
    """Chameleon's QK norm: LayerNorm statistics over each head's vector, then a per-(head, channel)
    affine (weight and bias of shape (heads, head_dim)); eps 1e-5 as in the reference."""

    def __init__(self, heads: int, head_dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, H, D)
        return F.layer_norm(x, x.shape[-1:], eps=self.eps) * self.weight + self.bias


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
        if config.qk_norm:
            self.q_norm = HeadLayerNorm(config.n_head, config.head_dim)
            self.k_norm = HeadLayerNorm(config.n_kv_head, config.head_dim)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, rope: torch.Tensor, step: "ForwardStep", layer: int) -> torch.Tensor:
        B, T, _ = x.shape
        qkv = self.wqkv(x)  # (B, T, q_size + 2 kv_size)
        if self.q_norm is None:  # q and k rotated together: one RoPE (and cast) instead of two
            qk = qkv[..., :self.q_size + self.kv_size].view(B, T, self.n_head + self.n_kv_head, self.head_dim)
            q, k = apply_rope(qk, rope).split([self.n_head, self.n_kv_head], dim=2)
        else:
            q = self.q_norm(qkv[..., :self.q_size].view(B, T, self.n_head, self.head_dim))
            k = self.k_norm(qkv[..., self.q_size:self.q_size + self.kv_size].view(B, T, self.n_kv_head, self.head_dim))
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        v = qkv[..., self.q_size + self.kv_size:].view(B, T, self.n_kv_head, self.head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if step.cache is not None:  # keys/values of every slot up to kv_len, (B, H_kv, kv_len, D)
            k, v = step.cache.update(layer, step.slots, k, v, step.kv_len)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=step.mask, is_causal=step.mask is None and step.cache is None,
            enable_gqa=self.n_kv_head != self.n_head,
        )  # (B, H, T, D)
        return self.wo(out.transpose(1, 2).reshape(B, T, self.q_size))


class TransformerBlock(nn.Module):
    """Pre-norm block (LlamaGen, Llama, Chameleon-7B); with `swin_norm` the two norms are applied to the
    sub-layer outputs instead (Chameleon's Swin variant): h = x + norm(attn(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.swin_norm = config.swin_norm
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config.dim, config.ffn_dim)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, step: "ForwardStep", layer: int) -> torch.Tensor:
        if self.swin_norm:
            h = x + self.attention_norm(self.attention(x, rope, step, layer))
            return h + self.ffn_norm(self.feed_forward(h))
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


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as the additive one attention adds to its scores: 0 where visible, -inf
    elsewhere (log 1 = 0, log 0 = -inf: two kernels, exact in every dtype). Additive masks combine by
    `torch.maximum` (the union of what two masks show)."""
    return mask.to(dtype).log_()


class ForwardStep:
    """Where one forward reads and writes: RoPE rows, cache slots, visible prefix and mask."""

    __slots__ = ("positions", "slots", "kv_len", "mask", "cache")

    def __init__(self, positions: torch.Tensor, cache: KVCache | None = None, kv_len: int = 0,
                 mask: torch.Tensor | None = None, slots: torch.Tensor | None = None):
        self.positions = positions  # (T,) RoPE rows
        self.slots = positions if slots is None else slots  # (T,) cache slots written
        self.kv_len = kv_len
        self.mask = mask  # (B, 1, T, kv_len) bool, or additive in the model dtype, or None (causal)
        self.cache = cache

    def with_additive_mask(self, dtype: torch.dtype) -> "ForwardStep":
        """This step with a boolean mask turned into the additive one (0 where visible, -inf elsewhere) that
        attention would otherwise build from it in every layer: once per forward instead of once per layer."""
        if self.mask is None or self.mask.dtype != torch.bool:
            return self
        return ForwardStep(self.positions, self.cache, self.kv_len, additive_mask(self.mask, dtype), self.slots)


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


class ImageTransformer(Fp32Rope):
    """The trunk every family shares: blocks, final norm, RoPE table, static KV cache. Subclasses add
    `tok_embeddings` (its weight tells device and dtype), `embed_tokens(codes)` (image codes -> inputs)
    and `logits(hidden)` (hidden -> logits over the image codes)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config

    def _build_trunk(self) -> None:
        """Add the blocks and final norm (subclasses call it after their input embeddings, so module
        order, and with it `init_weights`' random stream, stays LlamaGen's)."""
        self.layers = nn.ModuleList(TransformerBlock(self.config) for _ in range(self.config.n_layer))
        self.norm = RMSNorm(self.config.dim, self.config.norm_eps)

    def _build_rope(self) -> torch.Tensor:
        c = self.config
        if c.rope_dims == 1:  # one row per cache slot (prompt + image), plus the spare rows
            return build_rope_1d(c.max_seq_len + ROPE_EXTRA_ROWS, c.head_dim, c.rope_base)
        return build_rope_2d(c.grid_size, c.head_dim, c.rope_base, c.cls_token_num, extra_rows=ROPE_EXTRA_ROWS)

    def with_grid(self, rows: int, cols: int) -> "ImageTransformer":
        """This model drawing `rows` x `cols` codes (Lumina-mGPT's sizes): a view sharing every parameter,
        buffer and submodule (nothing is copied), with its own config and, when the image is longer than the
        table, its own 1-D RoPE table. Views are kept per grid (`grid_base` names the model they view), so the
        captured steps of a size are reused by every later run of that size and released with the model;
        a view whose RoPE table is not where the model's is (the model moved) is made again. 1-D RoPE models
        only (2-D RoPE ties the table to the trained square grid)."""
        config = self.config.with_grid(rows, cols)
        if config == self.config:
            return self
        if config.rope_dims != 1:
            raise ConfigError("image size", f"the {self.config.grid_size}x{self.config.grid_size} token grid this "
                              "2-D RoPE model was trained on", f"{rows}x{cols} tokens", "choose auto")
        views = self.__dict__.setdefault("_grid_views", {})
        view = views.get((rows, cols))
        if view is not None and view.rope_table.device == self.rope_table.device:
            return view
        view = copy.copy(self)  # a new __dict__ holding the same parameter, buffer and module dicts
        view.__dict__["_buffers"] = dict(self._buffers)  # so the view's RoPE table is its own
        view.__dict__["_grid_views"] = {}
        view.__dict__["grid_base"] = self
        view.config = config
        if view.rope_table.shape[0] < config.max_seq_len + ROPE_EXTRA_ROWS:
            view._buffers["rope_table"] = view._build_rope().to(self.rope_table.device)
        views[(rows, cols)] = view
        return view

    def constrain_logits(self, logits: torch.Tensor, index: torch.Tensor | int) -> torch.Tensor:
        """The family's forced-token layout (Lumina-mGPT's end-of-row tokens) on CFG-combined logits for
        image-token indices `index`; the identity for every other model (see `layout.py`)."""
        return constrain(self.config, logits, index)

    def forward(self, h: torch.Tensor, step: ForwardStep) -> torch.Tensor:
        """Run the trunk on embeddings h (B, T, dim); returns final-normed hidden states (B, T, dim)."""
        rope = self.rope_table[step.positions]  # (T, D/2, 2)
        step = step.with_additive_mask(h.dtype)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, step, i)
        return self.norm(h)

    def set_kv_cache(self, fmt: str) -> "ImageTransformer":
        """Later runs keep keys and values as `fmt` ("auto": the model's dtype, "int8": 8-bit with scales); set
        before the model draws (grid views copy the config when they are made)."""
        self.config = replace(self.config, kv_cache=fmt)
        return self

    def allocate_cache(self, batch: int, max_len: int | None = None, device=None, dtype=None) -> KVCache:
        weight = self.tok_embeddings.weight
        c = self.config
        return KVCache.allocate(c.n_layer, batch, c.n_kv_head, max_len or c.max_seq_len, c.head_dim,
                                device or weight.device, dtype or weight.dtype, int8=c.kv_cache == "int8")


class LlamaGenGPT(ImageTransformer):
    def __init__(self, config: GPTConfig):
        super().__init__(config)
        if config.model_type == "c2i":
            self.cls_embedding = LabelEmbedder(config.num_classes, config.dim)
        else:
            self.cls_embedding = CaptionEmbedder(config.caption_dim, config.dim, config.cls_token_num)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self._build_trunk()
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.register_buffer("rope_table", self._build_rope(), persistent=False)  # not in checkpoints, as upstream

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None, std: float = 0.02) -> None:
        """LlamaGen's initialisation: N(0, std) for linear and embedding weights, zero output layer."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std, generator=generator)
        nn.init.zeros_(self.output.weight)
        if isinstance(self.cls_embedding, CaptionEmbedder):
            buf = self.cls_embedding.uncond_embedding
            buf.copy_(torch.randn(buf.shape, generator=generator, device=buf.device, dtype=buf.dtype) / buf.shape[1] ** 0.5)

    def embed_condition(self, condition: torch.Tensor) -> torch.Tensor:
        """c2i: labels (B,) long -> (B, 1, dim). t2i: caption features (B, T_cap, caption_dim) -> (B, T_cap, dim)."""
        return self.cls_embedding(condition)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok_embeddings(tokens)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(hidden).float()

    def training_logits(self, condition: torch.Tensor, tokens: torch.Tensor,
                        caption_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher forcing: logits (B, N, V) predicting tokens (B, N) from the prefix and tokens[:, :-1]. A
        left-padded t2i caption needs its `caption_mask` (B, T_cap), True on real tokens: padded prefix keys
        are then hidden from every query (a padded row still sees itself), as in LlamaGen's training forward
        and in decoding; without it every prefix key is attended."""
        prefix = self.embed_condition(condition)
        h = torch.cat([prefix, self.embed_tokens(tokens[:, :-1])], dim=1)  # (B, cls + N - 1, dim)
        L = h.shape[1]
        positions = torch.arange(L, device=h.device)
        mask = None
        if caption_mask is not None:
            key_valid = torch.ones(h.shape[0], L, dtype=torch.bool, device=h.device)
            key_valid[:, :prefix.shape[1]] = caption_mask.to(h.device).bool()
            mask = attention_mask(key_valid, positions, L)
        hidden = self.forward(h, ForwardStep(positions, mask=mask))
        return self.logits(hidden[:, self.config.cls_token_num - 1:])
