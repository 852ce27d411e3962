"""Damaged and wrong weight files give the documented `CheckpointError` from every loader (GPT, VQ,
drafter, a Chameleon or Janus-Pro folder, Chameleon's VQGAN): truncated, zero-byte, wrong dtype,
NaN-filled and mismatched-shape files, and folders of another family. Each error names the file (or
folder), what was expected, what was found, and the fix. A damaged neighbour cache is rebuilt.
The untouched files load (checked first), so every failure below comes from the damage."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, safe_open, save_file

from lantern_core.decoding.acceptance import neighbors
from lantern_core.loading.checkpoints import load_gpt, load_vq
from lantern_core.loading.drafter_io import load_drafter
from lantern_core.errors import CheckpointError
from lantern_core.loading.families import load_chameleon_vqgan, load_prompted
from tests.loader_cases import LOADER_CASES, build_all
from tests.tiny_models import TINY_C2I, random_gpt


def read_any(path: Path) -> tuple[dict, Callable[[dict], None]]:
    """The tensors of a .safetensors or .pt/.ckpt file and a function writing changed tensors back in the
    same format (metadata / wrapper kept)."""
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata()
        return load_file(str(path)), lambda sd: save_file({k: v.contiguous() for k, v in sd.items()}, str(path), meta)
    obj = torch.load(path, weights_only=True)
    key = next((k for k in ("model", "state_dict") if k in obj), None)
    if key is None:  # a bare state dict
        return obj, lambda sd: torch.save(sd, path)
    return obj[key], lambda sd: torch.save({**obj, key: sd}, path)


def damage(path: Path, fault: str, shape_key: str) -> None:
    if fault == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) * 2 // 3])
        return
    if fault == "zero-byte":
        path.write_bytes(b"")
        return
    sd, write = read_any(path)
    assert shape_key in sd, sorted(sd)[:20]
    if fault == "wrong dtype":
        sd[shape_key] = (sd[shape_key] * 100).to(torch.int32)
    elif fault == "NaN-filled":
        sd[shape_key] = sd[shape_key].clone()
        sd[shape_key].view(-1)[::7] = float("nan")
    elif fault == "mismatched shape":
        sd[shape_key] = sd[shape_key][..., :-1]
    write(sd)


FAULTS = {  # fault -> fragments the error must contain
    "truncated": ["truncated or corrupt", "download it again"],
    "zero-byte": ["0-byte", "fetch the file again"],
    "wrong dtype": ["tensors of the wrong dtype", "expected floating point, found torch.int32"],
    "NaN-filled": ["NaN or Inf values in 1 tensors", "the file is corrupt"],
    "mismatched shape": ["wrong shapes", "expected"],
}


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """One valid file or folder per loader, built once and checked to load."""
    return build_all(tmp_path_factory.mktemp("valid"))


def assert_clear(err: Exception, names: tuple[str, ...], *fragments: str) -> None:
    text = str(err)
    assert isinstance(err, CheckpointError), (type(err), text)
    assert any(n in text for n in names) and "expected" in text and "found" in text and "Fix:" in text, text
    for fragment in fragments:
        assert fragment in text, (fragment, text)


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("loader", list(LOADER_CASES))
def test_damaged_files_give_the_documented_error(originals, tmp_path, loader, fault):
    case = LOADER_CASES[loader]
    original = originals[loader]
    copy = tmp_path / original.name
    (shutil.copytree if original.is_dir() else shutil.copy)(original, copy)
    weights = copy / case.weights if case.weights else copy
    damage(weights, fault, case.shape_key)
    with pytest.raises(CheckpointError) as err:
        case.load(copy)
    assert_clear(err.value, (copy.name, weights.name), *FAULTS[fault])


def test_the_checks_see_one_bad_value_in_a_large_tensor(tmp_path):
    """One Inf among a GPT's weights (in a tensor that is not the first one) is enough to refuse the file."""
    sd = random_gpt(TINY_C2I).state_dict()
    sd["layers.1.attention.wqkv.weight"][3, 5] = float("inf")
    path = tmp_path / "c2i_gpt.pt"
    torch.save({"model": sd}, path)
    with pytest.raises(CheckpointError, match=r"NaN or Inf values in 1 tensors \(e.g. \['layers.1.attention.wqkv"):
        load_gpt(path)


