"""The benchmark code paths (not their speed): AR vs bare forward rows, the verify-n cost curve and the
report, on a tiny model in bf16 (the dtype the CUDA variant uses)."""
import torch

from lantern_core.benchmarks import ar as bench
from lantern_core.benchmarks.report_writer import Report
from tiny_models import TINY_C2I


def test_bench_rows_and_report_on_a_tiny_bf16_model():
    model = bench.random_model(TINY_C2I, "cpu", torch.bfloat16)
    assert model.tok_embeddings.weight.dtype == torch.bfloat16 and model.rope_table.dtype == torch.float32
    row = bench.bench_ar(model, "tiny", batch=2, cfg_scale=4.0, repeats=1)
    assert row.rows == 4 and row.tokens == 16 and row.gen_ms_per_step > 0 and row.bare_ms_per_step > 0
    assert (row.graphs, row.compiled, row.fell_back) == ("off", "off", False)  # nothing captures on a CPU
    curve = bench.bench_verify(model, "tiny", rows=2, repeats=1)
    # a 4x4 grid at mid-image leaves room for 8 more tokens: larger windows are skipped, not overrun
    assert [r.n_tokens for r in curve] == [1, 4, 8] and curve[0].relative_to_n1 == 1.0
    from dataclasses import asdict

    report = {"device": "cpu", "dtype": "bfloat16", "torch": torch.__version__, "threads": 1, "cfg_scale": 4.0,
              "machine": "test", "date": "today", "ar": [asdict(row)], "verify": [asdict(r) for r in curve]}
    text = bench.markdown(report)
    assert "| tiny | 2 | 4 | 16 |" in text and "Worst overhead" in text and text.count("| off | off |") == 1
    assert set(bench.PROFILES) == {"cpu", "cuda", "smoke"}
    xl = [(label, batches) for label, _, batches, _, _ in bench.profile_models("cuda", skip=(("GPT-XL", 1),))]
    assert ("GPT-XL c2i 384px (random)", (4,)) in xl and ("embedded", (1, 4)) in xl  # the GPU check's ar-rest
    assert bench.skip_pair("GPT-XL:1") == ("GPT-XL", 1)


def test_iteration_cost_times_every_mode_next_to_an_ar_step():
    from lantern_core.benchmarks.iteration_cost import CostPlan, markdown, modes, run
    from lantern_core.config import GPTConfig

    config = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=48, model_type="c2i", num_classes=5,
                       cls_token_num=1, grid_size=6)
    report = run(config, "tiny", torch.device("cpu"), torch.float32, k=4, plan=CostPlan(iterations=8))
    rows = report["rows"]
    assert [r["mode"] for r in rows] == ["ar (one step)"] + [name for name, _ in modes(4)]
    assert all(not r["error"] and r["iterations"] == 8 and r["ms_per_iteration"] > 0 for r in rows), rows
    assert rows[0]["vs_ar_step"] == 1.0 and rows[0]["auto_vs_ar_step"] == 1.0
    # nothing is captured on a CPU: graphs, off and auto are the same eager run, and no row claims graphs
    assert all(r["eager_ms_per_iteration"] == r["ms_per_iteration"] == r["auto_ms_per_iteration"] for r in rows)
    assert all((r["graphs"], r["compiled"], r["fell_back"]) == ("off", "off", False) for r in rows)
    report.update(bench.machine_info(torch.device("cpu")), dtype="float32")
    text = markdown(report)
    assert all(r["mode"] in text for r in rows) and "failed" not in text


def test_prefix_states_bench_times_both_conventions_on_a_tiny_t2i_model():
    from lantern_core.benchmarks.prefix_states import markdown, run
    from tiny_models import TINY_T2I

    report = run(TINY_T2I, "tiny", torch.device("cpu"), torch.float32, repeats=1, real_tokens=2)
    assert set(report["medians"]) == {"native", "hf_port"} and report["caption_tokens"] == 6
    assert all(m["wall_s"] > 0 and m["prefill_s"] > 0 for m in report["medians"].values())
    assert all((m["graphs"], m["compiled"], m["fell_back"]) == ("off", "off", False)
               for m in report["medians"].values())
    assert report["wall_ratio"] > 0 and "| hf_port |" in markdown(report) and "| off | off |" in markdown(report)


