"""A small valid file or folder for every weights loader (GPT .pt / .safetensors, VQ, drafter folder,
Anole and Janus-Pro folders, Chameleon's vqgan.ckpt), shared by the damaged-file and fuzz tests."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from lantern_core.loading.checkpoints import load_gpt, load_vq
from lantern_core.loading.drafter_io import load_drafter, save_drafter
from lantern_core.loading.families import load_chameleon_vqgan, load_prompted
from tests.tiny_families import save_chameleon_folder, save_chameleon_vqgan, save_janus_folder
from tests.tiny_models import TINY_C2I, random_drafter, random_gpt, random_vq


@dataclass
class Case:
    """A valid file (or folder) for one loader; `weights` is the file inside that the faults damage."""

    load: Callable[[Path], object]
    make: Callable[[Path], Path]  # root -> what `load` takes
    weights: str  # relative to what `make` returns ("" = the file itself)
    shape_key: str  # a tensor the config is not inferred from: a wrong shape there must be refused


def _gpt_pt(root: Path) -> Path:
    torch.save({"model": random_gpt(TINY_C2I).state_dict(), "args": {"image_size": 64}}, root / "c2i_gpt.pt")
    return root / "c2i_gpt.pt"


def _gpt_safetensors(root: Path) -> Path:
    save_file({k: v.contiguous() for k, v in random_gpt(TINY_C2I).state_dict().items()}, str(root / "gpt_64.safetensors"))
    return root / "gpt_64.safetensors"


def _vq_pt(root: Path) -> Path:
    torch.save({"model": random_vq().state_dict()}, root / "vq.pt")
    return root / "vq.pt"


def _drafter(root: Path) -> Path:
    return save_drafter(random_drafter(random_gpt(TINY_C2I)), root / "drafter")


def _released_drafter(root: Path) -> Path:
    """LANTERN's released LlamaGen drafter layout (HF config.json + pytorch_model.bin, no metadata of ours)."""
    import json

    from lantern_core.loading.drafter_io import internal_to_released

    drafter = random_drafter(random_gpt(TINY_C2I))
    c = drafter.config
    folder = root / "llamagen_drafter"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": c.dim, "intermediate_size": c.ffn_dim,
        "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_head, "num_hidden_layers": 1,
        "vocab_size": c.vocab_size, "rms_norm_eps": c.norm_eps, "hidden_act": "silu", "input_type": "c2i"}))
    torch.save({k: v.half() for k, v in internal_to_released(drafter.state_dict(), c).items()},
               folder / "pytorch_model.bin")
    return folder


def _anole(root: Path) -> Path:
    save_chameleon_folder(root / "Anole-tiny")
    return root / "Anole-tiny"


def _janus(root: Path) -> Path:
    save_janus_folder(root / "Janus-Pro-tiny")
    return root / "Janus-Pro-tiny"


def _vqgan(root: Path) -> Path:
    save_chameleon_vqgan(root / "vqgan.ckpt")
    return root / "vqgan.ckpt"


LOADER_CASES = {
    "gpt .pt": Case(load_gpt, _gpt_pt, "", "layers.1.feed_forward.w2.weight"),
    "gpt .safetensors": Case(load_gpt, _gpt_safetensors, "", "layers.0.attention.wo.weight"),
    "vq .pt": Case(load_vq, _vq_pt, "", "decoder.conv_out.weight"),
    "drafter folder": Case(lambda p: load_drafter(p, target=TINY_C2I), _drafter, "model.safetensors",
                           "layers.0.mlp.down_proj.weight"),
    "released drafter folder": Case(lambda p: load_drafter(p, target=TINY_C2I), _released_drafter,
                                    "pytorch_model.bin", "layers.0.mlp.down_proj.weight"),
    "anole folder": Case(load_prompted, _anole, "model.safetensors", "model.layers.1.mlp.down_proj.weight"),
    "janus folder": Case(load_prompted, _janus, "model.safetensors",
                         "model.language_model.layers.0.mlp.down_proj.weight"),
    "chameleon vqgan.ckpt": Case(load_chameleon_vqgan, _vqgan, "", "decoder.conv_out.weight"),
}


def build_all(root: Path) -> dict[str, Path]:
    """Every case's valid file or folder under `root`, each checked to load."""
    made = {}
    for name, case in LOADER_CASES.items():
        (root / name).mkdir()
        made[name] = case.make(root / name)
        case.load(made[name])
    return made