# ------------------------------------------------------------------------------- wrong family / kind

def _swap_config(folder: Path, other: Path) -> Path:
    shutil.copy(other / "config.json", folder / "config.json")
    return folder


WRONG = {
    # what is given, to which loader -> fragments of the error
    "janus weights under a chameleon config": (
        lambda o, t: load_prompted(_swap_config(shutil.copytree(o["janus folder"], t / "J"), o["anole folder"])),
        ("J",)),
    "anole weights under a janus config": (
        lambda o, t: load_prompted(_swap_config(shutil.copytree(o["anole folder"], t / "A"), o["janus folder"])),
        ("A",)),
    "a LlamaGen HF folder as a prompted family": (
        lambda o, t: load_prompted(_llama_folder(t)), ("config.json", "model_type one of")),
    "an anole folder as a LlamaGen GPT": (
        lambda o, t: load_gpt(o["anole folder"]), ("Anole-tiny", "a LlamaGen GPT")),
    "a VQ as a drafter": (lambda o, t: load_drafter(o["vq .pt"]), ("vq.pt", "drafter")),
    "a drafter as a VQ": (lambda o, t: load_vq(o["drafter folder"] / "model.safetensors"),
                          ("model.safetensors", "a speculative-decoding drafter")),
    "a GPT as a Chameleon VQGAN": (lambda o, t: load_chameleon_vqgan(o["gpt .pt"]), ("c2i_gpt.pt", "VQ-GAN")),
}


def _llama_folder(root: Path) -> Path:
    folder = root / "LlamaGen-T2I"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    return folder


@pytest.mark.parametrize("case", list(WRONG))
def test_wrong_family_or_kind_is_refused_by_name(originals, tmp_path, case):
    call, fragments = WRONG[case]
    with pytest.raises(CheckpointError) as err:
        call(originals, tmp_path)
    text = str(err.value)
    assert "expected" in text and "found" in text and "Fix:" in text, text
    for fragment in fragments:
        assert fragment in text, (fragment, text)


# --------------------------------------------------------------------------------- neighbour cache

@pytest.mark.parametrize("damage_kind", ["flipped byte", "truncated", "zero-byte", "other codebook's table"])
def test_a_damaged_neighbour_cache_is_detected_and_rebuilt(tmp_path, caplog, damage_kind):
    book = torch.randn(40, 4, generator=torch.Generator().manual_seed(3))
    table = neighbors.load_or_build_neighbors(book, 5, tmp_path)
    (path,) = tmp_path.glob("neighbors_*.safetensors")
    data = path.read_bytes()
    if damage_kind == "flipped byte":
        path.write_bytes(data[:-3] + bytes([data[-3] ^ 0x01]) + data[-2:])
    elif damage_kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage_kind == "zero-byte":
        path.write_bytes(b"")
    else:  # a valid table file of another codebook under this codebook's name
        other = tmp_path / "other"
        neighbors.load_or_build_neighbors(book + 1e-3 * torch.randn(40, 4), 5, other)
        shutil.copy(next(other.glob("neighbors_*.safetensors")), path)
    with caplog.at_level(logging.WARNING, logger="lantern_core.decoding.acceptance.neighbors"):
        again = neighbors.load_or_build_neighbors(book, 5, tmp_path)
    assert torch.equal(again, table)
    assert "rebuilding it" in caplog.text, caplog.text
    assert neighbors._read_valid(path, neighbors.codebook_hash(book)) is not None  # the rebuilt file is valid
