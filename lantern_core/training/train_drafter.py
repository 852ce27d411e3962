"""Train an EAGLE / LANTERN feature drafter for a LlamaGen-architecture target (EAGLE's recipe, as LANTERN
used it): teacher forcing through the frozen target, SmoothL1 on the next feature + 0.1 x soft
cross-entropy against the target's own next-token distribution (through the target's frozen head),
uniform noise on the input features, AdamW 1e-4 (0.9, 0.95), gradient clipping by value 0.5, linear
warm-up (3% of an epoch) then linear decay, 10% unconditional samples (null class / saved
`uncond_embedding`) so the drafter serves both CFG rows.

Prompted families (Anole / Chameleon, Janus-Pro: `--target` is the model folder) train the same way on
prompt + image-token sequences, with the family's unconditional prompt row as the 10% unconditional
samples and, over the prompt, the target's embeddings of the next prompt tokens as the drafter's token
inputs (as LANTERN's Anole drafter sees them); their data is self-distilled (`--prompts` + `--self-distill`).

Data (token sequences + conditions), from any mix of:
  * `--images DIR`: real images, VQ-encoded (c2i: one sub-folder per class, named by index or class
    name; t2i: `name.png|jpg` + `name.txt` caption, needs `--t5`), centre-cropped to the model's size;
  * `--self-distill N`: N samples per class (c2i) or per line of `--prompts FILE` (t2i) drawn from the
    target itself (LANTERN's Lumina "self-distilled" data), with `--cfg/--temperature/--top-k`;
  * `--target embedded` with no other data: random crops of the embedded model's photos.
Resumable (`--resume` continues from `OUT/train_state.pt` exactly as if never stopped), logs progress,
writes the released drafter layout (config.json + model.safetensors) and `training_log.json` to `--out`.

    python -m lantern_core.training.train_drafter --target embedded --out lantern_core/assets/default/drafter
    python -m lantern_core.training.train_drafter --target c2i_L_256.pt --vq vq_ds16_c2i.pt --images imagenet_subset/ --out d
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..conditioning import Condition, Prefix, build_prefix, left_pad
from ..config import PREFIX_STATES, DrafterConfig, SamplingConfig
from ..decoding.generate import generate
from ..decoding.sampling import make_generators
from ..decoding.trees.prefix_states import drafter_features, drafter_key_valid
from ..errors import ConfigError, LanternError
from ..loading.drafter_io import save_drafter
from ..models.drafter import EagleDrafter
from ..models.gpt import ForwardStep, ImageTransformer, LlamaGenGPT
from ..models.kv_cache import attention_mask

log = logging.getLogger("lantern_core.training.train_drafter")
STATE_FILE = "train_state.pt"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


@dataclass(frozen=True)
class Recipe:
    epochs: int = 20
    batch: int = 4
    lr: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    clip_value: float = 0.5
    warmup_ratio: float = 0.03
    p_weight: float = 0.1  # weight of the soft cross-entropy term
    noise_std: float = 0.2  # uniform feature noise: (U - 0.5) * std * 512 / L
    uncond_prob: float = 0.1
    seed: int = 0
    checkpoint_every: int = 200  # steps between resumable snapshots

    def __post_init__(self) -> None:
        for name in ("epochs", "batch", "checkpoint_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(name, "an integer >= 1", getattr(self, name))
        if not self.lr > 0:
            raise ConfigError("lr", "a learning rate > 0", self.lr)
        if not 0 <= self.uncond_prob <= 1:
            raise ConfigError("uncond_prob", "a probability in [0, 1]", self.uncond_prob)


@dataclass
class DrafterData:
    """Training sequences: image tokens (S, N) with class labels (S,), caption features (S, T, C) + mask,
    or (prompted families) a `prompts` Condition holding S left-padded prompt rows and their
    unconditional rows."""

    tokens: torch.Tensor
    labels: torch.Tensor | None = None
    caption: torch.Tensor | None = None
    caption_mask: torch.Tensor | None = None
    sources: tuple[str, ...] = ()
    prompts: Condition | None = None

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def batch(self, idx: torch.Tensor, target: ImageTransformer, uncond: torch.Tensor) -> Condition:
        """The conditions of rows idx, with rows where `uncond` is True made unconditional."""
        if self.labels is not None:
            labels = self.labels[idx].clone()
            labels[uncond] = target.config.num_classes
            return Condition(labels=labels)
        if self.prompts is not None:
            p = self.prompts
            T = max(p.prompt_ids.shape[1], p.uncond_ids.shape[1])
            ids, mask = left_pad(p.prompt_ids[idx], p.prompt_mask[idx], T)
            u_ids, u_mask = left_pad(p.uncond_ids[idx], p.uncond_mask[idx], T)
            ids, mask = torch.where(uncond[:, None], u_ids, ids), torch.where(uncond[:, None], u_mask, mask)
            return Condition(prompt_ids=ids, prompt_mask=mask, uncond_ids=u_ids, uncond_mask=u_mask)
        caption = self.caption[idx].float().clone()
        mask = self.caption_mask[idx].clone()
        caption[uncond] = target.cls_embedding.uncond_embedding.float().cpu()
        mask[uncond] = True
        return Condition(caption=caption, caption_mask=mask)

    @staticmethod
    def concat(parts: list["DrafterData"]) -> "DrafterData":
        cat = lambda xs: None if xs[0] is None else torch.cat(xs)  # noqa: E731
        prompts = None
        if parts[0].prompts is not None:
            fields = ("prompt_ids", "prompt_mask", "uncond_ids", "uncond_mask")
            prompts = Condition(**{f: _cat_left_padded([getattr(p.prompts, f) for p in parts]) for f in fields})
        return DrafterData(torch.cat([p.tokens for p in parts]), cat([p.labels for p in parts]),
                           cat([p.caption for p in parts]), cat([p.caption_mask for p in parts]),
                           tuple(s for p in parts for s in p.sources), prompts)


def _cat_left_padded(rows: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate (S_i, T_i) id or mask tensors, left-padding each with zeros / False to the longest T."""
    T = max(r.shape[1] for r in rows)
    return torch.cat([torch.cat([r.new_zeros(r.shape[0], T - r.shape[1]), r], 1) for r in rows])


