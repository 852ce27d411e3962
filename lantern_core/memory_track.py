"""Peak bytes of the tensors a piece of code allocates, on any device, the meta device included (the CPU has
no allocator statistics; the meta device allocates nothing, but its tensors have sizes).

`track_allocations()` is a context manager over a `TorchDispatchMode`: every op's output whose storage is new
(not one of its inputs' storages, not a view of one) counts its storage's bytes while any tensor on that
storage is alive (a weak-reference finalizer per tensor); the peak of the live total is the measurement. It
sees what PyTorch allocates through its ops (factories included), not scratch memory inside one kernel nor
what allocators round up. On CUDA, `torch.cuda.max_memory_allocated` is the allocator's own figure. Used by
the run reservation's dry run on the meta device (`decoding/reservation.py`, cheap: no kernel runs) and, on
the CPU, by the tests and benchmarks that hold that reservation to what a real run allocates (slow there: a
Python call per op, tiny models only).
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass
class AllocationTally:
    live: int = 0
    peak: int = 0
    counts: dict = field(default_factory=dict)  # storage data_ptr -> live tensors on it
    sizes: dict = field(default_factory=dict)  # storage data_ptr -> bytes

    def release(self, ptr: int) -> None:
        self.counts[ptr] -= 1
        if self.counts[ptr] == 0:
            del self.counts[ptr]
            self.live -= self.sizes.pop(ptr)


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """(identity, bytes) of the storage under `t`: the storage object's own address, which meta storages have
    too (their data pointer is 0); views share it."""
    storage = t.untyped_storage()
    return storage._cdata, storage.nbytes()


class _Tracker(TorchDispatchMode):
    def __init__(self, tally: AllocationTally):
        super().__init__()
        self.tally = tally

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_storage(t)[0] for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        tally = self.tally
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            ptr, size = _storage(t)
            if size == 0:
                continue
            if ptr not in tally.counts:  # a view or an in-place result keeps a tracked storage alive too
                if ptr in inputs or func._schema.is_mutable or any(a.alias_info for a in func._schema.returns):
                    continue  # a storage allocated outside the tracked code
                tally.counts[ptr] = 0
                tally.sizes[ptr] = size
                tally.live += size
                tally.peak = max(tally.peak, tally.live)
            tally.counts[ptr] += 1
            weakref.finalize(t, tally.release, ptr)
        return out


@contextmanager
def track_allocations():
    """with track_allocations() as tally: ...; tally.peak is the peak of live bytes allocated inside."""
    tally = AllocationTally()
    with _Tracker(tally):
        yield tally
