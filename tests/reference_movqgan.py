"""MoVQGAN's decoder as its own code builds it (`ai-forever/MoVQGAN`, movqgan/modules/vqvae/movq_modules.py,
read and re-written here, not copied), for float64 references: taming-style modules and names (`decoder.mid.*`,
`decoder.up[level].block / attn / upsample.conv`, `quantize.embedding`, `post_quant_conv`), attention as
`softmax(bmm(q, k) * C^-0.5, dim=2)` then `bmm(v, w)`, spatial norms `GroupNorm(32, 1e-6)(f) * conv_y(zq) +
conv_b(zq)` with zq resized by nearest, levels attending where the running resolution is in
`attn_resolutions` (starting at resolution / 2^(levels - 1)), decode = decoder(post_quant_conv(zq), zq)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class SpatialNorm(nn.Module):
    def __init__(self, channels, zq_ch):
        super().__init__()
        self.norm_layer = nn.GroupNorm(num_channels=channels, num_groups=32, eps=1e-6, affine=True)
        self.conv_y = nn.Conv2d(zq_ch, channels, 1)
        self.conv_b = nn.Conv2d(zq_ch, channels, 1)

    def forward(self, f, zq):
        zq = F.interpolate(zq, size=f.shape[-2:], mode="nearest")
        return self.norm_layer(f) * self.conv_y(zq) + self.conv_b(zq)


class Resnet(nn.Module):
    def __init__(self, cin, cout, zq_ch):
        super().__init__()
        self.norm1, self.conv1 = SpatialNorm(cin, zq_ch), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = SpatialNorm(cout, zq_ch), nn.Conv2d(cout, cout, 3, padding=1)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x, zq):
        h = self.conv1(F.silu(self.norm1(x, zq)))
        h = self.conv2(F.silu(self.norm2(h, zq)))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class Attn(nn.Module):
    def __init__(self, c, zq_ch):
        super().__init__()
        self.norm = SpatialNorm(c, zq_ch)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x, zq):
        h = self.norm(x, zq)
        b, c, hh, ww = h.shape
        q = self.q(h).reshape(b, c, hh * ww).permute(0, 2, 1)  # b, hw, c
        k = self.k(h).reshape(b, c, hh * ww)  # b, c, hw
        w = torch.softmax(torch.bmm(q, k) * c ** -0.5, dim=2)
        out = torch.bmm(self.v(h).reshape(b, c, hh * ww), w.permute(0, 2, 1)).reshape(b, c, hh, ww)
        return x + self.proj_out(out)


class Decoder(nn.Module):
    def __init__(self, ch, ch_mult, num_res_blocks, attn_resolutions, resolution, z_channels, zq_ch):
        super().__init__()
        block_in = ch * ch_mult[-1]
        curr_res = resolution // 2 ** (len(ch_mult) - 1)
        self.conv_in = nn.Conv2d(z_channels, block_in, 3, padding=1)
        self.mid = nn.Module()
        self.mid.block_1, self.mid.attn_1 = Resnet(block_in, block_in, zq_ch), Attn(block_in, zq_ch)
        self.mid.block_2 = Resnet(block_in, block_in, zq_ch)
        self.up = nn.ModuleList()
        for level in reversed(range(len(ch_mult))):
            up = nn.Module()
            up.block, up.attn = nn.ModuleList(), nn.ModuleList()
            block_out = ch * ch_mult[level]
            for _ in range(num_res_blocks + 1):
                up.block.append(Resnet(block_in, block_out, zq_ch))
                block_in = block_out
                if curr_res in attn_resolutions:
                    up.attn.append(Attn(block_in, zq_ch))
            if level != 0:
                up.upsample = nn.Module()
                up.upsample.conv = nn.Conv2d(block_in, block_in, 3, padding=1)
                curr_res *= 2
            self.up.insert(0, up)
        self.norm_out = SpatialNorm(block_in, zq_ch)
        self.conv_out = nn.Conv2d(block_in, 3, 3, padding=1)

    def forward(self, z, zq):
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h, zq), zq), zq)
        for level in reversed(range(len(self.up))):
            for i, block in enumerate(self.up[level].block):
                h = block(h, zq)
                if len(self.up[level].attn) > 0:
                    h = self.up[level].attn[i](h, zq)
            if level != 0:
                h = self.up[level].upsample.conv(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.conv_out(F.silu(self.norm_out(h, zq)))


class MoVQGAN(nn.Module):
    """The decoding half of MoVQGAN's `MOVQ` (its encoder and quant_conv are stand-ins of the right names)."""

    def __init__(self, n_embed, embed_dim, ddconfig):
        super().__init__()
        self.decoder = Decoder(ddconfig["ch"], ddconfig["ch_mult"], ddconfig["num_res_blocks"],
                               ddconfig["attn_resolutions"], ddconfig["resolution"], ddconfig["z_channels"], embed_dim)
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(n_embed, embed_dim)
        self.post_quant_conv = nn.Conv2d(embed_dim, ddconfig["z_channels"], 1)
        self.encoder = nn.Module()
        self.encoder.conv_in = nn.Conv2d(3, ddconfig["ch"], 3, padding=1)
        self.quant_conv = nn.Conv2d(ddconfig["z_channels"], embed_dim, 1)

    def decode_code(self, codes, grid):
        zq = self.quantize.embedding(codes).view(codes.shape[0], *grid, -1).permute(0, 3, 1, 2)
        return self.decoder(self.post_quant_conv(zq), zq)