def test_decode_bench_times_both_decodes_on_a_tiny_vq():
    from lantern_core.benchmarks.decode import markdown, time_decoders
    from lantern_core.loading.embedded import EMBEDDED_VQ
    from lantern_core.loading.checkpoints import load_vq

    vq = load_vq(EMBEDDED_VQ).model.eval()
    rows = time_decoders(vq, 16, (1, 3), repeats=1)
    assert [r["batch"] for r in rows] == [1, 3]
    assert all(r["one_by_one_ms_per_image"] > 0 and r["batched_ms_per_image"] > 0 and r["ratio"] > 0 for r in rows)
    report = {"device": "cpu", "dtype": "float32", "machine": "m", "torch": "t", "threads": 1, "date": "d",
              "repeats": 1, "decoders": [{"decoder": "embedded 128 px", "grid": 16, "rows": rows}]}
    assert "| 3 |" in markdown(report) and "embedded 128 px" in markdown(report)


def test_reports_are_rewritten_after_every_row(tmp_path):
    """A benchmark stopped mid-run keeps its rows: the files exist after the first row, `complete` only at the end,
    and no half-written file is left beside them."""
    import json

    from lantern_core.benchmarks.iteration_cost import markdown, run
    from lantern_core.benchmarks.report_writer import Report

    seen = []

    class Recording(Report):
        def save(self) -> None:
            super().save()
            seen.append(len(json.loads((tmp_path / "cost.json").read_text())["rows"]))

    report = Recording(tmp_path, "cost", markdown, **bench.machine_info(torch.device("cpu")), dtype="float32")
    from lantern_core.benchmarks.iteration_cost import CostPlan

    run(TINY_C2I, "tiny", torch.device("cpu"), torch.float32, k=4, plan=CostPlan(iterations=2, only=("sjd (window",)),
        report=report)
    assert seen == [0, 1, 2]  # the header, AR, the one chosen mode
    assert json.loads((tmp_path / "cost.json").read_text())["complete"] is False
    assert "| sjd (window 16) | 2 |" in (tmp_path / "cost.md").read_text()
    report.finish()
    assert json.loads((tmp_path / "cost.json").read_text())["complete"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cost.json", "cost.md"]


def test_quantization_gpu_rows_say_how_their_steps_ran():
    """The GPU quantization benchmark's code path on the CPU (tiny shape, batch 1, fused): one row per format,
    each with its step fields, and the table renders them."""
    from lantern_core.benchmarks import quantization_gpu as qg

    report = Report(None, "quantization", qg.markdown, **bench.machine_info(torch.device("cpu")), model="tiny", rows=[])
    rows = qg.run(bench.TINY_SHAPE, torch.device("cpu"), (1,), ("graphs",), ("fused",), report)
    assert [(r["weights"], r["batch"]) for r in rows] == [(w, 1) for w in qg.WEIGHT_CHOICES]
    assert all(r["ms_per_step"] > 0 and (r["graphs"], r["compiled"], r["fell_back"]) == ("off", "off", False)
               for r in rows)
    assert qg.markdown(report.data).count(" | off | off |") == len(rows)


def test_rule_acceptance_reports_both_exact_rules_for_every_mode(tmp_path):
    """The tiny-model table of tokens per forward under the two exact rules: every mode on every weight set, both
    rules measured, and under the AR-identical rule continuation drafting is the race itself (its row equals sjd's,
    and sjd's equals sjd_coupled's: both race with AR's noise)."""
    import json

    from lantern_core.benchmarks import rule_acceptance

    rule_acceptance.main(["--images", "24", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "rule_acceptance_cpu.json").read_text())
    rows = report["rows"]
    assert report["complete"] is True
    assert len(rows) == len(rule_acceptance.WEIGHTS) * len(rule_acceptance.MODES)
    assert all(1.0 <= r[rule] <= 9.0 for r in rows for rule in rule_acceptance.RULES)
    for weights in rule_acceptance.WEIGHTS:
        by_mode = {r["mode"]: r for r in rows if r["weights"] == weights.name}
        assert by_mode["sjd continuation w3"]["same_as_ar"] == by_mode["sjd w3"]["same_as_ar"]
        assert by_mode["sjd_coupled w3"]["same_as_ar"] == by_mode["sjd w3"]["same_as_ar"]
    assert "| 3x3, 3 codes | static_tree small_branching_6 |" in (tmp_path / "rule_acceptance_cpu.md").read_text()
