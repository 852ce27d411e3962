"""Command line: `python -m lantern_core generate ...` writes PNGs and prints stats.

Works with the embedded default (no arguments) and with real LlamaGen checkpoints given by path
(`--gpt c2i_B_256.pt --vq vq_ds16_c2i.pt`, or a t2i model plus `--t5 folder --prompt ...`).
Devices and dtypes are chosen here, by the user, never inside the library.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import torch

from .conditioning import Condition
from .config import SamplingConfig
from .loading.embedded import EMBEDDED_GPT, EMBEDDED_VQ, Pipeline
from .errors import LanternError
from .decoding.generate import generate
from .images import save_png, to_unit_range
from .decoding.sampling import make_generators
from .decoding.step_graphs import COMPILE_CHOICES

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lantern_core")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate images and print stats")
    g.add_argument("--gpt", type=Path, default=EMBEDDED_GPT, help="GPT checkpoint file or HF folder (default: embedded)")
    g.add_argument("--vq", type=Path, default=None, help="VQ tokenizer file (default: embedded with the embedded GPT)")
    g.add_argument("--t5", type=Path, default=None, help="Flan-T5-XL folder (t2i models)")
    g.add_argument("--prompt", action="append", default=[], help="caption (t2i); repeat for a batch")
    g.add_argument("--cls", action="append", default=[], help="class name or index (c2i); repeat for a batch")
    g.add_argument("--batch", type=int, default=1, help="samples per class/prompt")
    g.add_argument("--grid-size", type=int, default=None, help="override the token grid side")
    g.add_argument("--n-head", type=int, default=None,
                   help="attention heads of a LlamaGen .pt trained with a non-standard head count (default: "
                        "from the file's saved args or LlamaGen's published widths; the stats' load notes say which)")
    g.add_argument("--cfg", type=float, default=3.0)
    g.add_argument("--cfg-interval", type=int, default=-1)
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0, help="sample i uses seed + i")
    g.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps")
    g.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    g.add_argument("--out", type=Path, default=Path("outputs"), help="folder for the PNGs")
    g.add_argument("--json", action="store_true", help="print stats as JSON")
    g.add_argument("--decoding", default="ar", choices=["ar", "sjd", "sjd_coupled"],
                   help="ar, or training-free speculative Jacobi decoding (exact: same distribution as ar)")
    g.add_argument("--window", default="auto", help="sjd: drafted tokens per forward, or auto (this machine's best)")
    g.add_argument("--recalibrate", action="store_true",
                   help="measure the auto window again (choices are kept in the user cache folder, "
                        "~/.cache/lantern/auto_choices.json, and reused while the machine, model and settings match)")
    g.add_argument("--compile", default="auto", choices=list(COMPILE_CHOICES),
                   help="auto replays each decoding step (ar) or iteration (sjd) from a captured CUDA graph on a "
                        "GPU (eager on CPU/MPS; the same tokens); off: always eager")
    return parser


def user_cache_dir() -> Path:
    """The user's cache folder for lantern (XDG_CACHE_HOME, else ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lantern"


def run_generate(args: argparse.Namespace) -> dict:
    from .decoding import auto_store
    from .loading.checkpoints import load_gpt, load_vq

    auto_store.use_store(user_cache_dir() / "auto_choices.json")
    if args.recalibrate:
        auto_store.forget_all()

    dtype = DTYPES[args.dtype]
    device = torch.device(args.device)
    gpt = load_gpt(args.gpt, grid_size=args.grid_size, device=device, dtype=dtype, n_head=args.n_head)
    vq_path = args.vq or (EMBEDDED_VQ if Path(args.gpt).resolve() == EMBEDDED_GPT else None)
    if vq_path is None:
        raise LanternError("--vq is required with a non-embedded GPT: pass the VQ tokenizer file "
                           "(vq_ds16_c2i.pt for c2i, vq_ds16_t2i.pt for t2i)")
    pipe = Pipeline(gpt, load_vq(vq_path, device=device, dtype=dtype))
    if gpt.config.model_type == "t2i":
        if args.t5 is None or not args.prompt:
            raise LanternError("this is a text-to-image model: pass --t5 FOLDER and at least one --prompt")
        from .text_encoder import T5CaptionEncoder, text_encoder_dtype

        encoder = T5CaptionEncoder(args.t5, device=device, max_tokens=gpt.config.cls_token_num,
                                   dtype=text_encoder_dtype(dtype))
        prompts = [p for p in args.prompt for _ in range(args.batch)]
        condition = encoder.encode(prompts)
        labels_text = prompts
    else:
        classes = args.cls or ["0"]
        labels = [pipe.class_index(c) for c in classes for _ in range(args.batch)]
        condition = Condition.classes(labels, device=device)
        names = gpt.class_names or []
        labels_text = [names[i] if i < len(names) else str(i) for i in labels]
    sampling = SamplingConfig(cfg_scale=args.cfg, cfg_interval=args.cfg_interval, temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p)
    generators = make_generators(args.seed, condition.batch, device)
    if args.decoding == "ar":
        result = generate(gpt.model, condition, sampling, generators, compile=args.compile)
    else:
        from .decoding.jacobi import JacobiConfig, jacobi_generate

        window = int(args.window) if args.window.isdigit() else args.window  # a bad value is a ConfigError
        config = JacobiConfig(window, coupled=args.decoding == "sjd_coupled", init="sample_left")
        result = jacobi_generate(gpt.model, condition, sampling, config, generators, compile=args.compile)
    with torch.no_grad():
        images = to_unit_range(pipe.vq.model.decode(result.tokens))
    paths = [args.out / f"lantern_{args.seed + i:05d}.png" for i in range(condition.batch)]
    save_png(images, paths)
    return {"images": [str(p) for p in paths], "conditions": labels_text, "stats": result.stats.to_dict(),
            "summary": result.stats.summary(), "model": str(args.gpt), "notes": gpt.notes}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        report = run_generate(args)
    except LanternError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for path, cond in zip(report["images"], report["conditions"]):
            print(f"wrote {path}  ({cond})")
        print(report["summary"])
    return 0
