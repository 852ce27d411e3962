"""The guard on session-scoped tiny models (tests/shared_fixtures.py, wired in tests/conftest.py): a test that
changes a shared model in any way the later tests could see is caught by name, and the model is put back."""
from __future__ import annotations

import pytest
import torch

from shared_fixtures import GUARDED, GuardedModule, SharedFixtureMutated, module_digest
from tiny_models import TINY_C2I, random_gpt, random_vq


def change_a_weight(model):
    with torch.no_grad():
        model.layers[1].attention.wqkv.weight[0, 0] += 1e-6


def change_the_dtype(model):
    model.to(torch.bfloat16)


def change_a_flag(model):
    model.train()


def change_a_buffer(model):
    model.rope_table.mul_(2.0)


@pytest.mark.parametrize("mutate", [change_a_weight, change_the_dtype, change_a_flag, change_a_buffer],
                         ids=lambda f: f.__name__)
def test_a_changed_shared_model_is_caught_by_name_and_restored(mutate):
    model = random_gpt(TINY_C2I)
    guard = GuardedModule.of("c2i_model", model)
    guard.check_and_restore()  # unchanged: silent
    mutate(model)
    with pytest.raises(SharedFixtureMutated, match=r"`c2i_model`.*deepcopy.*was restored"):
        guard.check_and_restore()
    assert module_digest(model) == guard.digest and model.tok_embeddings.weight.dtype == torch.float32
    assert not model.training
    guard.check_and_restore()  # restored: silent again


def test_the_session_models_are_shared_and_unchanged(c2i_model, t2i_model, tiny_vq, request):
    """The conftest fixtures are session-scoped (one object for every test) and guarded."""
    for name, value in (("c2i_model", c2i_model), ("t2i_model", t2i_model), ("tiny_vq", tiny_vq)):
        assert GUARDED[name].module is value
        assert request.getfixturevalue(name) is value
        assert module_digest(value) == GUARDED[name].digest
    assert module_digest(tiny_vq) == module_digest(random_vq())  # the build is deterministic
