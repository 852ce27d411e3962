"""VQ-GAN image tokenizer: encoder, quantiser (L2-normalised for LlamaGen / Janus), decoder. One module
serves LlamaGen's VQ-16 / VQ-8, Janus-Pro's VQ-16 and Chameleon's VQGAN (config flags, `VQConfig`).

Module and parameter names match `vq_ds16_c2i.pt` / `vq_ds16_t2i.pt` so official weights load with
strict key checks; the taming / Janus / transformers layouts are mapped onto them by `vq_io.py`. Images are (B, 3, H, W) in [-1, 1]; indices are (B, h*w) in raster order.
`decode_images` is how the pack turns tokens into output pixels: one image per decoder call, so image i
of a batch has exactly the pixels of a single run (a batched `VQModel.decode` is only close to them).
Losses and discriminators for training are not here (see `lantern_core.training.train_embedded`).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import VQConfig


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.norm1 = _norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = _norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        skip = x if self.nin_shortcut is None else self.nin_shortcut(x)
        return skip + h


class AttnBlock(nn.Module):
    """Single-head spatial self-attention with 1x1 q/k/v/proj_out."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = _norm(channels)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        h = self.norm(x)
        q, k, v = (m(h).reshape(B, 1, C, H * W).transpose(2, 3) for m in (self.q, self.k, self.v))  # (B,1,HW,C)
        out = F.scaled_dot_product_attention(q, k, v)  # softmax(q k^T / sqrt(C)) v
        return x + self.proj_out(out.transpose(2, 3).reshape(B, C, H, W))


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Level(nn.Module):
    """One resolution level: `res` blocks, optional `attn` blocks, optional `downsample`/`upsample`."""

    def __init__(self, res: list[nn.Module], attn: list[nn.Module]):
        super().__init__()
        self.res = nn.ModuleList(res)
        self.attn = nn.ModuleList(attn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.res):
            x = block(x)
            if len(self.attn) > 0:
                x = self.attn[i](x)
        return x


def _mid(channels: int) -> nn.ModuleList:
    return nn.ModuleList([ResnetBlock(channels, channels), AttnBlock(channels), ResnetBlock(channels, channels)])


