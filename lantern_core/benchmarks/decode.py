"""What batch-invariant decoding costs (`make bench`, `make bench-cuda`): `vq.decode_images` (one image per
decoder call, so image i of a batch has exactly a single run's pixels) next to one batched `VQModel.decode`
call, interleaved, median wall time per image at batch 1, 2, 4 and 8, on the embedded 128 px decoder and on
a random decoder of LlamaGen's VQ-16 shape at 256 px (16 x 16 codes). Timings are never asserted; that the
pixels are identical is tested (tests/core/test_cli_and_embedded.py, tests/nodes/test_determinism.py).

    python -m lantern_core.benchmarks.decode --device cuda --dtype bfloat16
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from ..config import VQConfig
from ..decoding.generate import synchronize
from ..loading.embedded import EMBEDDED_VQ
from ..loading.checkpoints import load_vq
from ..models.vq import VQModel, decode_images
from .ar import machine_info
from .report_writer import Report

log = logging.getLogger("lantern_core.benchmarks.decode")
BATCHES = (1, 2, 4, 8)


def time_decoders(vq: VQModel, grid: int, batches: tuple[int, ...], repeats: int,
                  progress: Callable[[list[dict]], None] = lambda rows: None) -> list[dict]:
    """Per batch size: median seconds per image of one-by-one and batched decodes of the same random codes
    (`progress(rows so far)` after each batch size)."""
    device = vq.quantize.embedding.weight.device
    rows = []
    for batch in batches:
        codes = torch.randint(0, vq.config.codebook_size, (batch, grid * grid),
                              generator=torch.Generator().manual_seed(batch)).to(device)
        runs = {"one_by_one": lambda: decode_images(vq, codes), "batched": lambda: vq.decode(codes)}
        times = {name: [] for name in runs}
        with torch.no_grad():
            for repeat in range(repeats + 1):  # the first round warms up
                for name, decode in runs.items():
                    synchronize(device)
                    start = time.perf_counter()
                    decode()
                    synchronize(device)
                    if repeat:
                        times[name].append((time.perf_counter() - start) / batch)
        medians = {name: statistics.median(t) for name, t in times.items()}
        rows.append({"batch": batch, **{f"{k}_ms_per_image": round(1000 * v, 2) for k, v in medians.items()},
                     "ratio": round(medians["one_by_one"] / medians["batched"], 3)})
        progress(rows)
    return rows


def run(report: Report, device: torch.device, dtype: torch.dtype, repeats: int, batches: tuple[int, ...] = BATCHES,
        llamagen_batches: tuple[int, ...] = BATCHES, llamagen_grid: int = 16) -> dict:
    """Both decoders into `report`, rewritten after every batch size: the embedded one at `batches`, a random
    VQ-16-shaped one on a `llamagen_grid` square of codes at `llamagen_batches`. Returns its data."""
    report.update(**machine_info(device), dtype=str(dtype).replace("torch.", ""), repeats=repeats, decoders=[])
    embedded = load_vq(EMBEDDED_VQ, device, dtype).model.eval()
    llamagen = VQModel(VQConfig()).to(device, dtype).eval()  # VQ-16's shape, random weights
    decoders = [("embedded 128 px", embedded, 16, batches),
                (f"LlamaGen VQ-16 shape, {16 * llamagen_grid} px", llamagen, llamagen_grid, llamagen_batches)]
    for name, vq, grid, sizes in decoders:
        entry = {"decoder": name, "grid": grid, "rows": []}
        report.add("decoders", entry)

        def progress(rows: list[dict], entry: dict = entry) -> None:
            entry["rows"] = list(rows)
            report.save()

        time_decoders(vq, grid, sizes, repeats, progress)
    return report.data


def markdown(report: dict) -> str:
    tables = []
    for d in report["decoders"]:
        rows = "\n".join(f"| {r['batch']} | {r['one_by_one_ms_per_image']:.1f} | {r['batched_ms_per_image']:.1f} | "
                         f"{r['ratio']:.2f} |" for r in d["rows"])
        tables.append(f"""### {d['decoder']} ({d['grid']} x {d['grid']} codes)

| batch | one image per call (ms / image) | one batched call (ms / image) | one by one / batched |
|---|---|---|---|
{rows}
""")
    return f"""# Batch-invariant decoding: one image per decoder call vs one batched call ({report['device']}, {report['dtype']})

{report['machine']}; torch {report['torch']}, {report['threads']} threads; {report['date']}. Interleaved,
medians of {report['repeats']} runs after a warm-up. One image per call is what the pack does (image i of a
batch then has exactly the pixels of a single run); the batched call is only close to them.

""" + "\n".join(tables)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lantern_core.benchmarks.decode", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES), help="batch sizes for the embedded decoder")
    p.add_argument("--llamagen-batches", type=int, nargs="+", default=list(BATCHES),
                   help="batch sizes for the 256 px decoder (a CPU takes seconds per image)")
    p.add_argument("--llamagen-grid", type=int, default=16, help="codes per side for the VQ-16 decoder (16: 256 px)")
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    report = Report(args.out, f"decode_{device.type}_{args.dtype}", markdown)
    run(report, device, dtype, args.repeats, tuple(args.batches), tuple(args.llamagen_batches), args.llamagen_grid)
    log.info("\n%s", markdown(report.finish()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