# ------------------------------------------------------------------------------------------ data

def embedded_photo_data(vq, crops_per_class: int, seed: int) -> DrafterData:
    """Random crops of the embedded model's training photos, VQ-encoded."""
    import numpy as np

    from .train_embedded import encode_crops, load_photos

    labels, tokens = encode_crops(vq, load_photos(), crops_per_class, np.random.default_rng(seed + 7))
    return DrafterData(tokens.cpu(), labels, sources=(f"{crops_per_class} real crops per class of the embedded photos",))


def _load_image(path: Path, size: int) -> torch.Tensor:
    """ADM-style centre crop to size x size, as (3, size, size) in [-1, 1]."""
    from PIL import Image

    try:
        img = Image.open(path).convert("RGB")
    except OSError as exc:
        raise LanternError(f"Cannot read image '{path}': expected a PNG/JPEG/WebP/BMP file, found {exc}. "
                           "Fix: remove or re-save that file.") from exc
    while min(img.size) >= 2 * size:
        img = img.resize(tuple(x // 2 for x in img.size), Image.BOX)
    scale = size / min(img.size)
    img = img.resize(tuple(round(x * scale) for x in img.size), Image.BICUBIC)
    left, top = (img.size[0] - size) // 2, (img.size[1] - size) // 2
    img = img.crop((left, top, left + size, top + size))
    x = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(size, size, 3)
    return x.permute(2, 0, 1).float() / 127.5 - 1.0


def image_folder_data(folder: Path, target: LlamaGenGPT, vq, class_names: list[str] | None,
                      encoder=None) -> DrafterData:
    """c2i: folder/<class index or name>/*.png; t2i: folder/*.png with a same-named .txt caption."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError("--images", "a folder of training images", str(folder))
    size = target.config.grid_size * vq.config.downsample
    device = vq.quantize.embedding.weight.device
    if target.config.model_type == "c2i":
        names = [n.lower() for n in (class_names or [])]
        pairs = []
        for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
            key = sub.name.lower()
            label = int(key) if key.isdigit() else (names.index(key) if key in names else None)
            if label is None or not 0 <= label < target.config.num_classes:
                raise ConfigError(f"class folder '{sub}'", f"a class index 0..{target.config.num_classes - 1}"
                                  + (f" or one of {class_names}" if class_names else ""), sub.name)
            pairs += [(p, label) for p in sorted(sub.iterdir()) if p.suffix.lower() in IMAGE_SUFFIXES]
        if not pairs:
            raise ConfigError("--images", "one sub-folder per class holding images (c2i target)", str(folder))
        tokens = [vq.encode(_load_image(p, size)[None].to(device)) for p, _ in pairs]
        return DrafterData(torch.cat(tokens).cpu(), torch.tensor([lab for _, lab in pairs]),
                           sources=(f"{len(pairs)} images from {folder}",))
    if encoder is None:
        raise ConfigError("--t5", "a Flan-T5 folder to encode the captions of a t2i target", None)
    images = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    missing = [p.name for p in images if not p.with_suffix(".txt").is_file()]
    if not images or missing:
        raise ConfigError("--images", "images with same-named .txt captions (t2i target)",
                          f"missing captions for {missing[:3]}" if missing else "no images")
    tokens = torch.cat([vq.encode(_load_image(p, size)[None].to(device)) for p in images]).cpu()
    cond = encoder.encode([p.with_suffix(".txt").read_text().strip() for p in images])
    return DrafterData(tokens, caption=cond.caption.half().cpu(), caption_mask=cond.caption_mask.cpu(),
                       sources=(f"{len(images)} captioned images from {folder}",))


def self_distilled_data(target: ImageTransformer, condition: Condition, sampling: SamplingConfig, seed: int,
                        chunk: int = 32) -> DrafterData:
    """Token sequences sampled from the target itself, one per condition row (seeds seed, seed+1, ...)."""
    tokens = []
    for start in range(0, condition.batch, chunk):
        c = _rows(condition, slice(start, start + chunk))
        result = generate(target, c, sampling, make_generators(seed + start, c.batch, model_device(target)))
        tokens.append(result.tokens.cpu())
        log.info("self-distillation: %d/%d sequences", min(start + chunk, condition.batch), condition.batch)
    source = (f"{condition.batch} self-distilled samples ({sampling})",)
    if condition.labels is not None:
        return DrafterData(torch.cat(tokens), condition.labels.cpu(), sources=source)
    if condition.prompt_ids is not None:
        return DrafterData(torch.cat(tokens), sources=source, prompts=condition.to("cpu"))
    return DrafterData(torch.cat(tokens), caption=condition.caption.half().cpu(),
                       caption_mask=condition.caption_mask.cpu(), sources=source)


def _rows(condition: Condition, part: slice) -> Condition:
    return Condition(**{f: None if getattr(condition, f) is None else getattr(condition, f)[part]
                        for f in condition.__dataclass_fields__})


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


# -------------------------------------------------------------------------------------- training

@dataclass
class TeacherPass:
    """The frozen target over [prefix; tokens[:, :-1]]."""

    features: torch.Tensor  # (B, T + N - 1, dim) last hidden states f_s
    key_valid: torch.Tensor  # (B, T + N - 1) bool, False on padded prefix slots
    prefix_len: int  # T
    prefix_ids: torch.Tensor | None  # (B, T) prompt token ids of prompted families, else None


def teacher_features(target: ImageTransformer, condition: Condition, tokens: torch.Tensor,
                     prefix_states: str = "native") -> TeacherPass:
    """Target hidden states over [prefix; tokens[:, :-1]] (teacher forcing), the padded prefix rows in the
    drafter's convention `prefix_states` (as decoding hands them over: `prefix_states.drafter_features`)."""
    if condition.labels is not None:  # labels may include the null class (unconditional rows)
        embeddings = target.embed_condition(condition.labels.to(tokens.device))
        valid = torch.ones(embeddings.shape[:2], dtype=torch.bool, device=tokens.device)
        prefix = Prefix(embeddings, valid, padded=False)
    else:
        prefix = build_prefix(target, condition, guided=False)
    embeddings, prefix_valid, prefix_ids = prefix.embeddings, prefix.key_valid, prefix.token_ids
    h = torch.cat([embeddings, target.embed_tokens(tokens[:, :-1])], dim=1)  # (B, T + N - 1, dim)
    L, T = h.shape[1], embeddings.shape[1]
    key_valid = torch.ones(h.shape[0], L, dtype=torch.bool, device=h.device)
    key_valid[:, :T] = prefix_valid
    positions = torch.arange(L, device=h.device)
    features = target(h, ForwardStep(positions, mask=attention_mask(key_valid, positions, L)))
    prefix_features = drafter_features(target, prefix, features[:, :T], prefix_states)
    features = torch.cat([prefix_features, features[:, T:]], dim=1)
    return TeacherPass(features, key_valid, T, prefix_ids)


def drafter_loss(drafter: EagleDrafter, target: ImageTransformer, condition: Condition, tokens: torch.Tensor,
                 recipe: Recipe, generator: torch.Generator) -> tuple[torch.Tensor, dict]:
    """EAGLE loss on one batch: drafter position s sees (f_s, x_{s+1}) and predicts f_{s+1}."""
    convention = drafter.config.prefix_states
    with torch.no_grad():
        teacher = teacher_features(target, condition, tokens, convention)
    features, T = teacher.features, teacher.prefix_len
    key_valid = drafter_key_valid(convention, teacher.key_valid)  # the drafter's own keys
    B, L, _ = features.shape
    fed = torch.zeros(B, L, dtype=torch.long, device=tokens.device)
    fed[:, T - 1:] = tokens  # x_{s+1}: zeros over the prefix, then the image tokens
    embeddings = None
    if teacher.prefix_ids is not None:  # prompted: the next prompt token's embedding over the prompt
        with torch.no_grad():
            prompt = target.embed_prompt(teacher.prefix_ids[:, 1:])  # (B, T - 1, dim)
        embeddings = torch.cat([prompt, drafter.embed_tokens(tokens).to(prompt.dtype)], dim=1)  # (B, L, dim)
    noise = (torch.rand(features.shape, generator=generator, device=features.device) - 0.5)
    noisy = features + noise * recipe.noise_std * 512 / L
    positions = torch.arange(L, device=features.device)
    pred = drafter(noisy, fed, ForwardStep(positions, mask=attention_mask(key_valid, positions, L)), embeddings)
    pred, goal = pred[:, T - 1:L - 1], features[:, T:]  # predictions of f_T .. f_{T+N-2} (real image tokens)
    value = F.smooth_l1_loss(pred.float(), goal.float())
    with torch.no_grad():
        goal_logits = target.logits(goal)
        goal_p = goal_logits.softmax(-1)
    pred_logits = target.logits(pred)
    prob = -(goal_p * pred_logits.log_softmax(-1)).sum(-1).mean()
    top1 = (pred_logits.argmax(-1) == goal_logits.argmax(-1)).float().mean()
    loss = value + recipe.p_weight * prob
    return loss, {"loss": loss.item(), "value": value.item(), "prob": prob.item(), "top1": top1.item()}


def lr_factor(step: int, steps_per_epoch: int, total: int, recipe: Recipe) -> float:
    warmup = max(1, int(recipe.warmup_ratio * steps_per_epoch))
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def _batch_order(n: int, batch: int, epoch: int, seed: int) -> list[torch.Tensor]:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return [perm[i:i + batch] for i in range(0, n - batch + 1, batch)] or [perm]


def train_drafter(target: ImageTransformer, data: DrafterData, recipe: Recipe, out: Path, resume: bool = False,
                  drafter: EagleDrafter | None = None, max_steps: int | None = None,
                  prefix_states: str = "native") -> tuple[EagleDrafter, dict]:
    """Train (or resume) a drafter for `target` on `data`; returns the drafter and the training record.
    `max_steps` stops early (a resumable snapshot is written), for time-boxed runs and tests. A fresh
    drafter is trained in the prefix convention `prefix_states` (a given `drafter` keeps its own)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = model_device(target)
    target.requires_grad_(False).eval()
    if drafter is None:
        config = replace(DrafterConfig.for_target(target.config), prefix_states=prefix_states)
        drafter = EagleDrafter(config).to(device)
        drafter.init_from_target(target, torch.Generator().manual_seed(recipe.seed))
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=recipe.lr, betas=(recipe.beta1, recipe.beta2), weight_decay=0.0)
    steps_per_epoch = len(_batch_order(len(data), recipe.batch, 0, recipe.seed))
    total = recipe.epochs * steps_per_epoch
    step, history = 0, []
    state_path = out / STATE_FILE
    if resume and state_path.is_file():
        state = torch.load(state_path, weights_only=True, map_location=device)
        if state["recipe"] != json.dumps(asdict(recipe), sort_keys=True) or state["samples"] != len(data) \
                or state.get("prefix_states", "native") != drafter.config.prefix_states:
            raise ConfigError("--resume", f"the recipe, data and prefix states of the run in {state_path}",
                              "a different recipe, dataset or --prefix-states", "resume with the same arguments, or drop --resume")
        drafter.load_state_dict(state["drafter"], strict=True)
        opt.load_state_dict(state["optimizer"])
        step, history = int(state["step"]), json.loads(state["history"])
        log.info("resumed at step %d/%d", step, total)
    drafter.train()
    t0, window = time.perf_counter(), []
    stop_at = total if max_steps is None else min(total, max_steps)
    while step < stop_at:
        epoch, within = divmod(step, steps_per_epoch)
        idx = _batch_order(len(data), recipe.batch, epoch, recipe.seed)[within]
        g = torch.Generator(device=device).manual_seed(recipe.seed * 1_000_003 + step)
        uncond = torch.rand(idx.numel(), generator=torch.Generator().manual_seed(recipe.seed + 31 * step)) \
            < recipe.uncond_prob
        cond = data.batch(idx, target, uncond)
        loss, parts = drafter_loss(drafter, target, cond, data.tokens[idx].to(device), recipe, g)
        for group in opt.param_groups:
            group["lr"] = recipe.lr * lr_factor(step, steps_per_epoch, total, recipe)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_value_(params, recipe.clip_value)
        opt.step()
        step += 1
        window.append(parts)
        if step % 50 == 0 or step == stop_at:
            mean = {k: sum(w[k] for w in window) / len(window) for k in window[0]}
            history.append({"step": step, "epoch": step / steps_per_epoch, **mean})
            rate = (time.perf_counter() - t0) / max(1, len(window) + 50 * (len(history) - 1))
            log.info("step %d/%d (epoch %.2f) loss %.4f value %.4f prob %.3f top-1 %.3f, %.2f s/step",
                     step, total, step / steps_per_epoch, mean["loss"], mean["value"], mean["prob"], mean["top1"], rate)
            window = []
        if step % recipe.checkpoint_every == 0 or step == stop_at:
            snapshot = {"drafter": drafter.state_dict(), "optimizer": opt.state_dict(), "step": step,
                        "history": json.dumps(history), "samples": len(data),
                        "prefix_states": drafter.config.prefix_states,
                        "recipe": json.dumps(asdict(recipe), sort_keys=True)}
            tmp = state_path.with_suffix(".tmp")
            torch.save(snapshot, tmp)
            tmp.replace(state_path)
    drafter.eval()
    record = {"recipe": asdict(recipe), "steps": step, "total_steps": total, "steps_per_epoch": steps_per_epoch,
              "samples": len(data), "data": list(data.sources), "history": history, "finished": step >= total,
              "prefix_states": drafter.config.prefix_states}
    return drafter, record


# ------------------------------------------------------------------------------------ evaluation

@torch.no_grad()
def measure_acceptance(target: ImageTransformer, drafter: EagleDrafter, condition: Condition, sampling: SamplingConfig,
                       seed: int) -> dict:
    """Mean accepted length and per-depth acceptance of exact decoding with the published trees."""
    from ..decoding.trees.config import SpeculativeConfig
    from ..decoding.trees.drafting import DynamicShape
    from ..decoding.trees.driver import speculative_generate
    from ..decoding.trees.specs import MC_SIM_7B_63, NAIVE_EXTEND_57, chain_tree

    trees = {"naive_extend_57": SpeculativeConfig(static_tree=NAIVE_EXTEND_57),
             "mc_sim_7b_63": SpeculativeConfig(static_tree=MC_SIM_7B_63),
             "chain_4": SpeculativeConfig(static_tree=chain_tree(4)),
             "eagle2 d5 k10 n58": SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(5, 10, 58))}
    out = {}
    for name, spec in trees.items():
        result = speculative_generate(target, drafter, condition, sampling, spec,
                                      make_generators(seed, condition.batch, model_device(target)))
        out[name] = {"mean_accepted_length": round(result.stats.mean_accepted_length, 3),
                     "acceptance_by_depth": [round(a, 3) for a in result.stats.acceptance_by_depth]}
        log.info("acceptance with %s: %s", name, out[name])
    return out


def write_card(record: dict, out: Path) -> None:
    """DRAFTER_CARD.md for a drafter of the embedded model, from its training record."""
    r, ev = record["recipe"], record.get("evaluation", {})
    hist = record["history"]
    rows = "\n".join(f"| {name} | {v['mean_accepted_length']:.2f} | {' '.join(f'{a:.2f}' for a in v['acceptance_by_depth'])} |"
                     for name, v in ev.get("trees", {}).items())
    size = sum(p.stat().st_size for p in out.glob("*.safetensors")) / 2**20
    text = f"""# Drafter of lantern-tiny-photos (embedded)

An EAGLE / LANTERN feature drafter for the embedded default model, in LANTERN's released layout
(`config.json` + `model.safetensors`, HF key names; {size:.1f} MiB fp16): one decoder layer on
[token embedding; target feature] (fc with bias, no input norm, 2-D RoPE shifted by one position),
the target's frozen output head, its token embedding copied from the target and frozen.

## Command
`{record.get("command", "")}`
(`make train-default-drafter`). Deterministic (explicit generators from `--seed` {r["seed"]}); resumable with `--resume`.

## Data
{"; ".join(record["data"])}. {record["samples"]} sequences of 256 tokens; each batch row is made
unconditional (null class) with probability {r["uncond_prob"]}.

## Recipe (EAGLE's, as LANTERN used it)
SmoothL1 on the next feature + {r["p_weight"]} x soft cross-entropy against the target's next-token
distribution; uniform feature noise (std {r["noise_std"]}); AdamW betas ({r["beta1"]}, {r["beta2"]}), no
weight decay; clip by value {r["clip_value"]}; {r["warmup_ratio"]:.0%} warm-up then linear decay;
{r["epochs"]} epochs, batch {r["batch"]} ({record["steps"]} steps). Learning rate {r["lr"]}: 10x EAGLE's
1e-4, because this drafter starts from scratch on a tiny dataset and a CPU budget.
Loss {hist[0]["loss"]:.3f} -> {hist[-1]["loss"]:.3f}; top-1 agreement with the target's next token
{hist[0]["top1"]:.3f} -> {hist[-1]["top1"]:.3f} (training batches, last 50 steps). Wall time
{record.get("train_s", 0) / 60:.1f} min on 2 CPU threads (torch {torch.__version__}).

## Measured acceptance (exact decoding, {ev.get("images", 0)} images, cfg {ev.get("cfg", 0)}, temperature 1)
| tree | mean accepted length (tokens per target forward) | acceptance by depth |
|---|---|---|
{rows}
"""
    (out / "DRAFTER_CARD.md").write_text(text)


# ------------------------------------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lantern_core.training.train_drafter", description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="'embedded', a LlamaGen GPT checkpoint (file or HF folder), or "
                   "an Anole / Janus-Pro model folder")
    p.add_argument("--vq", help="VQ tokenizer for --images (default: the embedded one with --target embedded)")
    p.add_argument("--t5", help="Flan-T5 folder (t2i targets)")
    p.add_argument("--images", type=Path, help="folder of training images (see module docs)")
    p.add_argument("--prompts", type=Path, help="text-conditional self-distillation: a text file, one prompt per line")
    p.add_argument("--self-distill", type=int, default=0, help="samples per class / prompt drawn from the target")
    p.add_argument("--crops-per-class", type=int, default=None,
                   help="--target embedded: real crops per class of its photos (default 128 when no other data)")
    p.add_argument("--cfg", type=float, default=3.0, help="self-distillation CFG scale")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="output folder (drafter + training_log.json)")
    p.add_argument("--resume", action="store_true", help="continue the run snapshotted in --out")
    p.add_argument("--max-steps", type=int, help="stop after this many steps (resumable)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--evaluate", action="store_true", help="measure acceptance on 16 images after training")
    p.add_argument("--prefix-states", choices=PREFIX_STATES, default="native",
                   help="features of padded caption rows the drafter learns on: LlamaGen's own ('native', the "
                   "default) or LANTERN's HF port ('hf_port', as its released t2i drafters); recorded in config.json")
    for field_name, default in asdict(Recipe()).items():
        p.add_argument(f"--{field_name.replace('_', '-')}", type=type(default), default=default)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_flush_denormal(True)  # denormal Adam moments slow CPU steps ~10x; process-wide, restored below
    try:
        train_from_args(args)
    except LanternError as exc:
        log.error("%s", exc)
        return 2
    finally:
        torch.set_flush_denormal(False)
    return 0


def train_from_args(args: argparse.Namespace) -> dict:
    from ..loading.checkpoints import load_gpt, load_vq
    from ..loading.embedded import load_embedded
    from ..loading.families import family_of, load_prompted

    recipe = Recipe(**{k: getattr(args, k) for k in asdict(Recipe())})
    prompted = None
    if args.target == "embedded":
        pipe = load_embedded(args.device)
        gpt, vq = pipe.gpt, pipe.vq.model if args.vq is None else load_vq(args.vq, args.device).model
        target = gpt.model
    elif family_of(args.target):

        prompted = load_prompted(args.target, device=args.device)
        gpt, vq, target = None, prompted.vq, prompted.model
    else:
        gpt = load_gpt(args.target, device=args.device)
        vq = load_vq(args.vq, args.device).model if args.vq else None
        target = gpt.model
    encoder = prompted.encoder if prompted else None
    if prompted and args.images:
        raise ConfigError("--images", "self-distilled data (--prompts FILE --self-distill N) for an Anole / "
                          "Janus-Pro target", str(args.images))
    if target.config.model_type == "t2i" and (args.images or args.prompts):
        from ..text_encoder import T5CaptionEncoder

        if not args.t5:
            raise ConfigError("--t5", "a Flan-T5 folder for a text-conditional target", None)
        encoder = T5CaptionEncoder(args.t5, args.device, max_tokens=target.config.cls_token_num)
    parts = []
    if args.images:
        if vq is None:
            raise ConfigError("--vq", "the target's VQ tokenizer to encode --images", None)
        parts.append(image_folder_data(args.images, target, vq, gpt.class_names, encoder))
    if args.self_distill:
        sampling = SamplingConfig(cfg_scale=args.cfg, temperature=args.temperature, top_k=args.top_k)
        if target.config.model_type == "c2i":
            labels = torch.arange(target.config.num_classes).repeat_interleave(args.self_distill)
            cond = Condition(labels=labels)
        else:
            if not args.prompts:
                raise ConfigError("--prompts", "a prompt file for text-conditional self-distillation", None)
            prompts = [x.strip() for x in args.prompts.read_text().splitlines() if x.strip()] * args.self_distill
            cond = encoder.encode(prompts)
        parts.append(self_distilled_data(target, cond, sampling, recipe.seed + 1000))
    crops = args.crops_per_class if args.crops_per_class is not None else (0 if parts else 128)
    if args.target == "embedded" and crops > 0:
        parts.append(embedded_photo_data(vq, crops, recipe.seed))
    if not parts:
        raise ConfigError("training data", "--images and/or --self-distill", "neither")
    data = DrafterData.concat(parts)
    t0 = time.perf_counter()
    drafter, record = train_drafter(target, data, recipe, args.out, resume=args.resume, max_steps=args.max_steps,
                                    prefix_states=args.prefix_states)
    record.update(target=args.target, train_s=time.perf_counter() - t0,
                  command="python -m lantern_core.training.train_drafter " + " ".join(args.argv))
    half = {k: v.half().float() if v.is_floating_point() else v for k, v in drafter.state_dict().items()}
    drafter.load_state_dict(half)  # what we save (fp16) is what we measured
    if args.evaluate and (target.config.model_type == "c2i" or prompted):
        if prompted:
            prompts = [x.strip() for x in args.prompts.read_text().splitlines() if x.strip()][:8]
            cond = encoder.encode(prompts * max(1, 8 // len(prompts)), device=args.device)
        else:
            cond = Condition(labels=torch.arange(target.config.num_classes).repeat(2).to(args.device))
        sampling = SamplingConfig(cfg_scale=3.0, temperature=1.0)
        record["evaluation"] = {"images": cond.batch, "cfg": 3.0, "trees": measure_acceptance(
            target, drafter, cond, sampling, seed=recipe.seed + 5000)}
    save_drafter(drafter, args.out, extra={"target": args.target, "trained_steps": record["steps"]},
                 dtype=torch.float16)
    (args.out / "training_log.json").write_text(json.dumps(record, indent=2, sort_keys=True))
    if args.target == "embedded" and "evaluation" in record:
        write_card(record, args.out)
    log.info("saved %s (%d steps%s)", args.out, record["steps"], "" if record["finished"] else ", unfinished: --resume")
    return record


if __name__ == "__main__":
    raise SystemExit(main())