class Encoder(nn.Module):
    def __init__(self, config: VQConfig):
        super().__init__()
        ch, mult = config.ch, config.encoder_ch_mult
        self.conv_in = nn.Conv2d(3, ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList()
        in_ch = ch
        for i, m in enumerate(mult):
            out_ch = ch * m
            last = i == len(mult) - 1
            res = [ResnetBlock(in_ch if j == 0 else out_ch, out_ch) for j in range(config.num_res_blocks)]
            attn = [AttnBlock(out_ch) for _ in range(config.num_res_blocks)] if last and config.level_attention else []
            level = Level(res, attn)
            if not last:
                level.downsample = Downsample(out_ch)
            self.conv_blocks.append(level)
            in_ch = out_ch
        self.mid = _mid(in_ch)
        self.norm_out = _norm(in_ch)
        self.conv_out = nn.Conv2d(in_ch, config.z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.conv_blocks:
            h = level(h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        for block in self.mid:
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, config: VQConfig):
        super().__init__()
        ch, mult = config.ch, config.decoder_ch_mult
        in_ch = ch * mult[-1]
        self.conv_in = nn.Conv2d(config.z_channels, in_ch, 3, padding=1)
        self.mid = _mid(in_ch)
        self.conv_blocks = nn.ModuleList()
        for i in range(len(mult)):
            out_ch = ch * mult[len(mult) - 1 - i]
            res = [ResnetBlock(in_ch if j == 0 else out_ch, out_ch) for j in range(config.num_res_blocks + 1)]
            attn = [AttnBlock(out_ch) for _ in range(config.num_res_blocks + 1)] if i == 0 and config.level_attention else []
            level = Level(res, attn)
            if i != len(mult) - 1:
                level.upsample = Upsample(out_ch)
            self.conv_blocks.append(level)
            in_ch = out_ch
        self.norm_out = _norm(in_ch)
        self.conv_out = nn.Conv2d(in_ch, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for level in self.conv_blocks:
            h = level(h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    def __init__(self, config: VQConfig):
        super().__init__()
        self.l2_norm = config.codebook_l2_norm
        self.embedding = nn.Embedding(config.codebook_size, config.codebook_embed_dim)
        if config.codebook_show_usage:
            self.register_buffer("codebook_used", torch.zeros(65536))

    def codebook(self) -> torch.Tensor:
        """The codebook used to quantise and decode: (V, C), L2-normalised when the config says so."""
        w = self.embedding.weight
        return F.normalize(w, p=2, dim=-1) if self.l2_norm else w

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """z (B, C, h, w) -> indices (B, h*w) of the nearest codes."""
        B, C, h, w = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, C)  # (B*h*w, C)
        if self.l2_norm:
            flat = F.normalize(flat, p=2, dim=-1)
        book = self.codebook()
        dist = flat.pow(2).sum(1, keepdim=True) + book.pow(2).sum(1)[None] - 2 * flat @ book.t()
        return dist.argmin(dim=1).reshape(B, h * w)

    def lookup(self, indices: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """indices (B, h*w) -> quantised latents (B, C, h, w)."""
        B = indices.shape[0]
        z = self.codebook()[indices]  # (B, h*w, C)
        return z.reshape(B, grid[0], grid[1], -1).permute(0, 3, 1, 2)


class VQModel(nn.Module):
    def __init__(self, config: VQConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quantize = VectorQuantizer(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.codebook_embed_dim, config.z_channels, 1)

    @property
    def downsample(self) -> int:
        return self.config.downsample

    def encode_latents(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) in [-1, 1] -> continuous latents (B, C, H/ds, W/ds)."""
        return self.quant_conv(self.encoder(images))

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) in [-1, 1] -> indices (B, (H/ds) * (W/ds)) in raster order."""
        return self.quantize.nearest(self.encode_latents(images))

    def decode_latents(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(z))

    def decode(self, indices: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """indices (B, h*w) -> images (B, 3, h*ds, w*ds) in about [-1, 1]. Square grid by default. One batched
        call: image i's last bits depend on B; `decode_images` gives batch-invariant pixels."""
        return self.decode_latents(self.quantize.lookup(indices, grid or square_grid(indices.shape[1])))


def square_grid(tokens: int) -> tuple[int, int]:
    """(side, side) for a square image of `tokens` codes; a ValueError when it is not a square."""
    side = int(round(tokens ** 0.5))
    if side * side != tokens:
        raise ValueError(f"decode: {tokens} tokens is not a square grid; pass grid=(h, w)")
    return side, side


def decode_images(vq: VQModel, indices: torch.Tensor, grid: tuple[int, int] | None = None,
                  per_image: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """indices (B, h*w) -> images (B, 3, h*ds, w*ds) in about [-1, 1], each image decoded on its own.

    The pack turns tokens into output pixels only through this function (command line, Decode and Generate
    nodes, sampler previews), so that **image i of a batch is pixel-identical to a single run of the same
    tokens**; only the benchmark's quality metrics and the training script's sample sheet, which compare
    no image with a single run, call the batched decoder. One batched `vq.decode` call is not: CPU BLAS / oneDNN (and cuDNN / cuBLAS) choose kernels and blockings
    per batch size, so the same tokens decode to floats that differ in the last bits at another batch size
    and round to another 8-bit value on about 1% of the pixels (at most 1/255). Decoding batch rows one at
    a time gives every image the batch-1 shapes, hence the batch-1 kernels and bits, whatever the batch.
    This holds per device, dtype and library build, as far as those kernels are deterministic (on CUDA not
    with `torch.backends.cudnn.benchmark`, which ComfyUI turns on only with `--fast autotune`).

    Cost: `make bench` / `make bench-cuda` time it next to one batched call (`bench/results/decode_*.md`);
    on 2 CPU cores one by one costs nothing (0.6-1.1x of batched per image), and the decode is a one-off
    per image next to hundreds of sampling forwards. It also bounds the decoder's activation memory to
    one image.

    `per_image`, if given, is applied to each decoded (1, 3, H, W) image before they are concatenated
    (e.g. convert it and move it off the device, check for Cancel)."""
    images = []
    with torch.no_grad():
        for row in indices.split(1):
            image = vq.decode(row, grid)
            images.append(image if per_image is None else per_image(image))
    return torch.cat(images)
