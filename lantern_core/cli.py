"""Command line: `python -m lantern_core generate ...` writes PNGs and prints stats.

Works with the embedded default (no arguments), with real LlamaGen checkpoints given by path
(`--gpt c2i_B_256.pt --vq vq_ds16_c2i.pt`, or a t2i model plus `--t5 folder --prompt ...`) and with the
prompted families' folders (`--model Anole-7b-v0.1-hf --prompt ...`: Anole, Lumina-mGPT, Janus-Pro), in
every decoding mode the nodes offer, validated by the same code (`decoding/modes.py`) with the same
messages; `--json` prints the stats the sampler node shows (`decoding/report.py`). Devices and dtypes are
chosen here, by the user, never inside the library.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .conditioning import Condition
from .config import KV_CACHE_FORMATS, SamplingConfig
from .decoding.trees.drafting import DynamicShape
from .decoding.jacobi.config import INITS
from .decoding.modes import MODES, SJD_RELAXATIONS, TREES, JacobiWidgets, ModeSettings, build_mode
from .loading.embedded import EMBEDDED_DRAFTER, EMBEDDED_GPT, EMBEDDED_VQ, Pipeline
from .errors import ConfigError, LanternError, check_choice
from .decoding.generate import generate
from .images import save_png, to_unit_range
from .models.vq import decode_images
from .decoding.sampling import make_generators
from .decoding.step_graphs import COMPILE_CHOICES
from .models.quantized import WEIGHT_CHOICES

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
    g.add_argument("--size", default=None, metavar="WxH",
                   help="image width x height in pixels for a prompted family's folder: any of Lumina-mGPT's sizes "
                        "(e.g. 1024x576); Anole and Janus-Pro only their own")
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
    g.add_argument("--weights", default="none", choices=WEIGHT_CHOICES,
                   help="weight-only quantization of the target's blocks at load (int8 or fp8, per-channel scales); "
                        "embeddings, norms, head and drafter stay in --dtype")
    g.add_argument("--kv-cache", default="auto", choices=KV_CACHE_FORMATS,
                   help="the target's attention keys and values: auto (in --dtype) or int8 (8 bits with per-head, "
                        "per-position scales: about half the memory, a slightly different law)")
    g.add_argument("--out", type=Path, default=Path("outputs"), help="folder for the PNGs")
    g.add_argument("--json", action="store_true", help="print stats as JSON")
    g.add_argument("--model", type=Path, default=None,
                   help="a prompted family's folder (Anole / Chameleon, Lumina-mGPT, Janus-Pro) instead of --gpt")
    g.add_argument("--vqgan", type=Path, default=None, help="Chameleon VQGAN file (default: the one in --model)")
    g.add_argument("--decoding", default="ar", help="; ".join(f"{k}: {v}" for k, v in MODES.items()))
    g.add_argument("--drafter", type=Path, default=None,
                   help="drafter folder or file for eagle2 / static_tree / lantern / lantern_pp (default: the "
                        "embedded drafter with the embedded GPT)")
    g.add_argument("--tree", default="auto", help=f"static tree for static_tree / lantern_pp: {', '.join(TREES)}")
    g.add_argument("--chain-length", type=int, default=4, help="drafted tokens when --tree chain")
    g.add_argument("--custom-tree", default="[[0], [1], [0, 0], [0, 0, 0]]",
                   help="--tree custom: JSON list of nodes as child ranks from the root")
    g.add_argument("--k", type=int, default=1000, dest="lantern_k",
                   help="lantern / lantern_pp / sjd_relaxed: latent neighbours per token (lantern_k)")
    g.add_argument("--delta", type=float, default=0.1, help="lantern: total-variation budget per token")
    g.add_argument("--lambda", type=float, default=5.0, dest="lam", help="lantern_pp: multiplicative bound")
    g.add_argument("--eagle-depth", type=int, default=5)
    g.add_argument("--eagle-top-k", type=int, default=10)
    g.add_argument("--eagle-nodes", type=int, default=58)
    g.add_argument("--window", default="auto", help="sjd modes: drafted tokens per forward, or auto (this "
                                                     "machine's best; 0 means auto too)")
    g.add_argument("--init", default="sample_left", help=f"sjd modes: window initialisation, one of {list(INITS)}")
    g.add_argument("--sjd-relaxation", default="lantern_pp", help=f"sjd_relaxed: one of {list(SJD_RELAXATIONS)}")
    g.add_argument("--gsd-gap", type=float, default=0.15, help="sjd_relaxed with gsd: group probability gap")
    g.add_argument("--rows", type=int, default=1, help="sjd modes: draft windows open at once (1: 1-D Jacobi; more: "
                                                       "also one on each of the next image rows, lossless)")
    g.add_argument("--row-window", type=int, default=4, help="sjd modes with --rows > 1: drafts per lower-row window")
    g.add_argument("--row-offset", type=int, default=-5,
                   help="sjd modes with --rows > 1: columns from the column below the frontier to where each lower "
                        "row's window starts (negative: to its left)")
    g.add_argument("--continuation", action="store_true",
                   help="sjd: a Jacobi update keeps the current draft with probability min(1, p/q), else draws from "
                        "the residual (SJD-PAC's adaptive continuation; lossless)")
    g.add_argument("--proactive", type=int, default=1,
                   help="sjd, sjd_coupled: candidates drafted at each of the first 3 positions past the frontier and "
                        "judged by recursive rejection sampling (SJD-PAC's proactive drafting; lossless); 1: off")
    g.add_argument("--row-causal", action="store_true",
                   help="sjd modes with --rows > 1: lower windows see only the committed tokens and their own window "
                        "(Parallel Jacobi Decoding's mask) instead of every earlier draft")
    g.add_argument("--row-lead", type=int, default=0,
                   help="sjd_2d_relaxed: a row commits column c only once the row above holds column c + row-lead "
                        "(0: Parallel Jacobi Decoding's rule; larger waits for more context)")
    g.add_argument("--recalibrate", action="store_true",
                   help="measure the auto window again (choices are kept in the user cache folder, "
                        "~/.cache/lantern/auto_choices.json, and reused while the machine, model and settings match)")
    g.add_argument("--compile", default="auto", choices=list(COMPILE_CHOICES),
                   help="auto fuses each decoding step or iteration with Inductor and replays it from a captured "
                        "CUDA graph on a GPU (the first image of a shape compiles); graphs captures without "
                        "compiling (the same tokens as off); CPU/MPS run eagerly with every choice; off: always eager")
    return parser


def user_cache_dir() -> Path:
    """The user's cache folder for lantern (XDG_CACHE_HOME, else ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lantern"


