"""A short soak through a real ComfyUI server (`make soak` runs the long one, 300 generations, and writes
bench/results): 24 generations mixing AR, LANTERN++, static-tree and coupled-SJD runs, with random Cancels
(in every mode) and /free calls, on a schedule chosen so that a short soak still has them all: SHORT below
plans 6 Cancels, 5 /free calls and 5 repeated (mode, seed, class) runs that must re-execute. Every run that
was not cancelled succeeds, images repeat byte for byte whenever (mode, seed, class) repeats, the server's
RSS after warm-up grows by less than 5 %, and the pack's code writes only under ComfyUI's
models/user/output/temp folders (an audit hook in the server logs every write the pack makes; nothing under
the pack's own folder)."""
from __future__ import annotations

import pytest

from conftest import free_port
from soak import SoakConfig, audited_server, run_soak

# The schedule's seed and rates: 8 warm-up runs, then 16 with 6 planned Cancels (ar, lantern_pp, static_tree and
# sjd_coupled runs), 5 /free calls (the warm-up's included) and 5 repeats not served from ComfyUI's cache.
SHORT = SoakConfig(runs=24, seed=10, cancel_rate=0.3, free_rate=0.2)


@pytest.fixture(scope="module")
def soaked(tmp_path_factory):
    server, audit_log = audited_server(tmp_path_factory.mktemp("soak_base"), free_port())
    with server:
        report = run_soak(server, SHORT, audit_log)
    print(f"\nsoak: {report.runs} runs, {report.succeeded} ok, {report.cancelled} cancelled, {report.frees} /free, "
          f"{report.repeats} repeats ({report.repeats_executed} re-executed), RSS {report.rss_warm_mb:.0f} -> "
          f"{report.rss_end_mb:.0f} MB ({100 * report.rss_growth:+.2f} %), {report.writes} audited writes")
    return report


def test_the_short_soak(soaked):
    """One test over the one soak (xdist would otherwise run the module's soak once per worker): every run not
    cancelled succeeds, repeated seeds give identical images, the server's memory is flat after warm-up, and the
    pack writes only under ComfyUI's data folders."""
    assert soaked.runs == SHORT.runs and soaked.frees >= 4 and soaked.cancels_sent >= 4
    assert not soaked.failed and not soaked.errors_by_kind, (soaked.failed, soaked.errors_by_kind)
    assert soaked.succeeded + soaked.cancelled == soaked.runs and soaked.cancelled >= 2
    assert soaked.repeats_executed >= 3  # re-executed after other workflows, /free and cancels in between
    assert not soaked.mismatches, ("repeated seeds gave other images", soaked.mismatches)
    assert soaked.rss_growth < 0.05, ("server memory grew after warm-up", soaked.rss_mb)
    assert soaked.writes >= 1  # the audit sees the pack's writes (the neighbour cache under models/lantern)
    assert not soaked.writes_outside, ("writes outside ComfyUI's data folders", soaked.writes_outside)
