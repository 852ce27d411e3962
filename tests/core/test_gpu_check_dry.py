"""`bench/gpu_check.sh` without a GPU: the step budgets keep part 1 inside 7 minutes (420 s) and part 2 inside one
device call, in the order the GPU window needs; a failing, overrunning or falling-back step (a capture or compile
fallback in its log, even with exit 0) is recorded and packed without stopping the others (a stand-in python);
the CPU dry run enforces none of the GPU budgets; and the dry run itself (`GPU_CHECK_DRY=1`: every step's code
path with tiny shapes) passes every step with no fallback and packs each step's log and complete reports into the
two archives, leaving at most 4 files in $OUT and bench/results untouched."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
PART_1_S = 420  # the first device call: at most 7 minutes, every step's kill margin included
PART_2_S = 540  # the optional second call: at most 9 minutes (a command may run 10)
PART_3_S = 540  # the optional third call (the CUDA tests that compile with Inductor): the same
PART_1_ORDER = ["environment", "test-cuda", "iteration_cost", "ar", "speculative", "quantization"]
# the report each benchmark step writes, by file stem (the dry run: CPU)
REPORTS = {"decode_counts": r"decode_counts_cpu_bfloat16", "ar": r"ar_cpu_float32", "ar-rest": r"ar_rest_cpu_float32",
           "iteration_cost": r"iteration_cost_cpu_float32", "speculative": r"speculative(_[\w.=-]+)?_cpu_float32",
           "batched": r"batched_cpu_float32", "families": r"families_cpu_float32",
           "prefix_states": r"prefix_states_cpu_float32", "decode": r"decode_cpu_float32",
           "quantization": r"quantization_cpu_bfloat16", "quantization-rest": r"quantization_rest_cpu_bfloat16",
           "same_seed": r"same_seed_cpu_float32"}


def steps() -> list[tuple[str, str, int]]:
    """(part, step, budget s) from the script's STEPS table."""
    table = re.search(r'^STEPS="\n(.*?)^"', SCRIPT.read_text(), re.S | re.M).group(1)
    return [(part, name, int(budget)) for part, name, budget in (line.split() for line in table.splitlines())]


def summary(path: Path) -> dict[str, tuple[str, str]]:
    """step -> (status, rc) from a summary_part<N>.txt."""
    rows = [line.split() for line in path.read_text().splitlines()]
    return {row[2]: (row[3], row[4]) for row in rows}


def summary_lines(path: Path) -> dict[str, str]:
    """step -> its whole line of a summary_part<N>.txt."""
    return {line.split()[2]: line for line in path.read_text().splitlines()}


def run_script(out: Path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env={**os.environ, "OUT": str(out), **env},
                          capture_output=True, text=True, timeout=timeout)


def test_each_part_fits_its_device_call():
    table = steps()
    grace = int(re.search(r"^KILL_AFTER=(\d+)", SCRIPT.read_text(), re.M).group(1))
    assert {part for part, _, _ in table} == {"1", "2", "3"} and len({name for _, name, _ in table}) == len(table)
    assert set(REPORTS) | {"environment", "test-cuda", "test-cuda-rest"} == {name for _, name, _ in table}
    assert [name for part, name, _ in table if part == "1"] == PART_1_ORDER  # what the first GPU window runs
    for part, limit in (("1", PART_1_S), ("2", PART_2_S), ("3", PART_3_S)):
        budgets = [budget for p, _, budget in table if p == part]
        assert sum(budgets) + grace * len(budgets) <= limit, (part, sum(budgets))  # every step killed at its limit


def test_the_dry_run_enforces_no_gpu_budget(tmp_path):
    """On the CPU every step runs under GPU_CHECK_DRY_BUDGET (default 1800 s, the budget its summary line shows
    and `timeout` gets), not its GPU budget: a loaded 2-core machine is no GPU."""
    python = tmp_path / "python"  # a stand-in that passes at once
    python.write_text("#!/bin/bash\nexit 0\n")
    python.chmod(0o755)
    out = tmp_path / "out"
    result = run_script(out, {"GPU_CHECK_DRY": "1", "PART": "1", "PY": str(python)}, 60)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = summary_lines(out / "summary_part1.txt")
    assert list(lines) == PART_1_ORDER
    assert all(line.split()[-1] == "1800s" for line in lines.values()), lines
    assert all(budget < 1800 for _, _, budget in steps())  # so the GPU's budgets are not what ran


