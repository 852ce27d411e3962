"""MoVQ image decoders: codes -> pixels for Emu3's vision tokenizer and MoVQGAN (Lumina-mGPT 2.0).

Both decode with MoVQ's spatially conditioned normalisation: every norm of the decoder is
`GroupNorm(32, eps 1e-6)(x) * conv_y(zq) + conv_b(zq)`, where zq is the quantized latent grid resized (nearest)
to the feature map, so the codes steer every layer, not only the input. The 2-D body (conv_in, a middle block
of resnet / single-head attention / resnet, up levels of `num_res_blocks + 1` resnet blocks with attention at
`attn_levels`, nearest x2 upsampling and a 3x3 conv between levels, norm, swish, conv_out) is the same for both.

Emu3 adds a temporal front, built for video: causal 3-D convolutions (two temporal resnet blocks with BatchNorm,
then `log2(temporal_downsample_factor)` temporal x2 upsamplings, each conv padded by two frames in front) over
both the post-quant latents and zq, and its decoder returns 4 frames per code frame; an image is frame 0. A
causal convolution's frame 0 sees only the zero padding and input frame 0, and a nearest temporal upsample
keeps frame 0, so frame 0 of the whole decoder is a 2-D network with each 3-D kernel cut to its last temporal
tap. That is what `Emu3Front` holds (the loader takes `weight[:, :, -1]` of each published 3-D kernel), so an
image costs one 2-D pass instead of four frames. BatchNorm runs with its stored statistics (inference only).

Images are (B, 3, H, W) in about [-1, 1]; codes (B, h*w) in raster order, as `VQModel`, so `decode_images`
serves both. This module does not encode images or read files (`loading/movq_io.py` maps the published keys).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ConfigError
from .vq import square_grid


@dataclass(frozen=True)
class MoVQConfig:
    codebook_size: int = 32768
    embed_dim: int = 4  # codebook vector width (= zq's channels)
    z_channels: int = 4  # post_quant_conv's output, the decoder's input
    ch: int = 256
    ch_mult: tuple[int, ...] = (1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_levels: tuple[int, ...] = (3,)  # levels (indices into ch_mult) whose up blocks attend
    temporal_blocks: int = 0  # Emu3: temporal resnet blocks in the front (0: no front, MoVQGAN)
    temporal_upsamples: int = 0  # Emu3: log2(temporal_downsample_factor)

    def __post_init__(self) -> None:
        for name in ("codebook_size", "embed_dim", "z_channels", "ch", "num_res_blocks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"MoVQConfig.{name}", "a positive integer", value)
        if not self.ch_mult or any(m < 1 for m in self.ch_mult) or any((self.ch * m) % 32 for m in self.ch_mult):
            raise ConfigError("MoVQConfig.ch_mult", "positive multipliers giving channel counts divisible by 32 "
                              "(GroupNorm's 32 groups)", {"ch": self.ch, "ch_mult": self.ch_mult})
        if any(not 0 <= level < len(self.ch_mult) for level in self.attn_levels):
            raise ConfigError("MoVQConfig.attn_levels", f"levels in 0..{len(self.ch_mult) - 1}", self.attn_levels)
        if self.temporal_blocks < 0 or self.temporal_upsamples < 0:
            raise ConfigError("MoVQConfig temporal front", "non-negative block counts",
                              (self.temporal_blocks, self.temporal_upsamples))
        if (self.temporal_blocks or self.temporal_upsamples) and self.embed_dim != self.z_channels:
            raise ConfigError("MoVQConfig.embed_dim", f"z_channels ({self.z_channels}): Emu3's front runs the "
                              "latents and zq through the same layers", self.embed_dim)

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


class SpatialNorm(nn.Module):
    """GroupNorm of x, scaled and shifted per pixel by 1x1 convolutions of zq (resized to x's grid)."""

    def __init__(self, zq_channels: int, channels: int):
        super().__init__()
        self.norm_layer = nn.GroupNorm(32, channels, eps=1e-6, affine=True)
        self.conv_y = nn.Conv2d(zq_channels, channels, 1)
        self.conv_b = nn.Conv2d(zq_channels, channels, 1)

    def forward(self, x: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        zq = F.interpolate(zq, size=x.shape[-2:], mode="nearest")
        return self.norm_layer(x) * self.conv_y(zq) + self.conv_b(zq)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, zq_channels: int):
        super().__init__()
        self.norm1 = SpatialNorm(zq_channels, in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = SpatialNorm(zq_channels, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x, zq)))
        h = self.conv2(F.silu(self.norm2(h, zq)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the pixels, softmax(q k^T / sqrt(C)) v, with 1x1 q / k / v / proj_out."""

    def __init__(self, channels: int, zq_channels: int):
        super().__init__()
        self.norm = SpatialNorm(zq_channels, channels)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1) for _ in range(4))

    def forward(self, x: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        h = self.norm(x, zq)
        q, k, v = (m(h).reshape(B, 1, C, H * W).transpose(2, 3) for m in (self.q, self.k, self.v))  # (B, 1, HW, C)
        out = F.scaled_dot_product_attention(q, k, v)
        return x + self.proj_out(out.transpose(2, 3).reshape(B, C, H, W))


class UpLevel(nn.Module):
    def __init__(self, blocks: list[ResnetBlock], attn: list[AttnBlock], upsample: nn.Conv2d | None):
        super().__init__()
        self.block = nn.ModuleList(blocks)
        self.attn = nn.ModuleList(attn)
        self.upsample = upsample

    def forward(self, x: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.block):
            x = block(x, zq)
            if len(self.attn):
                x = self.attn[i](x, zq)
        if self.upsample is not None:
            x = self.upsample(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return x


class TemporalBlock(nn.Module):
    """Frame 0 of one of Emu3's temporal resnet blocks: BatchNorm, swish, 3x3 conv (the 3-D kernel's last tap)."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm2 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.silu(self.norm2(self.conv1(F.silu(self.norm1(x))))))


class Emu3Front(nn.Module):
    """Frame 0 of Emu3's temporal front, applied to the post-quant latents and zq alike."""

    def __init__(self, config: MoVQConfig):
        super().__init__()
        self.res = nn.ModuleList(TemporalBlock(config.z_channels) for _ in range(config.temporal_blocks))
        self.up = nn.ModuleList(nn.Conv2d(config.z_channels, config.z_channels, 3, padding=1)
                                for _ in range(config.temporal_upsamples))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.res:
            x = block(x)
        for conv in self.up:
            x = F.silu(conv(x))
        return x


class MoVQDecoder(nn.Module):
    def __init__(self, config: MoVQConfig):
        super().__init__()
        zq, mult = config.embed_dim, config.ch_mult
        channels = config.ch * mult[-1]
        self.conv_in = nn.Conv2d(config.z_channels, channels, 3, padding=1)
        self.mid_block_1 = ResnetBlock(channels, channels, zq)
        self.mid_attn = AttnBlock(channels, zq)
        self.mid_block_2 = ResnetBlock(channels, channels, zq)
        levels = []  # built from the coarsest level down; up[level] then runs from the last index to 0
        for level in reversed(range(len(mult))):
            out = config.ch * mult[level]
            blocks = [ResnetBlock(channels if i == 0 else out, out, zq) for i in range(config.num_res_blocks + 1)]
            attn = [AttnBlock(out, zq) for _ in blocks] if level in config.attn_levels else []
            levels.append(UpLevel(blocks, attn, nn.Conv2d(out, out, 3, padding=1) if level else None))
            channels = out
        self.up = nn.ModuleList(reversed(levels))  # up[0]: full resolution
        self.norm_out = SpatialNorm(zq, channels)
        self.conv_out = nn.Conv2d(channels, 3, 3, padding=1)

    def forward(self, h: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(h)
        h = self.mid_block_2(self.mid_attn(self.mid_block_1(h, zq), zq), zq)
        for level in reversed(range(len(self.up))):
            h = self.up[level](h, zq)
        return self.conv_out(F.silu(self.norm_out(h, zq)))


class MoVQModel(nn.Module):
    """Codebook lookup, 1x1 post-quant conv, Emu3's front (when the config has one), MoVQ decoder."""

    def __init__(self, config: MoVQConfig):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.codebook_size, config.embed_dim)
        self.post_quant_conv = nn.Conv2d(config.embed_dim, config.z_channels, 1)
        self.front = Emu3Front(config) if config.temporal_blocks or config.temporal_upsamples else None
        self.decoder = MoVQDecoder(config)

    @property
    def downsample(self) -> int:
        return self.config.downsample

    def lookup(self, indices: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """indices (B, h*w) -> zq (B, embed_dim, h, w)."""
        h, w = grid
        return self.embedding(indices).view(indices.shape[0], h, w, -1).permute(0, 3, 1, 2)  # (B, E, h, w)

    def decode(self, indices: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """indices (B, h*w) -> images (B, 3, h*ds, w*ds) in about [-1, 1]; square grid by default."""
        zq = self.lookup(indices, grid or square_grid(indices.shape[1]))
        h = self.post_quant_conv(zq)
        if self.front is not None:
            both = self.front(torch.cat([h, zq.to(h.dtype)]))  # the front treats both alike
            h, zq = both.chunk(2)
        return self.decoder(h, zq)
