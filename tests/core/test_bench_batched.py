"""The batched benchmark's code path (not its speed) on one round of 4 images at batch 2 and 4 (the smallest run
with the batch-4 goals and two batch sizes to compare within; `make bench` runs 32 images at batch 1, 4 and 8):
every (batch, method) row is filled, AR rows report one forward per token, each batch size is compared with AR at
the same batch, the goals are judged from the batch-4 ratios, and the report renders."""
import torch

from lantern_core.benchmarks import batched as bb
from lantern_core.config import SamplingConfig


def test_rows_goals_and_report_on_one_round(monkeypatch):
    chosen = [m for m in bb.methods(torch.device("cpu")) if m.name in ("ar", "ar (other seeds)", "sjd_coupled",
                                                                        "sjd_relaxed lambda=5", "eagle2")]
    monkeypatch.setattr(bb, "methods", lambda device: chosen)
    # row kinds: AR and its noise floor, a drafter tree (eagle2), exact and relaxed Jacobi (the two CPU goals)
    report = bb.run(images=4, sampling=SamplingConfig(cfg_scale=3.0), device=torch.device("cpu"),
                    dtype=torch.float32, batches=(2, 4), round_size=4)
    rows = {(r["batch"], r["method"]): r for r in report["rows"]}
    assert set(rows) == {(b, m.name) for b in (2, 4) for m in chosen}
    for b in (2, 4):
        ar = rows[(b, "ar")]
        assert ar["forward_passes_per_image"] == 256 and ar["mean_accepted_length"] == 1.0
        assert all(rows[(b, m.name)]["graphs"] == "off" and not rows[(b, m.name)]["fell_back"] for m in chosen)
        assert ar["speedup_vs_ar"] == 1.0
        for name in ("sjd_coupled", "sjd_relaxed lambda=5", "eagle2"):
            r = rows[(b, name)]
            assert r["images"] == 4 and r["mean_accepted_length"] > 1.0
            assert abs(r["speedup_vs_ar"] - r["images_per_s"] / ar["images_per_s"]) < 1e-9  # same-batch AR
    goals = {g["method"]: g for g in report["goals"]}
    assert set(goals) == {"sjd_coupled", "sjd_relaxed lambda=5"}  # the CPU goals
    for name, g in goals.items():
        assert g["measured"] == round(rows[(4, name)]["speedup_vs_ar"], 3) and g["met"] == (g["measured"] > 1.0)
    report.update(model="m", device="cpu", dtype="float32", torch="t", threads=2, images=4,
                  sampling={"cfg_scale": 3.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}, machine="x", date="d")
    text = bb.markdown(report)
    assert "| 2 | sjd_coupled | window " in text and "| sjd_relaxed lambda=5 | > 1x AR at batch 4 |" in text
    assert text.count(" | off | off |") == len(rows)


def test_gpu_goals_cover_every_mode():
    rows = [{"batch": 4, "method": m.name, "speedup_vs_ar": 2.5} for m in bb.methods(torch.device("cuda"))]
    goals = {g["method"]: g for g in bb.goals(rows, torch.device("cuda"))}
    assert set(goals) == set(bb.EXACT) | set(bb.RELAXED) and all(g["met"] for g in goals.values())
    rows = [dict(r, speedup_vs_ar=1.5) for r in rows]
    goals = {g["method"]: g["met"] for g in bb.goals(rows, torch.device("cuda"))}
    assert all(goals[m] for m in bb.EXACT) and not any(goals[m] for m in bb.RELAXED)
