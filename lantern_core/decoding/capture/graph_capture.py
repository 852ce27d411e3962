"""Recording one step into a CUDA graph, by PyTorch's pool rules: one capture stream per device for warm-up and
recording, cuBLAS's workspaces cleared around every recording, the caller's stream and the allocator restored
when a recording fails, and memory given back to the device after graphs are reset. It keeps no registry and
chooses no device: `decoding/step_graphs.py` decides what to capture and when to release it (the rules and why:
docs/gpu_and_capture.md)."""
from __future__ import annotations

import contextlib
import gc
import logging
from typing import Any, Callable, Iterable, Iterator

import torch

log = logging.getLogger("lantern_core.step_graphs")

WARMUP_STEPS = 2


def _reset_graphs(graphs: Iterable[Any]) -> None:
    for graph in graphs:
        reset = getattr(graph, "reset", None)
        if reset is not None:
            try:
                reset()
            except Exception:  # a graph that cannot reset leaks its pool, never the run
                log.warning("could not reset a CUDA graph", exc_info=True)


_STREAMS: dict[int, Any] = {}  # device index -> this process's capture stream for it


def _device_index(device: torch.device | int) -> int:
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.index is not None:
        return device.index
    with torch.cuda.device(device):  # "cuda": the current device
        return torch.cuda.current_device()


def capture_stream(device: torch.device):
    """The one side stream every warm-up and capture on `device` runs on (made on that device, once)."""
    index = _device_index(device)
    stream = _STREAMS.get(index)
    if stream is None:
        stream = _STREAMS[index] = torch.cuda.Stream(device=index)
    return stream


def clear_workspaces() -> None:
    """Drop cuBLAS's per-stream workspaces, as PyTorch's cudagraph trees do around every recording: a workspace
    first made during a capture lives in that capture's pool, and the allocator would keep the pool alive for
    it after its graphs were reset (the `use_count > 0` assert of a later capture into a reused handle)."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


@contextlib.contextmanager
def _on_stream(stream) -> Iterator[None]:
    """`stream` current within the context, the previous stream of its device after it, even on failure."""
    before = torch.cuda.current_stream(stream.device)
    torch.cuda.set_stream(stream)
    try:
        yield
    finally:
        torch.cuda.set_stream(before)


def _record(graph, step: Callable[[], None], pool) -> None:
    """Record `step` into `graph` on the current (capture) stream, allocating in `pool`. The capture is ended
    even when `step` raises, so the allocator stops routing this stream's allocations into the pool. The garbage
    collector waits meanwhile: runners live in a cycle with their model (`step_graphs.py`), so a collection could
    otherwise reset a freed model's graphs in the middle of this recording."""
    collecting = gc.isenabled()
    gc.disable()  # a cycle collected mid-recording could destroy another model's graphs inside this capture
    try:
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")  # other host threads may use CUDA
        try:
            step()
        except BaseException:
            try:
                graph.capture_end()
            except Exception:  # the capture was already invalid: the step's error is the one to report
                log.debug("capture_end after a failed capture", exc_info=True)
            raise
        graph.capture_end()
    finally:
        if collecting:
            gc.enable()


def reserved_bytes(device: torch.device) -> int:
    return int(torch.cuda.memory_reserved(_device_index(device)))


def return_memory(devices: Iterable[torch.device]) -> None:
    """Give the memory of released graphs and buffers back to the device (and so to ComfyUI, which reads the
    device's free memory): synchronize, then free the allocator's cached blocks, which erases the pools whose
    graphs were all reset."""
    try:
        for index in sorted({_device_index(d) for d in devices if d is not None}):
            with torch.cuda.device(index):
                torch.cuda.synchronize(index)
                torch.cuda.empty_cache()
    except Exception:  # giving memory back must never fail a run (a device that never captured: nothing to give)
        log.debug("could not return memory to %s", list(devices), exc_info=True)


def capture(step: Callable[[], None], device: torch.device, pool=None,
            prepare: Callable[[], None] = lambda: None) -> "torch.cuda.CUDAGraph":
    """Warm `step` up and record it on `device`'s capture stream, with `device` current (the model's device,
    which need not be the current one on a machine with several GPUs), into `pool` (None: a pool of its own).
    Warm-up runs real steps, each after `prepare()` (which puts the buffers in a valid state, outside the
    recording); the caller resets the buffers afterwards. cuBLAS workspaces are cleared before and after the
    recording. Raises what capture raises, with the caller's stream and the allocator restored."""
    stream = capture_stream(device)
    with torch.cuda.device(device):
        caller = torch.cuda.current_stream(device)
        stream.wait_stream(caller)
        with _on_stream(stream):
            for _ in range(WARMUP_STEPS):
                prepare()
                step()
            prepare()
            graph = torch.cuda.CUDAGraph()
            clear_workspaces()
            try:
                _record(graph, step, pool)
            except BaseException:
                _reset_graphs([graph])
                raise
            finally:
                clear_workspaces()
        caller.wait_stream(stream)
        torch.cuda.synchronize(device)
    return graph
