"""tests/host/durations.py: the JUnit XML of `make test` (one process or xdist workers) becomes the
test_durations table: outcomes, the slowest tests, time per file, and before/after side by side."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "host"))
import durations  # noqa: E402

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1"
skipped="1" tests="4" time="{wall}">
<testcase classname="tests.core.test_a" name="test_one[x-1]" time="{a}"/>
<testcase classname="tests.core.test_a" name="test_two" time="1.5"><skipped message="no GPU"/></testcase>
<testcase classname="tests.nodes.test_b" name="test_three" time="2.0"><failure message="boom"/></testcase>
<testcase classname="tests.nodes.test_b" name="test_four" time="0.5"><error message="teardown"/></testcase>
</testsuite></testsuites>"""


def write(tmp_path: Path, name: str, wall: float, a: float) -> Path:
    path = tmp_path / name
    path.write_text(XML.format(wall=wall, a=a))
    return path


def test_outcomes_files_and_slowest_are_read_from_the_xml(tmp_path):
    run = durations.read_junit(write(tmp_path, "a.xml", 9.0, 4.0))
    assert run["wall_s"] == 9.0 and run["outcomes"] == {"passed": 1, "skipped": 1, "failed": 2}
    assert run["tests"]["tests/core/test_a.py::test_one[x-1]"] == 4.0
    assert durations.per_file(run["tests"]) == {"tests/core/test_a.py": 5.5, "tests/nodes/test_b.py": 2.5}


def test_the_table_puts_before_and_after_side_by_side(tmp_path):
    out = tmp_path / "test_durations.md"
    durations.main([str(write(tmp_path, "before.xml", 100.0, 90.0)), "--as-baseline", "--label", "before",
                    "--out", str(out)])
    assert "## Before and after" not in out.read_text()
    durations.main([str(write(tmp_path, "after.xml", 40.0, 30.0)), "--label", "after", "--out", str(out)])
    text = out.read_text()
    assert "| wall time, s | 100 | 40 | 0.40 |" in text
    assert "| 91.5 | 31.5 | `tests/core/test_a.py` |" in text
    assert text.index("## after") < text.index("## before")
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["baseline"]["label"] == "before" and saved["latest"]["wall_s"] == 40.0