def parse_window(text: str) -> int:
    """--window: an integer (0 = auto) or 'auto'; anything else names the parameter as the node does."""
    if text == "auto":
        return 0
    if text.isdigit():
        return int(text)
    raise ConfigError("jacobi window", "an integer in 1..256 or 'auto'", text)


def cli_settings(args: argparse.Namespace) -> ModeSettings:
    """The decoding options as the node's settings (checked here, before any file is read)."""
    check_choice("decoding", args.decoding, MODES)
    return ModeSettings(args.decoding, args.tree, args.chain_length, args.custom_tree, args.lantern_k, args.delta,
                        args.lam, DynamicShape(args.eagle_depth, args.eagle_top_k, args.eagle_nodes),
                        JacobiWidgets(parse_window(args.window), args.init, args.sjd_relaxation, args.gsd_gap,
                                      args.rows, args.row_window, args.row_offset, args.row_causal,
                                      args.continuation, args.row_lead, args.proactive))


@dataclass
class CliModel:
    """What the command line decodes with: the target, its VQ decoder, the condition and its description."""

    model: torch.nn.Module
    config: object
    vq: torch.nn.Module
    condition: Condition
    conditions: list[str]
    notes: list[str]
    image_token_ids: torch.Tensor | None = None  # a Chameleon target's vocabulary ids of its image codes


