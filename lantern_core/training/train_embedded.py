"""Train the embedded default model on CPU: a tiny VQ-8-layout tokenizer, a tiny class-conditional
LlamaGen-architecture GPT, and a small classifier used to check that samples look like their class.

Data: real photographs shipped inside scikit-image's wheel (`skimage.data`), random crops with
flips; the class is the source photo. Deterministic: every random draw comes from explicit
generators seeded from `--seed`. Writes fp16 safetensors, a sample grid, a JSON log and the model
card into `--out`. Usage:

    python -m lantern_core.training.train_embedded --out lantern_core/assets/default          # full (~20 min)
    python -m lantern_core.training.train_embedded --out /tmp/x --scale 0.01                   # smoke run
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..loading.checkpoint_io import write_safetensors
from ..conditioning import Condition
from ..config import GPTConfig, SamplingConfig, VQConfig
from ..decoding.generate import generate
from ..models.gpt import LlamaGenGPT
from ..models.vq import VQModel
from ..decoding.sampling import make_generators

log = logging.getLogger("lantern_core.training.train_embedded")

# class index -> (name, skimage.data loader name)
PHOTOS: list[tuple[str, str]] = [
    ("astronaut", "astronaut"), ("coffee", "coffee"), ("cat", "chelsea"), ("rocket", "rocket"),
    ("galaxies", "hubble_deep_field"), ("tissue", "immunohistochemistry"), ("retina", "retina"),
    ("motorcycle", "stereo_motorcycle"),
]
IMAGE_SIZE = 128
RESIZED_SHORT_SIDE = 160

VQ_CONFIG = VQConfig(codebook_size=1024, codebook_embed_dim=8, ch=32, encoder_ch_mult=(1, 2, 2, 4),
                     decoder_ch_mult=(1, 2, 2, 4), z_channels=64, num_res_blocks=1)
GPT_CONFIG = GPTConfig(dim=256, n_layer=4, n_head=4, vocab_size=1024, model_type="c2i",
                       num_classes=len(PHOTOS), cls_token_num=1, grid_size=IMAGE_SIZE // 8)


@dataclass(frozen=True)
class Schedule:
    vq_steps: int = 400
    vq_batch: int = 8
    gpt_steps: int = 1000
    gpt_batch: int = 16
    gpt_crops_per_class: int = 256
    clf_steps: int = 300
    clf_batch: int = 32
    eval_per_class: int = 16

    def scaled(self, scale: float) -> "Schedule":
        f = lambda n: max(2, int(round(n * scale)))  # noqa: E731
        return Schedule(f(self.vq_steps), self.vq_batch, f(self.gpt_steps), self.gpt_batch,
                        f(self.gpt_crops_per_class), f(self.clf_steps), self.clf_batch, f(self.eval_per_class))


def load_photos() -> list[torch.Tensor]:
    """Each photo as float (3, H, W) in [-1, 1], resized so its short side is RESIZED_SHORT_SIDE."""
    import skimage.data

    out = []
    for _, loader in PHOTOS:
        img = getattr(skimage.data, loader)()
        if isinstance(img, tuple):  # stereo pair: take the left view
            img = img[0]
        x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float() / 127.5 - 1.0
        scale = RESIZED_SHORT_SIDE / min(x.shape[1:])
        size = (round(x.shape[1] * scale), round(x.shape[2] * scale))
        out.append(F.interpolate(x[None], size=size, mode="area")[0])
    return out


def random_crops(photos: list[torch.Tensor], labels: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
    """One random IMAGE_SIZE crop (random horizontal flip) of photos[label] per label -> (B, 3, S, S)."""
    crops = []
    for label in labels:
        photo = photos[int(label)]
        top = rng.integers(0, photo.shape[1] - IMAGE_SIZE + 1)
        left = rng.integers(0, photo.shape[2] - IMAGE_SIZE + 1)
        crop = photo[:, top:top + IMAGE_SIZE, left:left + IMAGE_SIZE]
        crops.append(crop.flip(-1) if rng.random() < 0.5 else crop)
    return torch.stack(crops)


def init_module(module: nn.Module, generator: torch.Generator) -> None:
    """Deterministic init from `generator`: uniform(+-1/sqrt(fan_in)) weights, zero biases."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                bound = 1.0 / math.sqrt(m.weight[0].numel())
                m.weight.uniform_(-bound, bound, generator=generator)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.Embedding):
                m.weight.uniform_(-1.0, 1.0, generator=generator)


