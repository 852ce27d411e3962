"""Fuzzing every weights loader (hypothesis): small valid files (GPT .pt / .safetensors, VQ, drafter folder,
Anole and Janus-Pro folders, Chameleon's vqgan.ckpt) are mutated byte by byte (flips, overwrites,
truncations, insertions, spliced copies) and their config.json value by value (values replaced by other
JSON values, huge or negative numbers, keys deleted), then loaded. The only exceptions allowed are the
pack's own (`LanternError`: a message naming the file and the fix); a mutation that still loads must give
finite weights. Examples per loader: `LANTERN_FUZZ_EXAMPLES` (default 150; `make soak` runs more and writes
the counts to bench/results/fuzz_loaders.json). The generator is derandomised: the same cases every run."""
from __future__ import annotations

import collections
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lantern_core.errors import LanternError
from tests.loader_cases import LOADER_CASES, build_all

EXAMPLES = int(os.environ.get("LANTERN_FUZZ_EXAMPLES", "150"))
REPORT = os.environ.get("LANTERN_FUZZ_REPORT")  # a JSON file to write the counts to (make soak)
OUTCOMES: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    yield build_all(tmp_path_factory.mktemp("fuzz_seeds"))
    if REPORT:
        Path(REPORT).parent.mkdir(parents=True, exist_ok=True)
        Path(REPORT).write_text(json.dumps({k: dict(v) for k, v in sorted(OUTCOMES.items())}, indent=2))


# A byte edit: (kind, position as a fraction of the file, length, payload)
EDIT = st.tuples(st.sampled_from(["flip", "overwrite", "truncate", "insert", "splice", "zero"]),
                 st.floats(0.0, 1.0), st.integers(1, 64), st.binary(min_size=1, max_size=64))
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.sampled_from([0, -1, 1, 2, 10**9, 10**18])
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
CONFIG_EDIT = st.tuples(st.integers(0, 10**6), st.sampled_from(["replace", "delete"]), JSON_VALUE)


def mutate_bytes(path: Path, edits: list) -> None:
    data = bytearray(path.read_bytes())
    for kind, where, length, payload in edits:
        at = min(int(where * len(data)), max(len(data) - 1, 0))
        if kind == "flip" and data:
            data[at] ^= 1 << (length % 8)
        elif kind == "overwrite":
            data[at:at + len(payload)] = payload
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = payload
        elif kind == "splice":  # a chunk copied from elsewhere in the file
            data[at:at + length] = data[(at * 7 + 13) % max(len(data), 1):][:length]
        elif kind == "zero":
            data[at:at + length] = bytes(len(data[at:at + length]))
    path.write_bytes(bytes(data))


def _paths(obj, prefix=()):
    """Every (key path) of a JSON document's dict entries and list items."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        yield prefix + (key,)
        yield from _paths(value, prefix + (key,))


def mutate_config(path: Path, edits: list) -> None:
    doc = json.loads(path.read_text())
    for index, kind, value in edits:
        paths = list(_paths(doc))
        if not paths:
            break
        *parents, last = paths[index % len(paths)]
        holder = doc
        for key in parents:
            holder = holder[key]
        if kind == "delete" and isinstance(holder, dict):
            del holder[last]
        else:
            holder[last] = value
    path.write_text(json.dumps(doc))


def weight_file(root: Path, case) -> Path:
    return root / case.weights if case.weights else root


def run_case(loader: str, valid: dict[str, Path], target: str, edits: list) -> None:
    case = LOADER_CASES[loader]
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        original = valid[loader]
        copy = Path(tmp) / original.name
        (shutil.copytree if original.is_dir() else shutil.copy)(original, copy)
        if target == "config":
            mutate_config(copy / "config.json", edits)
        else:
            mutate_bytes(weight_file(copy, case), edits)
        try:
            loaded = case.load(copy)
        except LanternError as exc:
            OUTCOMES[loader][f"refused: {type(exc).__name__}"] += 1
            assert "Fix:" in str(exc) or "expected" in str(exc), str(exc)
            return
        OUTCOMES[loader]["loaded"] += 1
        module = getattr(loaded, "model", loaded)
        bad = [k for k, v in module.state_dict().items() if v.is_floating_point() and not torch.isfinite(v).all()]
        assert not bad, f"{loader}: a mutated file loaded with non-finite weights {bad[:3]}"


FUZZ_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


FOLDER_LOADERS = [name for name, case in LOADER_CASES.items() if case.weights]
TARGETS = [(name, "weights") for name in LOADER_CASES] + [(name, "config") for name in FOLDER_LOADERS]
EDITS = {"weights": st.lists(EDIT, min_size=1, max_size=4), "config": st.lists(CONFIG_EDIT, min_size=1, max_size=3)}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch on mutated pickles
@pytest.mark.parametrize("loader,target", TARGETS, ids=[f"{n}-{t}" for n, t in TARGETS])
def test_mutated_files_give_only_our_errors(valid, loader, target):
    """Mutated weights (every loader) or config.json (every folder loader): our errors or finite weights."""
    @FUZZ_SETTINGS
    @given(EDITS[target])
    def fuzz(edits):
        run_case(loader, valid, target, edits)

    before = sum(OUTCOMES[loader].values())
    fuzz()
    assert sum(OUTCOMES[loader].values()) - before >= EXAMPLES // 2  # the cases really ran


def test_the_fuzzer_mutates(tmp_path):
    """The mutators change what they are given (a no-op fuzzer would pass every test above)."""
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(200)))
    mutate_bytes(path, [("flip", 0.5, 3, b"x")])
    assert path.read_bytes() != bytes(range(200)) and len(path.read_bytes()) == 200
    mutate_bytes(path, [("truncate", 0.25, 1, b"x")])
    assert len(path.read_bytes()) == 50
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"a": 1, "b": {"c": 2}}))
    mutate_config(cfg, [(2, "replace", "x")])
    assert json.loads(cfg.read_text()) == {"a": 1, "b": {"c": "x"}}
