"""The one host read a batch decode loop makes per iteration: the image tokens done per image.

A loop needs those counts to stop, to pick the next iteration's attention band and to report progress. Read at
once (`Tensor.tolist`), the host waits for the iteration it has just queued, so the device idles while the host
does its bookkeeping and queues the next one. `DoneReader(late=True)` instead queues a copy of the counts behind
each iteration into pinned memory and hands back the copy queued one iteration earlier: the host then waits for
iteration t - 1 while iteration t runs. The loop works on counts one iteration old, so it bounds the furthest
position by one iteration's largest advance (`BatchProgress.furthest_after`) and runs one spare iteration after
the last image is done (images that are done ride along without effect). Eager loops on the CPU read at once:
there a read costs no device time, and an image that is done can leave the batch. This module reads; it decides
nothing about decoding.
"""
from __future__ import annotations

import torch


class DoneReader:
    """`read(done)` after queuing each iteration, `done` the state's (G,) counts: them as a list, or None when a
    late reader has nothing older than the counts the loop started from. A late reader's batch never shrinks."""

    def __init__(self, done: torch.Tensor, late: bool) -> None:
        self.late = late
        self.turn = 0
        if late:
            pinned = done.device.type == "cuda"
            self.slots = [torch.empty(done.shape, dtype=done.dtype, pin_memory=pinned) for _ in range(2)]
            self.events: list = [None, None]

    def read(self, done: torch.Tensor) -> list[int] | None:
        if not self.late:
            return done.tolist()
        mine, older = self.turn % 2, (self.turn + 1) % 2
        self.slots[mine].copy_(done, non_blocking=True)
        if done.device.type == "cuda":  # behind the copy on the counts' own device (not the current one)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(done.device))
            self.events[mine] = event
        self.turn += 1
        if self.turn == 1:
            return None
        if self.events[older] is not None:
            self.events[older].synchronize()
        return self.slots[older].tolist()