def test_a_failing_overrunning_or_falling_back_step_does_not_stop_the_others(tmp_path):
    """A stand-in python: iteration_cost fails, ar overruns its budget, speculative exits 0 but logs two
    fallbacks in the new words and one in the old, quantization passes (its 'fell_back' row text is no fallback)."""
    python = tmp_path / "python"
    python.write_text("#!/bin/bash\ncase \"$*\" in\n  *benchmarks.iteration_cost*) exit 3 ;;\n"
                      "  *benchmarks.ar\\ *) sleep 30 ;;\n"
                      "  *benchmarks.speculative*) echo 'CAPTURE FALLBACK: CUDA graph capture failed (RuntimeError)'\n"
                      "    echo 'COMPILE FALLBACK: Inductor could not compile the tree step'\n"
                      "    echo 'no captured CUDA graph for step variant 3' ;;\n"
                      "  *benchmarks.quantization_gpu*) echo \"{'graphs': 'all', 'fell_back': False}\" ;;\n"
                      "esac\nexit 0\n")
    python.chmod(0o755)
    out = tmp_path / "out"
    result = run_script(out, {"GPU_CHECK_DRY": "1", "PART": "1", "PY": str(python), "GPU_CHECK_MAX_BUDGET": "2"}, 60)
    assert result.returncode == 1, result.stdout + result.stderr
    status = summary(out / "summary_part1.txt")
    assert status == {"environment": ("passed", "rc=0"), "test-cuda": ("passed", "rc=0"),
                      "iteration_cost": ("failed", "rc=3"), "ar": ("timed-out", "rc=124"),
                      "speculative": ("failed", "rc=0"), "quantization": ("passed", "rc=0")}
    lines = summary_lines(out / "summary_part1.txt")
    assert lines["speculative"].endswith("(3 fallbacks)"), lines
    assert all("fallbacks" not in line for name, line in lines.items() if name != "speculative"), lines
    assert "passed 3, failed 2, timed out 1; 3 capture or compile fallbacks;" in result.stdout
    with tarfile.open(out / "gpu_check_part1.tar.gz") as archive:
        names = set(archive.getnames())
    assert {f"part1/logs/{name}.log" for name in status} <= names and "part1/summary.txt" in names
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check_part1.tar.gz", "summary_part1.txt"]


@pytest.mark.slow
def test_dry_run_passes_every_step_and_packs_its_reports(tmp_path):
    results = ROOT / "bench" / "results"
    before = {p.name: p.stat().st_mtime_ns for p in results.iterdir()}
    out = tmp_path / "out"
    result = run_script(out, {"GPU_CHECK_DRY": "1", "PART": "all", "PY": sys.executable}, 3600)  # a hang guard only
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check_part1.tar.gz", "gpu_check_part2.tar.gz",
                                                      "gpu_check_part3.tar.gz", "summary_part1.txt",
                                                      "summary_part2.txt", "summary_part3.txt"]
    table = steps()
    assert f"passed {len(table)}, failed 0, timed out 0; 0 capture or compile fallbacks;" in result.stdout
    for part in ("1", "2", "3"):
        names = [name for p, name, _ in table if p == part]
        assert summary(out / f"summary_part{part}.txt") == {name: ("passed", "rc=0") for name in names}
        with tarfile.open(out / f"gpu_check_part{part}.tar.gz") as archive:
            members = {m.name: m for m in archive.getmembers()}
            for name in names:
                assert f"part{part}/logs/{name}.log" in members, name
                if name not in REPORTS:
                    continue
                stems = [Path(m).stem for m in members if m.startswith(f"part{part}/results/")
                         and re.fullmatch(REPORTS[name], Path(m).stem)]
                assert len(stems) == 2, (name, stems)  # its .json and its .md
                report = json.load(archive.extractfile(f"part{part}/results/{stems[0]}.json"))
                assert report["complete"] is True and report["device"] == "cpu", name
                assert archive.extractfile(f"part{part}/results/{stems[0]}.md").read().startswith(b"# ")
    assert {p.name: p.stat().st_mtime_ns for p in results.iterdir()} == before  # reports went to a scratch folder
