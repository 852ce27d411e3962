"""Soak: many generations through a real ComfyUI server with the pack, mixing decoding modes, with random
Cancels (POST /interrupt mid-run) and POST /free between runs. Checks that every run that was not
cancelled succeeded, that a (mode, seed, class) seen twice gives a byte-identical image, and how the
server's resident memory moves after a warm-up (every mode run twice, with a /free between); with a
write audit (tests/host/audit/sitecustomize.py) it also lists every path the pack's code wrote to.

    python tests/host/soak.py --runs 300 --out bench/results     # make soak: JSON + markdown figures

The test suite runs a shorter soak (tests/nodes/test_soak.py).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import copy
import hashlib
import io
import json
import platform
import random
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client import run_prompt_async  # noqa: E402
from comfy_server import REPO, ComfyServer  # noqa: E402
from workflow import ui_to_api  # noqa: E402

# mode -> (example workflow, LanternDecodingConfig overrides)
MODES = {
    "ar": ("lantern_embedded_model", {}),
    "lantern_pp": ("lantern_pp_embedded_model", {}),
    "static_tree": ("lantern_pp_embedded_model", {"mode": "static_tree"}),
    "sjd_coupled": ("lantern_sjd_embedded_model", {}),
}
SEEDS = (1, 2, 3)
CLASSES = ("cat", "rocket")
ALLOWED = ("models", "user", "output", "temp")  # ComfyUI folders the pack may write under


@dataclass(frozen=True)
class SoakConfig:
    runs: int = 50
    seed: int = 0  # of the schedule (modes, seeds, cancels, /free calls): same config, same soak
    cancel_rate: float = 0.15
    free_rate: float = 0.1

    def __post_init__(self) -> None:
        if self.runs < 2 * len(MODES) + 1:
            raise ValueError(f"runs: expected at least {2 * len(MODES) + 1} (the warm-up runs every mode twice), "
                             f"found {self.runs}")
        if not (0 <= self.cancel_rate <= 1 and 0 <= self.free_rate <= 1):
            raise ValueError("cancel_rate and free_rate: expected probabilities in [0, 1]")


@dataclass
class SoakReport:
    runs: int = 0
    succeeded: int = 0
    cancelled: int = 0  # ended "interrupted" after a Cancel
    cancels_sent: int = 0  # some land after the run already finished: those runs succeed
    frees: int = 0
    failed: list = field(default_factory=list)  # runs not cancelled that did not succeed: (index, status, error)
    errors_by_kind: dict = field(default_factory=dict)  # exception_type -> count
    by_mode: dict = field(default_factory=dict)
    repeats: int = 0  # successful runs whose (mode, seed, class) had been seen before
    repeats_executed: int = 0  # ... of which the sampler ran again (not a ComfyUI cache hit)
    mismatches: list = field(default_factory=list)
    warmup_runs: int = 0
    rss_warm_mb: float = 0.0
    rss_end_mb: float = 0.0
    rss_peak_mb: float = 0.0
    rss_growth: float = 0.0  # (end - warm) / warm
    rss_mb: list = field(default_factory=list)  # after every finished run
    writes_outside: list = field(default_factory=list)  # paths the pack wrote outside ALLOWED
    writes: int = 0
    seconds: float = 0.0


def _prompts(server: ComfyServer) -> dict[str, dict]:
    info = server.get("/object_info", timeout=60)
    out = {}
    for mode, (name, overrides) in MODES.items():
        prompt = ui_to_api(json.loads((REPO / "example_workflows" / f"{name}.json").read_text()), info)
        for node in prompt.values():
            if node["class_type"] == "LanternDecodingConfig":
                node["inputs"].update(overrides)
        out[mode] = prompt
    return out


def _set(prompt: dict, class_type: str, **inputs) -> None:
    for node in prompt.values():
        if node["class_type"] == class_type:
            node["inputs"].update(inputs)


def _image_hash(server: ComfyServer, history: dict) -> str:
    images = [img for out in history["outputs"].values() for img in out.get("images", []) if img["type"] == "output"]
    data = server.request("GET", f"/view?filename={images[0]['filename']}&subfolder={images[0]['subfolder']}"
                                 "&type=output")
    return hashlib.sha256(Image.open(io.BytesIO(data)).convert("RGB").tobytes()).hexdigest()


def _schedule(config: SoakConfig) -> list[tuple[str, int, str, bool, bool]]:
    """(mode, seed, class, cancel?, /free before?) per run; the warm-up runs every mode twice with a /free
    between and no cancels."""
    rng = random.Random(config.seed)
    modes = list(MODES)
    plan = [(m, SEEDS[0], CLASSES[0], False, False) for m in modes]
    plan += [(m, SEEDS[1], CLASSES[1], False, i == 0) for i, m in enumerate(modes)]
    while len(plan) < config.runs:
        plan.append((rng.choice(modes), rng.choice(SEEDS), rng.choice(CLASSES), rng.random() < config.cancel_rate,
                     rng.random() < config.free_rate))
    return plan


async def _run(server: ComfyServer, prompt: dict, cancel_at: int | None):
    sent = []

    async def maybe_cancel(kind, data, session):
        if cancel_at is not None and kind == "progress" and data.get("value", 0) >= cancel_at and not sent:
            sent.append(1)
            async with session.post(f"{server.url}/interrupt", json={}) as resp:
                resp.raise_for_status()

    result = await run_prompt_async(server.url, prompt, maybe_cancel, timeout=600)
    return result, bool(sent)


def run_soak(server: ComfyServer, config: SoakConfig, audit_log: Path | None = None, log=print) -> SoakReport:
    prompts = _prompts(server)
    rng = random.Random(config.seed + 1)
    report = SoakReport(warmup_runs=2 * len(MODES))
    seen: dict[tuple, str] = {}
    errors = collections.Counter()
    by_mode = collections.Counter()
    start = time.perf_counter()
    for index, (mode, seed, label, cancel, free) in enumerate(_schedule(config)):
        if free:
            server.post("/free", {"unload_models": True, "free_memory": True})
            report.frees += 1
        prompt = copy.deepcopy(prompts[mode])
        _set(prompt, "LanternSampler", seed=seed)
        _set(prompt, "LanternConditioning", class_name=label)
        _set(prompt, "SaveImage", filename_prefix=f"soak/{index:04d}")
        cancel_at = rng.randrange(4, 200) if cancel else None
        result, sent = asyncio.run(_run(server, prompt, cancel_at))
        report.runs += 1
        report.cancels_sent += sent
        by_mode[mode] += 1
        for err in result.of_type("execution_error"):
            errors[err.get("exception_type", "?")] += 1
        if result.status == "interrupted" and sent:
            report.cancelled += 1
        elif result.status != "success":
            detail = result.of_type("execution_error")[:1]
            report.failed.append((index, mode, result.status, detail[0].get("exception_message", "")[:300]
                                  if detail else ""))
        else:
            report.succeeded += 1
            digest = _image_hash(server, result.history)
            key = (mode, seed, label)
            sampler = next(k for k, v in prompt.items() if v["class_type"] == "LanternSampler")
            ran = not any(sampler in d.get("nodes", []) for d in result.of_type("execution_cached"))
            if key in seen:
                report.repeats += 1
                report.repeats_executed += ran
                if seen[key] != digest:
                    report.mismatches.append((index, key))
            else:
                seen[key] = digest
        rss = server.rss_bytes() / 2**20
        report.rss_mb.append(round(rss, 1))
        if index + 1 == report.warmup_runs:
            report.rss_warm_mb = rss
        log(f"run {index:3d} {mode:12s} seed {seed} {label:7s} {result.status:11s} {result.seconds:5.1f} s "
            f"rss {rss:7.1f} MB" + (" (cancel sent)" if sent else ""))
    report.rss_end_mb = report.rss_mb[-1]
    report.rss_peak_mb = max(report.rss_mb[report.warmup_runs - 1:])
    report.rss_growth = (report.rss_end_mb - report.rss_warm_mb) / report.rss_warm_mb
    report.errors_by_kind, report.by_mode = dict(errors), dict(by_mode)
    report.seconds = time.perf_counter() - start
    if audit_log is not None:
        writes = [json.loads(line) for line in audit_log.read_text().splitlines()] if audit_log.exists() else []
        roots = tuple(str(server.base_dir.resolve() / d) + "/" for d in ALLOWED)
        report.writes = len(writes)
        report.writes_outside = sorted({w["path"] for w in writes if not str(Path(w["path"]).resolve()).startswith(roots)})
    return report


def audited_server(base: Path, port: int) -> tuple[ComfyServer, Path]:
    """A ComfyUI server whose writes from the pack's code are logged (see audit/sitecustomize.py)."""
    audit_log = base / "pack_writes.jsonl"
    env = {"PYTHONPATH": str(Path(__file__).resolve().parent / "audit"), "LANTERN_WRITE_AUDIT": str(audit_log),
           "LANTERN_PACK_DIR": str(REPO)}
    return ComfyServer(base, port, env=env), audit_log


