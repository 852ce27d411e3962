"""A pickle that would run code when unpickled is refused by every loader that reads `.pt` / `.bin` /
`.ckpt` files (GPT, VQ, drafter folder, a prompted family's sharded `.bin` folder, Chameleon's
`vqgan.ckpt`), with an error that names the file; the payload (touching a marker file) never runs.
The last check unpickles the same payload without restrictions and sees the marker appear, so the test
could fail."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from lantern_core.loading.checkpoints import load_gpt, load_vq
from lantern_core.loading.drafter_io import load_drafter
from lantern_core.errors import CheckpointError
from lantern_core.loading.families import load_chameleon_vqgan, load_prompted


class Payload:
    target = ""

    def __reduce__(self):
        return (Path.touch, (Path(Payload.target),))


def evil(path: Path, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**(tensors or {"weight": torch.zeros(2, 2)}), "extra": Payload()}, path)
    return path


def janus_folder(root: Path) -> Path:
    """A DeepSeek-layout Janus-Pro folder whose only weights file is a hostile pytorch_model.bin."""
    folder = root / "Janus-Pro-evil"
    evil(folder / "pytorch_model.bin", {"language_model.model.embed_tokens.weight": torch.zeros(4, 8)})
    (folder / "config.json").write_text(json.dumps({
        "model_type": "multi_modality",
        "language_config": {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                            "intermediate_size": 16, "vocab_size": 4},
        "gen_aligner_config": {"params": {"depth": 2, "input_dim": 8}},
        "gen_head_config": {"params": {"image_token_size": 16}}}))
    from tests.tiny_families import janus_vocab, write_tokenizer

    write_tokenizer(folder / "tokenizer.json", janus_vocab(), [n for n in janus_vocab() if n.startswith("<")])
    return folder


LOADERS = {
    "gpt .pt": lambda root: (lambda: load_gpt(evil(root / "gpt.pt")), root / "gpt.pt"),
    "gpt .bin": lambda root: (lambda: load_gpt(evil(root / "gpt.bin")), root / "gpt.bin"),
    "vq .ckpt": lambda root: (lambda: load_vq(evil(root / "vq.ckpt")), root / "vq.ckpt"),
    "drafter folder": lambda root: (lambda: load_drafter(evil(root / "d" / "pytorch_model.bin").parent),
                                    root / "d" / "pytorch_model.bin"),
    "chameleon vqgan.ckpt": lambda root: (lambda: load_chameleon_vqgan(evil(root / "vqgan.ckpt")), root / "vqgan.ckpt"),
    "janus .bin folder": lambda root: (lambda: load_prompted(janus_folder(root)),
                                       root / "Janus-Pro-evil" / "pytorch_model.bin"),
}


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_every_loader_refuses_code_in_pickles_and_runs_none(tmp_path, name):
    marker = tmp_path / "pwned"
    Payload.target = str(marker)
    if name == "drafter folder":
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "config.json").write_text("{}")
    load, path = LOADERS[name](tmp_path)
    with pytest.raises(CheckpointError) as err:
        load()
    message = str(err.value)
    assert str(path) in message and "never executes pickled code" in message, message
    assert not marker.exists()
    pickle.loads(pickle.dumps(Payload()))  # an unrestricted unpickle would run it: the test can fail
    assert marker.exists()
