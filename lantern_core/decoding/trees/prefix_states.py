"""The target features a drafter reads over the prefix, and the keys it may attend to there, in the
convention the drafter was trained with (`DrafterConfig.prefix_states`).

Two conventions differ on a left-padded prefix (LlamaGen-T2I captions, batched prompts):

* "native": LlamaGen's own forward. A padded caption row attends only to itself, and the drafter masks
  padded keys as the target does. Drafters trained here and LANTERN's Anole drafter expect it.
* "hf_port": LANTERN's HF port of LlamaGen-T2I, whose hidden states its released t2i drafters
  (`jadohu/llamagen_drafter`, `llamagen2_drafter`) were trained on. Its mask builder
  (`_prepare_decoder_attention_mask`) makes the causal mask in float32 (`finfo(float32).min` above the
  diagonal), the padding mask in the run's dtype (`finfo(dtype).min` on padded keys), and adds the two
  in float32; the attention adds that to its scores and takes a float32 softmax. On LlamaGen's prefix
  every score is exactly 0 (q = k = 0 under the zero RoPE rows), so a padded row i spreads uniformly
  over the keys that share the row's largest mask value, and that set depends on the dtype:
    - float32: padded past keys 0..i and future valid keys both sit at `finfo(float32).min`, a padded
      future key at min + min = -inf: row i averages padded keys 0..i and every valid caption key;
    - bfloat16 / float16 (LANTERN's default, bf16): padded past keys sit at the half-precision
      `finfo.min`, far above float32's min of the future keys: row i averages padded keys 0..i only.
  In half precision that is also what LANTERN's training-data script (caption + image tokens in one
  bf16 pass) gave the released drafters, so bf16 reproduces their training and their published
  acceptance; a float32 run gives them what LANTERN's float32 generator gives (the valid caption keys
  mixed in). Its drafter attends causally to every earlier position, padded ones included.

Every valid query masks padded keys in both, so the valid rows, the target's KV cache and every image
logit are the same. The hf_port states therefore come from a second, cache-free forward over the
prefix; only its padded rows are used, and only in the features handed to the drafter (valid rows
stay bit-identical to the prefill's). The summed float32 mask is handed to our attention in the run's
dtype, where every value the port's float32 softmax sends to 0 (float32's min, -inf) becomes -inf and
the half-precision min survives, so each padded row keeps exactly the port's set of keys.

This module builds those features and masks; it does not decode or train.
"""
from __future__ import annotations

import torch

from ...conditioning import Prefix
from ...models.gpt import ForwardStep, ImageTransformer


def hf_port_mask(key_valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The HF port's 4-D additive mask over a prefix, built as its `_prepare_decoder_attention_mask`
    builds it: key_valid (rows, T) bool -> (rows, 1, T, T) of `dtype`. The causal part is float32
    (`finfo(float32).min` above the diagonal), the padding part `dtype` (`finfo(dtype).min` on padded
    keys); their float32 sum is cast to `dtype` for our attention (float32's min and -inf become -inf
    in half precision, as the port's float32 softmax zeroes them; `dtype`'s own min survives)."""
    T = key_valid.shape[1]
    pos = torch.arange(T, device=key_valid.device)
    low = torch.finfo(torch.float32).min
    causal = torch.zeros(T, T, device=key_valid.device).masked_fill(pos[None, :] > pos[:, None], low)  # float32
    padding = torch.zeros(key_valid.shape, dtype=dtype, device=key_valid.device)
    padding = padding.masked_fill(~key_valid, torch.finfo(dtype).min)[:, None, None, :]  # (rows, 1, 1, T)
    summed = padding.float() + causal  # float32: padded and future -> min + min = -inf
    return summed.to(dtype)


def hf_port_states(model: ImageTransformer, embeddings: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """The HF port's final hidden states over a prefix: embeddings (rows, T, dim), key_valid (rows, T) ->
    (rows, T, dim). Writes no cache."""
    positions = torch.arange(embeddings.shape[1], device=embeddings.device)
    return model(embeddings, ForwardStep(positions, mask=hf_port_mask(key_valid, embeddings.dtype)))


def drafter_features(model: ImageTransformer, prefix: Prefix, hidden: torch.Tensor, convention: str) -> torch.Tensor:
    """The features a drafter of `convention` reads over `prefix`: `hidden` (rows, T, dim), the prefill's
    states of the prefix, its padded rows replaced by the HF port's under "hf_port". Unpadded prefixes and
    "native" return `hidden` itself. Whether the prefix is padded is `prefix.padded`, decided where the prefix
    was built (`conditioning.prefix_shape`): no read of the key mask here, so the memory planner's dry run on
    the meta device takes the same branch."""
    if convention == "native" or not prefix.padded:
        return hidden
    port = hf_port_states(model, prefix.embeddings, prefix.key_valid)
    return torch.where(prefix.key_valid[..., None], hidden, port)  # valid rows: the prefill's own bits


def drafter_key_valid(convention: str, key_valid: torch.Tensor) -> torch.Tensor:
    """The drafter's key mask (rows, slots): the target's own tensor ("native", shared so the prefill's
    writes reach it), or a tensor marking every key valid ("hf_port")."""
    return key_valid if convention == "native" else torch.ones_like(key_valid)
