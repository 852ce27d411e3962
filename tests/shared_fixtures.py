"""Guard for session-scoped fixtures: a digest of a module's tensors and flags, taken when the fixture is
built and compared after every test that used it, so a test that changes a shared tiny model fails by name
(and the model is put back from a pristine copy, so later tests are not poisoned).

It does not guard plain Python objects; session fixtures that are not `torch.nn.Module`s must be immutable.
"""
from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass

import torch


def module_digest(module: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, device, bytes, requires_grad) and every
    submodule's training flag."""
    h = hashlib.sha256()
    for kind, named in (("p", module.named_parameters()), ("b", module.named_buffers())):
        for name, tensor in named:
            h.update(f"{kind}:{name}:{tensor.dtype}:{tuple(tensor.shape)}:{tensor.device}:"
                     f"{tensor.requires_grad}".encode())
            flat = tensor.detach().cpu().contiguous().reshape(-1)  # (numel,)
            h.update(flat.view(torch.uint8).numpy().tobytes())
    h.update(",".join(f"{n}={m.training}" for n, m in module.named_modules()).encode())
    return h.hexdigest()


GUARDED: dict = {}  # fixture name -> GuardedModule, filled by tests/conftest.py's session fixtures


class SharedFixtureMutated(AssertionError):
    pass


@dataclass
class GuardedModule:
    """A session fixture's module with its digest and a pristine copy to restore from."""
    name: str
    module: torch.nn.Module
    digest: str
    pristine: torch.nn.Module

    @classmethod
    def of(cls, name: str, module: torch.nn.Module) -> "GuardedModule":
        return cls(name, module, module_digest(module), copy.deepcopy(module))

    def restore(self) -> None:
        """Put back the built tensors (values, dtype, device) and train/eval flags from the pristine copy."""
        ref_params, ref_buffers = dict(self.pristine.named_parameters()), dict(self.pristine.named_buffers())
        for name, param in self.module.named_parameters():
            if name in ref_params:
                param.data = ref_params[name].detach().clone()
                param.requires_grad_(ref_params[name].requires_grad)
        for prefix, mod in self.module.named_modules():
            for name, buffer in list(mod._buffers.items()):
                full = f"{prefix}.{name}" if prefix else name
                if buffer is not None and full in ref_buffers:
                    mod._buffers[name] = ref_buffers[full].clone()
        for (_, mod), (_, ref) in zip(self.module.named_modules(), self.pristine.named_modules()):
            mod.training = ref.training

    def check_and_restore(self) -> None:
        """Raise SharedFixtureMutated naming the fixture if the module changed; put it back first."""
        if module_digest(self.module) == self.digest:
            return
        self.restore()
        restored = module_digest(self.module) == self.digest
        raise SharedFixtureMutated(
            f"this test changed the session-scoped fixture `{self.name}` (its weights, dtype, buffers or "
            f"train/eval flags); shared fixtures are read-only: take `copy.deepcopy({self.name})` in the test "
            f"before changing it. " + ("The fixture was restored." if restored else
                                      "It could not be restored: later tests using it may fail."))
