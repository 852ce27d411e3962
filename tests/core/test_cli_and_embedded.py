"""The embedded default model and the command line, end to end on CPU."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lantern_core.loading.checkpoint_io import read_checkpoint
from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.loading.embedded import EMBEDDED_DIR, load_embedded
from lantern_core.errors import ConfigError
from lantern_core.decoding.generate import generate
from lantern_core.decoding.sampling import make_generators

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pipe():
    return load_embedded()


def test_embedded_files_are_small_safetensors_with_a_card():
    files = {p.name: p.stat().st_size for p in EMBEDDED_DIR.iterdir()}
    for name in ("gpt.safetensors", "vq.safetensors", "classifier.safetensors", "MODEL_CARD.md", "samples.png"):
        assert name in files, name
    weights = sum(size for name, size in files.items() if name.endswith(".safetensors"))
    assert weights <= 25 * 2**20
    card = (EMBEDDED_DIR / "MODEL_CARD.md").read_text()
    for fragment in ("skimage.data", "python -m lantern_core.training.train_embedded", "seed", "accuracy"):
        assert fragment in card


def test_embedded_model_shape(pipe):
    c = pipe.gpt.config
    assert c.model_type == "c2i" and c.num_classes == 8 and c.grid_size == 16
    assert pipe.gpt.class_names[2] == "cat"
    assert pipe.image_size == 128
    assert pipe.class_index("Cat") == 2 and pipe.class_index("3") == 3
    with pytest.raises(ConfigError, match="one of"):
        pipe.class_index("dog")


def test_embedded_samples_are_recognised_as_their_class(pipe):
    """Generated images must look like their source photo: the shipped classifier (trained on real
    crops only) recognises them far above chance (1/8)."""
    from lantern_core.loading.embedded import load_classifier

    clf = load_classifier()
    labels = torch.arange(8).repeat_interleave(3)
    result = generate(pipe.gpt.model, Condition.classes(labels), SamplingConfig(cfg_scale=3.0),
                      make_generators(1000, labels.numel()))
    with torch.no_grad():
        pred = clf(pipe.vq.model.decode(result.tokens).clamp(-1, 1)).argmax(-1)
    accuracy = (pred == labels).float().mean().item()
    assert accuracy >= 0.5, accuracy


def test_cli_generates_pngs_and_prints_stats(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "lantern_core", "generate", "--cls", "rocket", "--cls", "1",
                           "--seed", "3", "--out", str(out), "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["conditions"] == ["rocket", "coffee"]
    assert report["stats"]["forward_passes"] == 256 and report["stats"]["tokens_per_s"] > 0
    for path in report["images"]:
        img = np.asarray(Image.open(path))
        assert img.shape == (128, 128, 3) and img.std() > 5  # a real picture, not a flat fill
    again = subprocess.run([sys.executable, "-m", "lantern_core", "generate", "--cls", "rocket", "--cls", "1",
                            "--seed", "3", "--out", str(tmp_path / "again")], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0 and "tok/s" in again.stdout
    for name in ("lantern_00003.png", "lantern_00004.png"):  # same command, same bytes
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes()
    single = subprocess.run([sys.executable, "-m", "lantern_core", "generate", "--cls", "coffee", "--seed", "4",
                             "--out", str(tmp_path / "single")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert single.returncode == 0
    # sample i of a batch is the single run with seed + i: same tokens, and (decoded image by image) same pixels
    assert (tmp_path / "single" / "lantern_00004.png").read_bytes() == (out / "lantern_00004.png").read_bytes()


def test_decode_images_is_batch_invariant(pipe):
    """Each image of a batch decodes to exactly the floats it has decoded alone; `per_image` sees (1, 3, H, W)."""
    from lantern_core.models.vq import decode_images

    vq = pipe.vq.model
    codes = torch.randint(0, vq.config.codebook_size, (5, 256), generator=torch.Generator().manual_seed(0))
    seen = []
    images = decode_images(vq, codes, per_image=lambda image: seen.append(image.shape) or image * 2)
    assert images.shape == (5, 3, 128, 128) and seen == [(1, 3, 128, 128)] * 5
    for i in range(5):
        assert torch.equal(images[i:i + 1], decode_images(vq, codes[i:i + 1]) * 2), i
    assert torch.equal(decode_images(vq, codes[1:3]), images[1:3] / 2)
    with torch.no_grad():  # one image per call is exactly the plain decoder at batch 1
        assert torch.equal(decode_images(vq, codes[:1]), vq.decode(codes[:1]))


def test_cli_batch_image_equals_the_single_run_pixel_for_pixel(tmp_path):
    """Image 1 of a `--batch 2` run with seed 5 has the bytes of the single run with seed 6
    (a batched VQ decode rounded about 1% of its pixels one grey level differently)."""
    def cli(*extra, out):
        proc = subprocess.run([sys.executable, "-m", "lantern_core", "generate", "--cls", "cat", "--decoding",
                               "sjd_coupled", "--window", "8", "--out", str(tmp_path / out), *extra], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr

    cli("--seed", "5", "--batch", "2", out="batch")
    cli("--seed", "6", out="single")
    in_batch = tmp_path / "batch" / "lantern_00006.png"
    alone = tmp_path / "single" / "lantern_00006.png"
    assert np.array_equal(np.asarray(Image.open(in_batch)), np.asarray(Image.open(alone)))
    assert in_batch.read_bytes() == alone.read_bytes()


def test_cli_sjd_is_training_free_and_greedy_matches_ar(tmp_path):
    def cli(*extra, out):
        return subprocess.run([sys.executable, "-m", "lantern_core", "generate", "--cls", "cat", "--seed", "5",
                               "--temperature", "0", "--out", str(tmp_path / out), "--json", *extra], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)

    ar, sjd = cli(out="ar"), cli("--decoding", "sjd_coupled", "--window", "8", out="sjd")
    assert ar.returncode == 0 and sjd.returncode == 0, sjd.stderr
    stats = json.loads(sjd.stdout)["stats"]
    assert stats["forward_passes"] < 256 and "coupled jacobi w8" in json.loads(sjd.stdout)["summary"]
    assert (tmp_path / "sjd" / "lantern_00005.png").read_bytes() == (tmp_path / "ar" / "lantern_00005.png").read_bytes()
    bad = cli("--decoding", "sjd", "--window", "wide", out="bad")
    assert bad.returncode == 2 and "jacobi window" in bad.stderr and "Traceback" not in bad.stderr


def test_cli_reports_bad_input_without_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "lantern_core", "generate", "--gpt", str(tmp_path / "missing.pt"),
                           "--vq", str(tmp_path / "vq.pt")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "missing.pt" in proc.stderr and "Fix:" in proc.stderr and "Traceback" not in proc.stderr


def test_training_script_smoke_run_is_deterministic(tmp_path):
    """The script that made the embedded model runs end to end (at 1% of its steps) and is repeatable."""
    from lantern_core.training.train_embedded import main

    a = main(["--out", str(tmp_path / "a"), "--scale", "0.005", "--seed", "1"])
    b = main(["--out", str(tmp_path / "b"), "--scale", "0.005", "--seed", "1"])
    for key in ("vq_rec_loss_last", "gpt_loss_last", "sample_accuracy", "codebook_entries_used_by_dataset"):
        assert a[key] == b[key], key
    ta = read_checkpoint(tmp_path / "a" / "gpt.safetensors").tensors
    tb = read_checkpoint(tmp_path / "b" / "gpt.safetensors").tensors
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    assert (tmp_path / "a" / "samples.png").stat().st_size > 0
    assert json.loads((tmp_path / "a" / "training_log.json").read_text())["seed"] == 1
    tiny = torch.tensor([1e-40], dtype=torch.float32)  # the script's flush-to-zero must not leak out
    assert tiny.item() != 0.0