def load_target(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> CliModel:
    from .loading.checkpoints import load_gpt, load_vq

    if args.model is not None:  # a prompted family's folder
        from .loading.families import load_prompted

        if not args.prompt:
            raise LanternError("a prompted model draws from prompts: pass at least one --prompt")
        from .image_sizes import parse_size

        size = None if args.size is None else parse_size(args.size, "--size")
        loaded = load_prompted(args.model, device=device, dtype=dtype, grid_size=args.grid_size, vq_dtype=torch.float32,
                               vqgan=args.vqgan, image_size=size, weights=args.weights)
        loaded.model.set_kv_cache(args.kv_cache)
        if loaded.vq is None:
            raise LanternError(f"'{args.model}' has no image tokenizer: put Chameleon's vqgan.ckpt in the folder "
                               "or pass --vqgan FILE")
        prompts = [p for p in args.prompt for _ in range(args.batch)]
        image_ids = getattr(getattr(loaded.model, "image", None), "token_ids", None)  # Chameleon code -> token id
        return CliModel(loaded.model, loaded.model.config, loaded.vq.to(device), loaded.encoder.encode(prompts, device),
                        prompts, [f"loaded {loaded.source_format}"], None if image_ids is None else image_ids.cpu())
    if args.size is not None:
        raise ConfigError("--size", "a prompted family's folder (--model)", args.size,
                          "LlamaGen draws the square its checkpoint was trained at: leave --size out")
    gpt = load_gpt(args.gpt, grid_size=args.grid_size, device=device, dtype=dtype, n_head=args.n_head,
                   weights=args.weights)
    gpt.model.set_kv_cache(args.kv_cache)
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
        return CliModel(gpt.model, gpt.config, pipe.vq.model, encoder.encode(prompts), prompts, gpt.notes)
    classes = args.cls or ["0"]
    labels = [pipe.class_index(c) for c in classes for _ in range(args.batch)]
    names = gpt.class_names or []
    return CliModel(gpt.model, gpt.config, pipe.vq.model, Condition.classes(labels, device=device),
                    [names[i] if i < len(names) else str(i) for i in labels], gpt.notes)


def load_cli_drafter(args: argparse.Namespace, target: CliModel, device: torch.device, dtype: torch.dtype):
    from .loading.drafter_io import load_drafter

    path = args.drafter
    if path is None and args.model is None and Path(args.gpt).resolve() == EMBEDDED_GPT:
        path = EMBEDDED_DRAFTER
    if path is None:
        return None, "none"
    loaded = load_drafter(path, target.config, device=device, dtype=dtype, image_token_ids=target.image_token_ids)
    return loaded.model, Path(path).name + (" (embedded)" if path == EMBEDDED_DRAFTER else "")


def neighbor_table(target: CliModel, k: int, device: torch.device) -> torch.Tensor | None:
    from .decoding.acceptance.neighbors import load_or_build_neighbors

    if k == 0:
        return None
    codebook = target.vq.quantize.embedding.weight
    if not 1 <= k < codebook.shape[0]:
        raise ConfigError("lantern_k", f"an integer in 1..{codebook.shape[0] - 1} (neighbours per token; "
                          "codebook size - 1)", k)
    return load_or_build_neighbors(codebook, k, user_cache_dir() / "neighbors").to(device)


def run_generate(args: argparse.Namespace) -> dict:
    from .decoding import auto_store
    from .decoding.jacobi.driver import jacobi_generate
    from .decoding.report import same_image_as_ar, stats_payload
    from .decoding.trees.driver import speculative_generate
    from .layout import image_codes

    auto_store.use_store(user_cache_dir() / "auto_choices.json")
    if args.recalibrate:
        auto_store.forget_all()
    dtype = DTYPES[args.dtype]
    device = torch.device(args.device)
    settings = cli_settings(args)
    target = load_target(args, device, dtype)
    drafter, drafter_name = (None, "none")
    if args.decoding in ("eagle2", "static_tree", "lantern", "lantern_pp"):
        drafter, drafter_name = load_cli_drafter(args, target, device, dtype)
    built = build_mode(settings, vocab=target.config.vocab_size, has_drafter=drafter is not None)
    sampling = SamplingConfig(cfg_scale=args.cfg, cfg_interval=args.cfg_interval, temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p)
    generators = make_generators(args.seed, target.condition.batch, device)
    neighbors = neighbor_table(target, built.neighbor_k, device)
    if built.spec is None:
        result = generate(target.model, target.condition, sampling, generators, compile=args.compile)
    elif built.needs_drafter:
        result = speculative_generate(target.model, drafter, target.condition, sampling, built.spec, generators,
                                      neighbors, compile=args.compile)
    else:
        result = jacobi_generate(target.model, target.condition, sampling, built.spec, generators, neighbors,
                                 compile=args.compile)
    with torch.no_grad():
        codes, grid = image_codes(target.config, result.tokens)
        images = to_unit_range(decode_images(target.vq, codes.to(device), grid).float())  # image by image
    paths = [args.out / f"lantern_{args.seed + i:05d}.png" for i in range(target.condition.batch)]
    save_png(images, paths)
    drafter_shown = drafter_name if built.needs_drafter else "none (training-free)"
    payload = stats_payload(result, args.decoding, built.label, drafter_shown, target.conditions,
                            same_image_as_ar(built.spec, sampling, target.model.tok_embeddings.weight.dtype))
    return {"images": [str(p) for p in paths], "conditions": target.conditions, "stats": payload,
            "summary": result.stats.summary(), "model": str(args.model or args.gpt), "notes": target.notes}


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
