"""The speculative benchmark's code path (not its speed) on two images per row: every row is filled,
AR rows report one forward per token, exact modes keep the AR class accuracy range, and the report
renders; plus the quality helpers on hand-made inputs. One row per row kind (AR, an `auto` drafter tree, a
Jacobi window); the AR noise floor, a dynamic drafter tree with a relaxation and relaxed Jacobi rows are the
batched benchmark's test's (tests/core/test_bench_batched.py, the same `Method` / `summarise` code), every row at
128 images is `make bench`'s."""
import numpy as np
import torch

from lantern_core.benchmarks import speculative as bs
from lantern_core.config import SamplingConfig


def test_frechet_and_token_tvd_helpers():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(400, 3))
    assert bs.frechet(a, a) < 1e-6
    assert abs(bs.frechet(a, a + 2.0) - 12.0) < 1e-6  # a mean shift of 2 in 3 dims
    x = torch.tensor([[0, 1], [0, 1]])
    assert bs.marginal_tvd(x, x, 3) == 0.0
    assert bs.marginal_tvd(x, torch.tensor([[2, 1], [2, 1]]), 3) == 0.5  # position 0 differs, position 1 agrees


def test_rows_and_report_on_two_images(monkeypatch):
    chosen = [m for m in bs.methods() if m.name in ("ar", "static_tree (auto)", "sjd_coupled")]
    monkeypatch.setattr(bs, "methods", lambda: chosen)
    report = bs.run(images=2, round_size=2, sampling=SamplingConfig(cfg_scale=3.0), device=torch.device("cpu"),
                    dtype=torch.float32)
    rows = {r["method"]: r for r in report["rows"]}
    assert set(rows) == {m.name for m in chosen}
    assert rows["ar"]["forward_passes_per_image"] == 256 and rows["ar"]["mean_accepted_length"] == 1.0
    assert rows["ar"]["speedup_vs_ar"] == 1.0 and rows["ar"]["token_tvd_vs_ar"] == 0.0
    assert rows["static_tree (auto)"]["tree"].startswith("auto_")
    for r in rows.values():
        assert r["images"] == 2 and r["s_per_image"] > 0 and 0 <= r["classifier_accuracy"] <= 1
        assert (r["graphs"], r["compiled"], r["fell_back"]) == ("off", "off", False)  # eager by choice on a CPU
        assert r["frechet_vs_real"] >= 0
    assert rows["static_tree (auto)"]["mean_accepted_length"] > 1.0
    # the training-free row: a window, no drafter
    assert rows["sjd_coupled"]["tree"].startswith("window ") and rows["sjd_coupled"]["mean_accepted_length"] > 1.0
    report.update(model="m", device="cpu", dtype="float32", torch="t", threads=2, images=2,
                  sampling={"cfg_scale": 3.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}, machine="x", date="d",
                  cost_curve={"verify_ms": [(1, 2.0), (4, 3.0)], "draft_ms": 0.7})
    text = bs.markdown(report)
    assert "| static_tree (auto) | auto_" in text and "| sjd_coupled | window " in text and "| 4 | 3.00 | 1.50x |" in text
    assert text.count(" | off | off |") == 3  # every row's graphs and compiled cells
