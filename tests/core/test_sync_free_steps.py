"""No host read inside a step: every aten op that one AR step, one draft-tree iteration or one Jacobi
iteration dispatches is recorded, and none of them reads a value back to the host (`.item()`, `bool()`,
and ops such as `one_hot`, `nonzero` or `unique` that do it internally) or has a data-dependent output shape.
On a GPU any of these would stall the stream every step and break CUDA-graph capture; here it is checked
on the CPU, in the windowed form a capturing device runs, with early exits off (`static_only`)."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import lantern_core.decoding.generate as generate_module
import lantern_core.decoding.jacobi.batch as jacobi_module
import lantern_core.decoding.trees.batch as speculative_module
from lantern_core.conditioning import Condition
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding import step_graphs
from lantern_core.decoding.step_graphs import static_only
from test_jacobi_step import MODES, TWO_D
from test_tree_step import MODES as TREE_MODES, WIDE_C2I
from tiny_models import random_drafter, random_gpt

JACOBI_MODES = {**MODES, **TWO_D}

HOST_READS = ("_local_scalar_dense", "nonzero", "unique", "masked_select", "bincount", "repeat_interleave.Tensor",
              "aminmax", "is_nonzero", "equal")


class OpRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def recording(step, seen: list[str]):
    """`step` wrapped so that its ops are recorded into `seen`, with early exits off."""
    def wrapped(*args, **kwargs):
        with static_only(), OpRecorder() as recorder:
            step(*args, **kwargs)
        seen.extend(recorder.ops)
    return wrapped


def host_reads(ops: list[str]) -> set[str]:
    return {op for op in ops if any(name in op for name in HOST_READS)}


@pytest.fixture
def windowed(monkeypatch):
    """Decode as a capturing device would (bucketed windows), eagerly."""
    monkeypatch.setattr(step_graphs, "uses_graphs", lambda choice, device: choice == "auto")


@pytest.fixture(scope="module")
def models():
    model = random_gpt(WIDE_C2I, seed=7)
    return model, random_drafter(model, seed=3)


def test_an_ar_step_never_reads_the_host(models, windowed, monkeypatch):
    seen: list[str] = []
    monkeypatch.setattr(generate_module, "ar_step", recording(generate_module.ar_step, seen))
    generate_module.generate(models[0], Condition.classes([2]), TREE_MODES["static_exact"][1], make_generators(0, 1),
                             compile="off")
    assert len(seen) > 100 and not host_reads(seen), host_reads(seen)


@pytest.mark.parametrize("name", ["static_exact", "static_greedy", "eagle2_exact", "eagle2_greedy", "lantern_delta",
                                  "lantern_pp_greedy", "eagle2_delta"])
def test_a_tree_iteration_never_reads_the_host(models, windowed, monkeypatch, name):
    model, drafter = models
    spec, sampling, k = TREE_MODES[name]
    table = torch.stack([torch.roll(torch.arange(WIDE_C2I.vocab_size), -i) for i in range(1, 9)], 1) if k else None
    seen: list[str] = []
    monkeypatch.setattr(speculative_module, "tree_iteration", recording(speculative_module.tree_iteration, seen))
    speculative_generate(model, drafter, Condition.classes([1]), sampling, spec, make_generators(0, 1), table,
                         compile="off")
    assert len(seen) > 100 and not host_reads(seen), host_reads(seen)


@pytest.mark.parametrize("name", sorted(JACOBI_MODES))
def test_a_jacobi_iteration_never_reads_the_host(models, windowed, monkeypatch, name):
    config, sampling, needs = JACOBI_MODES[name]
    table = torch.stack([torch.roll(torch.arange(WIDE_C2I.vocab_size), -i) for i in range(1, 9)], 1) if needs else None
    seen: list[str] = []
    monkeypatch.setattr(jacobi_module, "jacobi_iteration", recording(jacobi_module.jacobi_iteration, seen))
    jacobi_generate(models[0], Condition.classes([1]), sampling, config, make_generators(0, 1), table, compile="off")
    assert len(seen) > 50 and not host_reads(seen), host_reads(seen)


def test_the_recorder_catches_host_reads():
    """The check can fail: a hidden read (one_hot validates its input on the host), a bool() of a tensor and
    a data-dependent shape are each caught."""
    with OpRecorder() as recorder:
        torch.nn.functional.one_hot(torch.tensor([1, 0]), 3)
        bool(torch.ones(2).any())
        torch.arange(3).nonzero()
    assert {"aten._local_scalar_dense.default", "aten.nonzero.default"} <= host_reads(recorder.ops)
