"""What a CUDA graph capture refuses, checked on fake "cuda" tensors (`tests/fake_cuda.py`): every decoder's
captured steps (AR; each tree and Jacobi mode) on c2i, GQA, int8, fp8 and end-of-row (Lumina) targets, in
the layout of compile "graphs" (one graph per window band) and of "auto" (one whole-cache variant), make no
host sync, touch no CPU tensor (no host-to-device copy, no CPU-made index or value) and draw no random
number. The CPU counters (`test_sync_free_steps`) cannot see the CPU-tensor rule: on the CPU every tensor is
a CPU tensor."""
from __future__ import annotations

import copy

import pytest
import torch

from fake_cuda import CaptureAudit, Finding, audit_captured_steps, fake_cuda_model
from lantern_core.conditioning import Condition
from lantern_core.decoding.generate import generate
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.loading.families import load_prompted
from lantern_core.models.quantized import SCHEMES, quantize_blocks
from test_jacobi_step import MODES as JACOBI_1D, TWO_D
from test_tree_step import MODES as TREE_MODES, SAMPLED, WIDE_C2I
from tiny_families import save_chameleon_folder, save_chameleon_vqgan
from tiny_models import TINY_GQA, TINY_T2I, random_drafter, random_gpt

JACOBI_MODES = {**JACOBI_1D, **TWO_D}
TARGETS = {
    "c2i": lambda: random_gpt(WIDE_C2I, seed=7),
    "gqa": lambda: random_gpt(TINY_GQA, seed=2),
    "int8": lambda: quantize_blocks(random_gpt(WIDE_C2I, seed=7), SCHEMES["int8"]),
    "fp8": lambda: quantize_blocks(random_gpt(WIDE_C2I, seed=7), SCHEMES["fp8"]),
}


def neighbour_table(vocab: int) -> torch.Tensor:
    return torch.stack([torch.roll(torch.arange(vocab), -i) for i in range(1, 9)], 1)  # (V, 8)


def assert_clean(report) -> None:
    assert report.variants >= 1 and report.ops > 50, (report.variants, report.ops)
    assert not report.findings, sorted({(f.kind, f.op, f.where) for f in report.findings})


@pytest.mark.parametrize("inductor", [False, True], ids=["graphs", "auto"])
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_ar_steps_follow_the_capture_rules(monkeypatch, target, inductor):
    model, mode = fake_cuda_model(TARGETS[target])
    condition, generators = Condition.classes([1, 4]), make_generators(0, 2)
    assert_clean(audit_captured_steps(monkeypatch, mode, lambda: generate(model, condition, SAMPLED, generators),
                                      inductor))


@pytest.mark.parametrize("inductor", [False, True], ids=["graphs", "auto"])
@pytest.mark.parametrize("name", sorted(TREE_MODES))
def test_tree_iterations_follow_the_capture_rules(monkeypatch, name, inductor):
    spec, sampling, k = TREE_MODES[name]
    model, mode = fake_cuda_model(TARGETS["c2i"])
    drafter, _ = fake_cuda_model(lambda: random_drafter(random_gpt(WIDE_C2I, seed=7), seed=3))
    table = neighbour_table(WIDE_C2I.vocab_size) if k else None
    condition, generators = Condition.classes([1, 3]), make_generators(0, 2)
    report = audit_captured_steps(monkeypatch, mode, lambda: speculative_generate(
        model, drafter, condition, sampling, spec, generators, table), inductor)
    assert_clean(report)


@pytest.mark.parametrize("inductor", [False, True], ids=["graphs", "auto"])
@pytest.mark.parametrize("name", sorted(JACOBI_MODES))
def test_jacobi_iterations_follow_the_capture_rules(monkeypatch, name, inductor):
    config, sampling, needs = JACOBI_MODES[name]
    model, mode = fake_cuda_model(TARGETS["c2i"])
    table = neighbour_table(WIDE_C2I.vocab_size) if needs else None
    condition, generators = Condition.classes([1, 3]), make_generators(0, 2)
    assert_clean(audit_captured_steps(monkeypatch, mode, lambda: jacobi_generate(
        model, condition, sampling, config, generators, table), inductor))


@pytest.fixture(scope="module")
def lumina(tmp_path_factory):
    """A tiny Lumina-mGPT (end-of-row layout: a forced row-end token after every row of codes)."""
    folder = tmp_path_factory.mktemp("tiny-lumina")
    save_chameleon_folder(folder, seed=12, lumina=True)
    save_chameleon_vqgan(folder / "vqgan.ckpt")
    loaded = load_prompted(folder, grid_size=4, max_prompt_tokens=48)
    return loaded.model, loaded.encoder.encode(["a red cat", "the sky"])


@pytest.mark.parametrize("mode_name", ["ar", "coupled", "relaxed_2d_coupled"])
def test_end_of_row_steps_follow_the_capture_rules(monkeypatch, lumina, mode_name):
    target, condition = lumina
    model, mode = fake_cuda_model(lambda: copy.deepcopy(target))
    generators = make_generators(0, 2)
    if mode_name == "ar":
        decode = lambda: generate(model, condition, SAMPLED, generators)  # noqa: E731
    else:
        config, sampling, _ = JACOBI_MODES[mode_name]
        decode = lambda: jacobi_generate(model, condition, sampling, config, generators)  # noqa: E731
    assert_clean(audit_captured_steps(monkeypatch, mode, decode))


def test_random_initialisation_draws_on_the_model_device():
    """A t2i model's unconditional caption is drawn where the model lives (a CPU draw copied over would fail
    with a CUDA generator and copies the buffer)."""
    model, mode = fake_cuda_model(lambda: random_gpt(TINY_T2I))
    with mode, CaptureAudit() as audit:
        model.init_weights()
    assert audit.ops > 10 and not [f for f in audit.findings if f.kind == "cpu tensor"], audit.findings


def test_the_audit_catches_each_broken_rule():
    """The check can fail: a Python scalar written through an index (its value is a CPU tensor copied to the
    device), a CPU-made index, a host read and a random draw are each flagged; a constant filled into a slice
    (read on the host, no copy) is not."""
    _, mode = fake_cuda_model(lambda: torch.nn.Linear(2, 2))
    with mode:
        ancestry = torch.zeros(2, 3, 3, dtype=torch.bool, device="cuda")
        ranks = torch.arange(3, device="cuda")
        with CaptureAudit() as audit:
            ancestry[:, ranks, ranks] = True
        assert Finding("cpu tensor", "index_put_") in audit.findings
        with CaptureAudit() as audit:
            ancestry[:, 0] = False  # a constant read on the host by fill_: legal
        assert not audit.findings
        with CaptureAudit() as audit:
            ancestry.index_select(1, torch.arange(2).to("cuda"))  # a CPU-made index
        assert Finding("cpu tensor", "arange") in audit.findings
        with CaptureAudit() as audit:
            torch.rand(3, device="cuda")
        assert [f.kind for f in audit.findings] == ["random op"]
        with CaptureAudit() as audit, pytest.raises(Exception):
            ancestry.any().item()  # a fake tensor has no value: the read is flagged, then refused
        assert Finding("host sync", "_local_scalar_dense") in audit.findings
