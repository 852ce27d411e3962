"""Write bench/results/test_durations.md from pytest's JUnit XML: the suite's wall time, the 30 slowest tests and
the time per test file, for the run given and (optionally) a committed earlier run beside it.

`make test` writes .test-results/junit.xml; after a change that adds or moves tests, refresh the table with

    .venv/bin/python tests/host/durations.py .test-results/junit.xml --label "after <change>"

The earlier run is kept as JSON (bench/results/test_durations.json, section `baseline`) so the table can be
rebuilt without its XML. Times per file add up the tests' own times: with several workers they exceed the
wall time, which is reported separately from the XML's suite time.
"""
from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
SLOWEST = 30


def read_junit(path: Path) -> dict:
    """{'wall_s', 'tests': {test id: seconds}, 'outcomes': {passed, skipped, failed}} from one JUnit XML file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests: dict[str, float] = {}
    outcomes = {"passed": 0, "skipped": 0, "failed": 0}
    wall = 0.0
    for suite in suites:
        wall += float(suite.get("time", 0.0))
        for case in suite.iter("testcase"):
            module = case.get("classname", "").replace(".", "/")
            name = f"{module}.py::{case.get('name')}"
            tests[name] = tests.get(name, 0.0) + float(case.get("time", 0.0))
            if case.find("skipped") is not None:
                outcomes["skipped"] += 1
            elif case.find("failure") is not None or case.find("error") is not None:
                outcomes["failed"] += 1
            else:
                outcomes["passed"] += 1
    return {"wall_s": round(wall, 1), "tests": tests, "outcomes": outcomes}


def per_file(tests: dict[str, float]) -> dict[str, float]:
    files: dict[str, float] = defaultdict(float)
    for name, seconds in tests.items():
        files[name.split("::")[0]] += seconds
    return dict(files)


def section(label: str, run: dict) -> list[str]:
    tests, outcomes = run["tests"], run["outcomes"]
    lines = [f"## {label}", "",
             f"{outcomes['passed']} passed, {outcomes['skipped']} skipped, {outcomes['failed']} failed; "
             f"wall time {run['wall_s']:.0f} s ({run['wall_s'] / 60:.1f} min), "
             f"sum of test times {sum(tests.values()):.0f} s; {run.get('how', '')}", "",
             f"### {SLOWEST} slowest tests", "", "| s | test |", "|---:|---|"]
    for name, seconds in sorted(tests.items(), key=lambda kv: -kv[1])[:SLOWEST]:
        lines.append(f"| {seconds:.1f} | `{name}` |")
    lines += ["", "### Time per test file", "", "| s | tests | file |", "|---:|---:|---|"]
    counts: dict[str, int] = defaultdict(int)
    for name in tests:
        counts[name.split("::")[0]] += 1
    for name, seconds in sorted(per_file(tests).items(), key=lambda kv: -kv[1]):
        lines.append(f"| {seconds:.1f} | {counts[name]} | `{name}` |")
    return lines + [""]


def comparison(before: dict, after: dict) -> list[str]:
    """Both runs side by side: totals, then every file's summed test time (files of either run)."""
    old, new = per_file(before["tests"]), per_file(after["tests"])
    lines = ["## Before and after", "", "| | before | after | after / before |", "|---|---:|---:|---:|",
             f"| wall time, s | {before['wall_s']:.0f} | {after['wall_s']:.0f} | "
             f"{after['wall_s'] / max(before['wall_s'], 1e-9):.2f} |",
             f"| sum of test times, s | {sum(before['tests'].values()):.0f} | {sum(after['tests'].values()):.0f} | "
             f"{sum(after['tests'].values()) / max(sum(before['tests'].values()), 1e-9):.2f} |",
             f"| tests | {len(before['tests'])} | {len(after['tests'])} | |", "",
             "| before, s | after, s | file |", "|---:|---:|---|"]
    for name in sorted(set(old) | set(new), key=lambda n: -max(old.get(n, 0.0), new.get(n, 0.0))):
        cell = lambda d: f"{d[name]:.1f}" if name in d else "-"  # noqa: E731
        lines.append(f"| {cell(old)} | {cell(new)} | `{name}` |")
    return lines + [""]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, help="pytest --junitxml output of the run to report")
    parser.add_argument("--label", default="this run", help="heading for the run")
    parser.add_argument("--how", default="", help="how the run was made (machine, command)")
    parser.add_argument("--as-baseline", action="store_true", help="store this run as the baseline")
    parser.add_argument("--out", type=Path, default=RESULTS / "test_durations.md")
    args = parser.parse_args(argv)
    store = args.out.with_suffix(".json")
    saved = json.loads(store.read_text()) if store.is_file() else {}
    run = {**read_junit(args.junit), "label": args.label, "how": args.how}
    saved["baseline" if args.as_baseline else "latest"] = run
    store.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
    lines = ["# Test suite durations", "",
             "Written by `tests/host/durations.py` from `make test`'s JUnit XML (`.test-results/junit.xml`). "
             "Refresh it in any change that adds tests.", ""]
    if "latest" in saved and "baseline" in saved:
        lines += comparison(saved["baseline"], saved["latest"])
    for key in ("latest", "baseline"):
        if key in saved:
            lines += section(saved[key]["label"], saved[key])
    args.out.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