def lr_at(step: int, total: int, peak: float, warmup: int = 30) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def vq_loss(vq: VQModel, images: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Reconstruction (L1 + MSE) + codebook + 0.25 commitment, straight-through, on normalised codes."""
    z = F.normalize(vq.encode_latents(images), dim=1)  # (B, C, h, w), unit vectors as upstream
    indices = vq.quantize.nearest(z)
    zq = vq.quantize.lookup(indices, z.shape[2:])
    codebook = F.mse_loss(zq, z.detach())
    commit = F.mse_loss(z, zq.detach())
    recon = vq.decode_latents(z + (zq - z).detach())
    rec = F.l1_loss(recon, images) + F.mse_loss(recon, images)
    loss = rec + codebook + 0.25 * commit
    return loss, {"rec": rec.item(), "codebook": codebook.item(), "indices": indices}


def restart_dead_codes(vq: VQModel, usage: torch.Tensor, latents: torch.Tensor, g: torch.Generator) -> int:
    """Re-seed never-used codes with random encoder outputs (keeps the 1024-entry codebook alive)."""
    dead = (usage == 0).nonzero().flatten()
    if dead.numel() == 0:
        return 0
    pick = torch.randint(0, latents.shape[0], (dead.numel(),), generator=g)
    with torch.no_grad():
        vq.quantize.embedding.weight[dead] = latents[pick]
    return dead.numel()


def train_vq(photos, schedule: Schedule, seed: int, record: dict) -> VQModel:
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    vq = VQModel(VQ_CONFIG)
    init_module(vq, g)
    opt = torch.optim.Adam(vq.parameters(), lr=1e-3, betas=(0.5, 0.9))
    usage = torch.zeros(VQ_CONFIG.codebook_size)
    losses = []
    for step in range(schedule.vq_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, schedule.vq_steps, 2e-3)
        images = random_crops(photos, rng.integers(0, len(photos), schedule.vq_batch), rng)
        loss, parts = vq_loss(vq, images)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        usage += torch.bincount(parts["indices"].flatten(), minlength=VQ_CONFIG.codebook_size)
        losses.append(parts["rec"])
        if (step + 1) % 25 == 0 and step < 0.8 * schedule.vq_steps:
            with torch.no_grad():
                latents = F.normalize(vq.encode_latents(images), dim=1).permute(0, 2, 3, 1).reshape(-1, 8)
            restarted = restart_dead_codes(vq, usage, latents, g)
            usage.zero_()
            log.info("vq step %d/%d rec %.4f restarted %d codes", step + 1, schedule.vq_steps,
                     float(np.mean(losses[-25:])), restarted)
    record["vq_rec_loss_first"] = float(np.mean(losses[:10]))
    record["vq_rec_loss_last"] = float(np.mean(losses[-25:]))
    return vq.eval()


def encode_dataset(vq: VQModel, photos, schedule: Schedule, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return encode_crops(vq, photos, schedule.gpt_crops_per_class, np.random.default_rng(seed + 1))


def encode_crops(vq: VQModel, photos, per_class: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`per_class` random crops of every photo, VQ-encoded -> (labels (S,), tokens (S, N))."""
    labels = np.repeat(np.arange(len(photos)), per_class)
    tokens = []
    with torch.no_grad():
        for chunk in np.array_split(labels, max(1, len(labels) // 64)):
            tokens.append(vq.encode(random_crops(photos, chunk, rng)))
    return torch.from_numpy(labels).long(), torch.cat(tokens)


def train_gpt(labels: torch.Tensor, tokens: torch.Tensor, schedule: Schedule, seed: int, record: dict) -> LlamaGenGPT:
    g = torch.Generator().manual_seed(seed + 2)
    model = LlamaGenGPT(GPT_CONFIG)
    model.init_weights(g)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95))
    losses = []
    for step in range(schedule.gpt_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, schedule.gpt_steps, 1e-3)
        idx = torch.randint(0, labels.shape[0], (schedule.gpt_batch,), generator=g)
        cond = labels[idx].clone()
        drop = torch.rand(schedule.gpt_batch, generator=g) < 0.1  # CFG dropout to the null class
        cond[drop] = GPT_CONFIG.num_classes
        logits = model.training_logits(cond, tokens[idx])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[idx].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % 50 == 0:
            log.info("gpt step %d/%d loss %.4f", step + 1, schedule.gpt_steps, float(np.mean(losses[-50:])))
    record["gpt_loss_first"] = float(np.mean(losses[:10]))
    record["gpt_loss_last"] = float(np.mean(losses[-50:]))
    return model.eval()


class PhotoClassifier(nn.Module):
    """A small CNN: 128 px crop -> source-photo class. Used only to score generated samples."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
        )
        self.head = nn.Linear(64, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).mean(dim=(2, 3)))


def train_classifier(photos, schedule: Schedule, seed: int, record: dict) -> PhotoClassifier:
    g = torch.Generator().manual_seed(seed + 3)
    rng = np.random.default_rng(seed + 3)
    clf = PhotoClassifier(len(photos))
    init_module(clf, g)
    opt = torch.optim.Adam(clf.parameters(), lr=2e-3)
    for step in range(schedule.clf_steps):
        labels = rng.integers(0, len(photos), schedule.clf_batch)
        loss = F.cross_entropy(clf(random_crops(photos, labels, rng)), torch.from_numpy(labels).long())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    clf.eval()
    held_rng = np.random.default_rng(seed + 100)
    held_labels = np.repeat(np.arange(len(photos)), 25)
    with torch.no_grad():
        pred = clf(random_crops(photos, held_labels, held_rng)).argmax(-1).numpy()
    record["classifier_real_crop_accuracy"] = float((pred == held_labels).mean())
    return clf


def half_roundtrip(module: nn.Module) -> dict[str, torch.Tensor]:
    """The fp16 tensors that get saved; the model is evaluated with exactly these values."""
    sd = {k: v.half() if v.is_floating_point() else v for k, v in module.state_dict().items()}
    module.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in sd.items()})
    return sd


def evaluate_samples(gpt, vq, clf, schedule: Schedule, seed: int, record: dict) -> torch.Tensor:
    n = len(PHOTOS)
    labels = torch.arange(n).repeat_interleave(schedule.eval_per_class)
    sampling = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=0, top_p=1.0)
    result = generate(gpt, Condition.classes(labels), sampling, make_generators(seed + 10, labels.numel()))
    with torch.no_grad():
        images = vq.decode(result.tokens).clamp(-1, 1)
        pred = clf(images).argmax(-1)
    record["sample_accuracy"] = float((pred == labels).float().mean())
    record["chance_accuracy"] = 1.0 / n
    record["eval_sampling"] = {"cfg_scale": 3.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                               "samples": int(labels.numel()), "seeds": f"{seed + 10}..{seed + 9 + labels.numel()}"}
    record["eval_generation"] = result.stats.to_dict()
    return images


def save_grid(images: torch.Tensor, per_row: int, path: Path) -> None:
    from PIL import Image

    imgs = ((images.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()  # (B, H, W, 3)
    rows = [np.concatenate(list(imgs[i:i + per_row]), axis=1) for i in range(0, len(imgs), per_row)]
    Image.fromarray(np.concatenate(rows, axis=0)).save(path)


def write_model_card(record: dict, out: Path) -> None:
    """MODEL_CARD.md from the training record, so the card always matches the shipped files."""
    t = record["times"]
    sizes = {p.name: p.stat().st_size / 2**20 for p in out.glob("*.safetensors")}
    classes = ", ".join(f"{i} {name} (`skimage.data.{loader}()`)" for i, (name, loader) in enumerate(PHOTOS))
    text = f"""# lantern-tiny-photos: the embedded default model

A tiny class-conditional model with LlamaGen's architecture, shipped inside the pack so everything
(CLI, nodes, example workflows, tests, benchmarks) runs on a fresh machine with no downloads. It is a
test and demo model: it draws {IMAGE_SIZE}x{IMAGE_SIZE} crops that resemble eight photographs, nothing more.

## Files (fp16 safetensors, {sum(sizes.values()):.1f} MiB in total)
| file | what | size |
|---|---|---|
| `gpt.safetensors` | LlamaGen-architecture c2i GPT: dim {GPT_CONFIG.dim}, {GPT_CONFIG.n_layer} layers, {GPT_CONFIG.n_head} heads, vocab {GPT_CONFIG.vocab_size}, {GPT_CONFIG.grid_size}x{GPT_CONFIG.grid_size} tokens, 2-D RoPE | {sizes.get("gpt.safetensors", 0):.1f} MiB |
| `vq.safetensors` | LlamaGen VQ-8 layout tokenizer: ch {VQ_CONFIG.ch}, ch_mult {VQ_CONFIG.encoder_ch_mult}, {VQ_CONFIG.num_res_blocks} res block(s), codebook {VQ_CONFIG.codebook_size}x{VQ_CONFIG.codebook_embed_dim} (L2-normalised), downsample 8 | {sizes.get("vq.safetensors", 0):.1f} MiB |
| `classifier.safetensors` | small CNN that tells the eight photos apart, trained on real crops only; used to score samples | {sizes.get("classifier.safetensors", 0):.2f} MiB |
| `samples.png` | rows = classes in order, 6 samples each (cfg 3.0, temperature 1.0, no top-k/top-p) | |
| `training_log.json` | everything below, machine-readable | |

Each safetensors file stores its config as JSON metadata (`lantern` entry), so loaders infer nothing.

## Data
Real photographs that ship inside scikit-image's wheel (`skimage.data`), one class per photo:
{classes}. Each photo is resized so its short side is {RESIZED_SHORT_SIDE} px; training samples are random
{IMAGE_SIZE}x{IMAGE_SIZE} crops with random horizontal flips.

## Command
`python -m lantern_core.training.train_embedded --out lantern_core/assets/default --seed {record["seed"]}`
(`make train-default`). Deterministic: every random draw comes from generators seeded from `--seed`.
Run on {record["threads"]} CPU threads with torch {record["torch"]}: VQ {t["vq_s"] / 60:.1f} min, GPT {t["gpt_s"] / 60:.1f} min,
classifier {t["classifier_s"] / 60:.1f} min, evaluation {t["eval_s"] / 60:.1f} min; total {t["total_s"] / 60:.1f} min.

## Training
- VQ: {record["schedule"]["vq_steps"]} Adam steps, batch {record["schedule"]["vq_batch"]}; L1 + MSE reconstruction, codebook and 0.25 x commitment losses
  on unit-normalised latents, dead codes re-seeded every 25 steps for the first 80%.
  Reconstruction loss (L1 + MSE) {record["vq_rec_loss_first"]:.3f} at the start -> {record["vq_rec_loss_last"]:.3f} at the end.
  The GPT's training crops use {record["codebook_entries_used_by_dataset"]} of the {VQ_CONFIG.codebook_size} codes.
- GPT: {record["schedule"]["gpt_steps"]} AdamW steps (lr 1e-3 cosine, betas 0.9/0.95, weight decay 0.05), batch
  {record["schedule"]["gpt_batch"]}, on {record["schedule"]["gpt_crops_per_class"]} pre-tokenised crops per class, 10% of labels
  dropped to the null class for CFG. Cross-entropy {record["gpt_loss_first"]:.3f} -> {record["gpt_loss_last"]:.3f}
  (ln {VQ_CONFIG.codebook_size} = {math.log(VQ_CONFIG.codebook_size):.3f}).
- Classifier: {record["schedule"]["clf_steps"]} Adam steps on real crops; accuracy on 200 held-out real crops
  {record["classifier_real_crop_accuracy"]:.3f}.

## Quality
{record["eval_sampling"]["samples"]} generated samples ({record["schedule"]["eval_per_class"]} per class, cfg 3.0, temperature 1.0,
seeds {record["eval_sampling"]["seeds"]}) decoded with the VQ and scored by the classifier:
**sample accuracy {record["sample_accuracy"]:.3f}** against chance {record["chance_accuracy"]:.3f}.
The evaluation uses exactly the fp16 weights that are shipped.

![samples](samples.png)

## Limits
Eight photographs are the whole world of this model: it memorises their textures and colours and
does not generalise. Use it to try the pack, for tests and for relative speed measurements; use a
real LlamaGen checkpoint for real images.
"""
    (out / "MODEL_CARD.md").write_text(text)


def main(argv: list[str] | None = None) -> dict:
    # Tiny gradients and Adam moments turn into denormal floats, which made CPU steps ~10x slower late
    # in training. Flushing them to zero is a process-wide switch: on for the run, off again after.
    torch.set_flush_denormal(True)
    try:
        return train(argv)
    finally:
        torch.set_flush_denormal(False)


def train(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every step count (smoke tests)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    schedule = Schedule().scaled(args.scale) if args.scale != 1.0 else Schedule()
    record: dict = {"seed": args.seed, "schedule": schedule.__dict__, "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "classes": [name for name, _ in PHOTOS]}
    times = {}
    t0 = time.perf_counter()
    photos = load_photos()
    vq = train_vq(photos, schedule, args.seed, record)
    vq_sd = half_roundtrip(vq)
    times["vq_s"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    labels, tokens = encode_dataset(vq, photos, schedule, args.seed)
    record["codebook_entries_used_by_dataset"] = int(tokens.unique().numel())
    gpt = train_gpt(labels, tokens, schedule, args.seed, record)
    gpt_sd = half_roundtrip(gpt)
    times["gpt_s"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    clf = train_classifier(photos, schedule, args.seed, record)
    clf_sd = half_roundtrip(clf)
    times["classifier_s"] = time.perf_counter() - t2

    t3 = time.perf_counter()
    images = evaluate_samples(gpt, vq, clf, schedule, args.seed, record)
    times["eval_s"] = time.perf_counter() - t3
    times["total_s"] = time.perf_counter() - t0
    record["times"] = times

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    names = [name for name, _ in PHOTOS]
    write_safetensors(out / "gpt.safetensors", gpt_sd,
                      {"kind": "gpt", "config": GPT_CONFIG.to_dict(), "class_names": names,
                       "image_size": IMAGE_SIZE, "vq": "vq.safetensors"})
    write_safetensors(out / "vq.safetensors", vq_sd, {"kind": "vq", "config": VQ_CONFIG.to_dict()})
    write_safetensors(out / "classifier.safetensors", clf_sd,
                      {"kind": "photo_classifier", "class_names": names, "image_size": IMAGE_SIZE})
    per = schedule.eval_per_class
    grid = torch.stack([images[c * per + j] for c in range(len(PHOTOS)) for j in range(min(per, 6))])
    save_grid(grid, min(per, 6), out / "samples.png")
    (out / "training_log.json").write_text(json.dumps(record, indent=2, sort_keys=True))
    write_model_card(record, out)
    log.info("done in %.0f s: sample accuracy %.3f (chance %.3f)", times["total_s"],
             record["sample_accuracy"], record["chance_accuracy"])
    return record


if __name__ == "__main__":
    main()