def write_results(report: SoakReport, config: SoakConfig, out: Path) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    env = {"machine": platform.machine(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
           "server": "ComfyUI 0.3.75 --cpu, embedded model (128 px, 256 tokens)"}
    (out / "soak_cpu.json").write_text(json.dumps({"env": env, "config": asdict(config), **asdict(report)}, indent=1))
    lines = [f"# Soak: {report.runs} generations through a real ComfyUI server", "",
             f"{env['machine']}; torch {env['torch']}; {env['date']}; {env['server']}; schedule seed {config.seed}, "
             f"cancel rate {config.cancel_rate}, /free rate {config.free_rate}", "",
             "| figure | value |", "|---|---|",
             f"| runs (by mode) | {report.runs} ({', '.join(f'{k} {v}' for k, v in sorted(report.by_mode.items()))}) |",
             f"| succeeded | {report.succeeded} |",
             f"| cancelled (Cancel sent mid-run) | {report.cancelled} of {report.cancels_sent} Cancels sent |",
             f"| failed (not cancelled, not successful) | {len(report.failed)} |",
             f"| errors by kind | {report.errors_by_kind or 'none'} |",
             f"| /free calls | {report.frees} |",
             f"| repeated (mode, seed, class) | {report.repeats} ({report.repeats_executed} re-executed), "
             f"{len(report.mismatches)} differing images |",
             f"| server RSS after warm-up ({report.warmup_runs} runs) | {report.rss_warm_mb:.1f} MB |",
             f"| server RSS at the end / peak after warm-up | {report.rss_end_mb:.1f} MB / {report.rss_peak_mb:.1f} MB |",
             f"| RSS growth after warm-up | {100 * report.rss_growth:+.2f} % |",
             f"| pack writes (audited) / outside models,user,output,temp | {report.writes} / "
             f"{len(report.writes_outside)} |",
             f"| wall time | {report.seconds:.0f} s |"]
    (out / "soak_cpu.md").write_text("\n".join(lines) + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description="Soak a real ComfyUI server running the pack")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    config = SoakConfig(runs=args.runs, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="lantern-soak-") as tmp:
        server, audit_log = audited_server(Path(tmp), free_port())
        with server:
            report = run_soak(server, config, audit_log)
    write_results(report, config, args.out)
    print((args.out / "soak_cpu.md").read_text())
    ok = (not report.failed and not report.mismatches and report.rss_growth < 0.05 and not report.writes_outside)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
