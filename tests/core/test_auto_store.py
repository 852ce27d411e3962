"""`auto` tree and window choices survive a restart: a second process with the same store, machine, weights
and settings makes the same choices without calibrating; another batch size (another key) measures again;
a corrupted store is ignored and rebuilt; without a store nothing is written."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from lantern_core.decoding import auto_store

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, sys
sys.path[:0] = [{root!r}, {tests!r}]
import torch
import lantern_core.decoding.jacobi.auto as jacobi_auto
import lantern_core.decoding.trees.auto as tree_auto
from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.decoding import auto_store
from lantern_core.decoding import JacobiConfig, SpeculativeConfig, jacobi_generate, speculative_generate
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.specs import chain_tree
from tiny_models import TINY_C2I, random_drafter, random_gpt

calls = []
for module, name in ((tree_auto, "measure_costs"), (jacobi_auto, "target_costs")):
    real = getattr(module, name)
    setattr(module, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
auto_store.use_store({store!r})
model = random_gpt(TINY_C2I, seed=2)
drafter = random_drafter(model)
batch = {batch}
condition = Condition.classes(list(range(batch)))
sampling = SamplingConfig(cfg_scale=2.0)
with torch.no_grad():
    tree = speculative_generate(model, drafter, condition, sampling, SpeculativeConfig(tree="auto", static_tree=chain_tree(3)),
                                make_generators(0, batch), compile="off")
    window = jacobi_generate(model, condition, sampling, JacobiConfig("auto", coupled=True, max_window=6),
                             make_generators(0, batch), compile="off")
print(json.dumps({{"tree": tree.stats.tree, "window": window.stats.tree, "calls": calls,
                   "tokens": tree.tokens.tolist() + window.tokens.tolist()}}))
"""


def run(store: Path, batch: int = 1) -> dict:
    code = SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests"), store=str(store), batch=batch)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_reuses_the_choices_without_calibrating(tmp_path):
    store = tmp_path / "choices.json"
    first = run(store)
    assert "calibrated in this run" in first["tree"] and set(first["calls"]) == {"measure_costs", "target_costs"}
    assert len(json.loads(store.read_text())) == 2  # one tree, one window
    second = run(store)
    assert second["calls"] == [] and "measured in an earlier run" in second["tree"]
    assert second["tree"].split(" ")[0] == first["tree"].split(" ")[0] and second["window"] == first["window"]
    assert second["tokens"] == first["tokens"]  # same choice, same seed: the same images
    other = run(store, batch=2)  # another key: the batch size changes the rows the cost curve is measured at
    assert "calibrated in this run" in other["tree"] and len(json.loads(store.read_text())) == 4


def test_a_corrupted_store_is_ignored_and_rebuilt(tmp_path):
    store = tmp_path / "choices.json"
    store.write_text('{"half": {"value": ')
    result = run(store)
    assert "calibrated in this run" in result["tree"]
    assert len(json.loads(store.read_text())) == 2  # valid again, with both choices


def test_entries_round_trip_and_no_store_writes_nothing(tmp_path):
    auto_store.use_store(None)
    try:
        auto_store.remember("k", {"window": 4}, "test")
        assert auto_store.recall("k") is None
        auto_store.use_store(tmp_path / "s.json")
        assert auto_store.recall("k") is None
        auto_store.remember("k", {"window": 4}, "test")
        assert auto_store.recall("k") == {"window": 4}
        (tmp_path / "s.json").write_text(json.dumps({"k": "not an entry"}))
        assert auto_store.recall("k") is None
        assert auto_store.device_name(torch.device("cpu")).startswith("cpu")
        auto_store.forget_all()
        assert not (tmp_path / "s.json").exists()
    finally:
        auto_store.use_store(None)
