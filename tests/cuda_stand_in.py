"""CUDA's graph, stream and caching-allocator rules on the CPU, strictly enough to fail where a GPU fails.

`CudaStandIn` replaces the `torch.cuda` calls that capture, replay and release make (streams, devices,
`CUDAGraph`, `graph`, `graph_pool_handle`, `empty_cache`, `memory_reserved`, cuBLAS's workspaces) with a model
of PyTorch's own rules (c10/cuda/CUDACachingAllocator.cpp, aten/src/ATen/cuda/CUDAGraph.cpp):

- a private pool is made by the first capture into its handle with use count 1, and every later capture into
  it adds 1; resetting (or dropping) a captured graph takes 1 off. A capture into a handle whose pool still
  exists at use count 0 raises the real assert (`it->second->use_count > 0 INTERNAL ASSERT FAILED`);
- a pool at use count 0 is erased only by `empty_cache`, and only when none of its blocks is still allocated;
- cuBLAS makes a workspace on the first matmul of each stream (a `cublas_handle_stream_to_workspace` entry),
  allocated in the pool being captured when that stream is capturing, else in the device's default pool,
  and keeps it until `_cuda_clearCublasWorkspaces`; `clear_workspaces_at_reset` models a PyTorch whose graph
  reset clears them too;
- a capture needs a non-default current stream on the current device; `set_stream` makes the stream's device
  current (as `torch.cuda.set_stream` does); work for the tensors' device on another stream than the one
  capturing, and host reads, invalidate the capture ("operation not permitted when stream is capturing");
- `torch.cuda.graph` makes its default capture stream once, on the device current at its first use.

Tensors stay on the CPU and stand for device `tensor_device` ("cpu" passed as a device means it too). Graphs
really record: the aten ops dispatched on the capturing stream are kept and replayed with the same operands and
outputs (fixed addresses), so a replay computes what the recording computed, and a Python branch taken at
capture stays taken, as on a GPU. Use it as a context manager (`with CudaStandIn(monkeypatch) as cuda:`).
"""
from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

USE_COUNT_ASSERT = ('it->second->use_count > 0 INTERNAL ASSERT FAILED at "/pytorch/c10/cuda/CUDACachingAllocator.cpp"'
                    ':2799, please report a bug to PyTorch.')
CAPTURE_INVALID = "CUDA error: operation not permitted when stream is capturing"
WORKSPACE_BYTES = 32 << 20  # cuBLAS's workspace on sm90
CAPTURE_BYTES = 2 << 20  # what one recording keeps reserved in its pool (intermediates)

GEMMS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
         torch.ops.aten.baddbmm.default, torch.ops.aten.linear.default, torch.ops.aten.matmul.default}
HOST_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
              torch.ops.aten.is_nonzero.default, torch.ops.aten.equal.default}


@dataclass(eq=False)
class Stream:
    device: torch.device
    default: bool = False

    def wait_stream(self, other: "Stream") -> None:
        pass

    def synchronize(self) -> None:
        pass


@dataclass(eq=False)
class Pool:
    handle: tuple
    device: int
    use_count: int = 1
    blocks: set = field(default_factory=set)  # allocated block ids (workspaces)
    bytes: int = 0  # reserved in its segments
    freeable: bool = False


@dataclass(eq=False)
class Capture:
    graph: "object"
    stream: Stream
    pool: Pool
    ops: list = field(default_factory=list)
    invalid: str = ""


class CudaStandIn(TorchDispatchMode):
    def __init__(self, monkeypatch, devices: int = 1, tensor_device: int = 0, clear_workspaces_at_reset: bool = False):
        super().__init__()
        self.monkeypatch, self.devices, self.tensor_device = monkeypatch, devices, tensor_device
        self.clear_workspaces_at_reset = clear_workspaces_at_reset
        self.current = 0
        self.defaults = {d: Stream(torch.device("cuda", d), default=True) for d in range(devices)}
        self.streams = dict(self.defaults)  # device -> its current stream
        self.pools: dict[tuple, Pool] = {}
        self.handles = itertools.count(1)
        self.blocks = itertools.count(1)
        self.capture: Capture | None = None
        self.replaying = False
        self.workspaces: dict[int, tuple[int, Pool | None, int]] = {}  # id(stream) -> (block, pool, device)
        self.default_pool_bytes = {d: 0 for d in range(devices)}  # reserved outside private pools
        self.default_live = {d: set() for d in range(devices)}
        self.default_capture_stream: Stream | None = None
        self.captures = 0  # recordings begun
        self.failures: list[str] = []  # errors raised by the rules

    # -- devices and streams --------------------------------------------------------------------------------
    def index(self, device=None) -> int:
        if device is None:
            return self.current
        if isinstance(device, int):
            return device
        device = torch.device(device)
        if device.type == "cpu":
            return self.tensor_device
        return self.current if device.index is None else device.index

    def current_stream(self, device=None) -> Stream:
        return self.streams[self.index(device)]

    def set_stream(self, stream: Stream) -> None:
        self.current = stream.device.index  # torch.cuda.set_stream makes the stream's device current
        self.streams[stream.device.index] = stream

    @contextlib.contextmanager
    def stream_context(self, stream: Stream):  # torch.cuda.StreamContext
        before_here = self.current_stream()
        before_there = self.current_stream(stream.device)
        self.set_stream(stream)
        try:
            yield
        finally:
            if before_here.device != stream.device:
                self.set_stream(before_there)
            self.set_stream(before_here)

    @contextlib.contextmanager
    def device_context(self, device):
        before, self.current = self.current, self.index(device)
        try:
            yield
        finally:
            self.current = before

    def make_stream(self, device=None, priority: int = 0) -> Stream:
        return Stream(torch.device("cuda", self.index(device)))

    # -- the allocator ----------------------------------------------------------------------------------------
    def create_or_incref(self, handle: tuple, device: int) -> Pool:
        pool = self.pools.get(handle)
        if pool is None:
            pool = self.pools[handle] = Pool(handle, device)
            return pool
        if pool.use_count <= 0:
            self.failures.append(USE_COUNT_ASSERT)
            raise RuntimeError(USE_COUNT_ASSERT)
        pool.use_count += 1
        return pool

    def release_pool(self, pool: Pool) -> None:
        pool.use_count -= 1
        assert pool.use_count >= 0, "use_count below zero"
        if pool.use_count == 0:
            pool.freeable = True

    def empty_cache(self) -> None:
        for d in range(self.devices):
            self.default_pool_bytes[d] = len(self.default_live[d]) * WORKSPACE_BYTES
        for handle, pool in list(self.pools.items()):
            if pool.freeable and pool.use_count == 0 and not pool.blocks:
                del self.pools[handle]

    def memory_reserved(self, device=None) -> int:
        d = self.index(device)
        return self.default_pool_bytes[d] + sum(p.bytes for p in self.pools.values() if p.device == d)

    def clear_workspaces(self) -> None:
        for block, pool, device in self.workspaces.values():
            if pool is not None:
                pool.blocks.discard(block)
            else:
                self.default_live[device].discard(block)
        self.workspaces.clear()

    def on_gemm(self) -> None:
        stream = self.current_stream(self.tensor_device)
        if id(stream) in self.workspaces:
            return
        block = next(self.blocks)
        capture = self.capture
        if capture is not None and capture.stream is stream:
            capture.pool.blocks.add(block)
            capture.pool.bytes += WORKSPACE_BYTES
            self.workspaces[id(stream)] = (block, capture.pool, self.tensor_device)
        else:
            self.default_live[self.tensor_device].add(block)
            self.default_pool_bytes[self.tensor_device] += WORKSPACE_BYTES
            self.workspaces[id(stream)] = (block, None, self.tensor_device)

    def live_pools(self, device: int | None = None) -> list[Pool]:
        return [p for p in self.pools.values() if device is None or p.device == device]

    # -- graphs -----------------------------------------------------------------------------------------------
    def graph_pool_handle(self) -> tuple:
        return (0, next(self.handles))

    def begin_capture(self, graph, pool=None) -> Pool:
        if self.capture is not None:
            raise RuntimeError("a capture is already under way on this thread")
        stream = self.current_stream()
        if stream.default:
            error = "CUDA graphs must be captured on a non-default stream. (However, after capture, it's ok to replay them on the default stream.)"
            self.failures.append(error)
            raise RuntimeError(error)
        handle = tuple(pool) if pool is not None else self.graph_pool_handle()
        made = self.create_or_incref(handle, self.current)
        made.bytes += CAPTURE_BYTES
        self.capture = Capture(graph, stream, made)
        self.captures += 1
        return made

    def end_capture(self, graph) -> list:
        capture = self.capture
        if capture is None or capture.graph is not graph:
            raise RuntimeError("capture_end without its capture_begin")
        if self.current_stream() is not capture.stream:
            raise RuntimeError("Capture must end on the same stream it began on.")
        self.capture = None  # endAllocateToPool, then cudaStreamEndCapture
        if capture.invalid:
            raise RuntimeError(f"CUDA error: operation failed due to a previous error during capture ({capture.invalid})")
        return capture.ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        capture = self.capture
        if capture is not None and not self.replaying:
            if func in HOST_READS:
                capture.invalid = f"host read {func}"
                self.failures.append(CAPTURE_INVALID)
                raise RuntimeError(f"{CAPTURE_INVALID} ({capture.invalid})")
            if self.current_stream(self.tensor_device) is not capture.stream:
                capture.invalid = f"{func} on another stream than the capture's"
                self.failures.append(CAPTURE_INVALID)
                raise RuntimeError(f"{CAPTURE_INVALID} ({capture.invalid})")
        if func in GEMMS and not self.replaying:
            self.on_gemm()
        out = func(*args, **kwargs)
        if capture is not None and not self.replaying:
            capture.ops.append((func, args, kwargs, out))
        return out

    def replay_ops(self, ops: list) -> None:
        self.replaying = True
        try:
            for func, args, kwargs, recorded in ops:
                out = func(*args, **kwargs)
                for new, old in zip(tree_flatten(out)[0], tree_flatten(recorded)[0]):
                    if isinstance(old, torch.Tensor) and new is not old:
                        old.copy_(new)  # the graph's fixed output address
        finally:
            self.replaying = False

    # -- installing -------------------------------------------------------------------------------------------
    def install(self) -> None:
        rules = self

        class CUDAGraph:
            def __init__(self):
                self.ops, self.pool_ref, self.replays = None, None, 0

            def capture_begin(self, pool=None, capture_error_mode="global", **_):
                self.pool_ref = rules.begin_capture(self, pool)

            def capture_end(self):
                self.ops = rules.end_capture(self)

            def replay(self):
                if self.ops is None:
                    raise RuntimeError("replay of a graph that was not captured")
                self.replays += 1
                rules.replay_ops(self.ops)

            def pool(self):
                return self.pool_ref.handle

            def reset(self):
                if self.pool_ref is not None and self.ops is not None:
                    rules.release_pool(self.pool_ref)
                elif self.pool_ref is not None and rules.capture is None:  # a capture that never ended well
                    rules.release_pool(self.pool_ref)
                self.ops = self.pool_ref = None
                if rules.clear_workspaces_at_reset:
                    rules.clear_workspaces()

            def __del__(self):
                try:
                    self.reset()
                except Exception:
                    pass

        class graph:  # torch.cuda.graph, as torch 2.x writes it
            def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
                if stream is None and rules.default_capture_stream is None:
                    rules.default_capture_stream = rules.make_stream()
                self.pool = () if pool is None else (pool,)
                self.capture_stream = stream if stream is not None else rules.default_capture_stream
                self.stream_ctx = rules.stream_context(self.capture_stream)
                self.cuda_graph = cuda_graph

            def __enter__(self):
                rules.empty_cache()
                self.stream_ctx.__enter__()
                self.cuda_graph.capture_begin(*self.pool)

            def __exit__(self, *exc):
                self.cuda_graph.capture_end()
                self.stream_ctx.__exit__(*exc)

        self.CUDAGraph = CUDAGraph
        patch = self.monkeypatch.setattr
        for name, value in dict(
                CUDAGraph=CUDAGraph, graph=graph, graph_pool_handle=self.graph_pool_handle, Stream=self.make_stream,
                current_stream=self.current_stream, set_stream=self.set_stream, stream=self.stream_context,
                device=self.device_context, current_device=lambda: self.current, device_count=lambda: self.devices,
                is_available=lambda: True, synchronize=lambda device=None: None, empty_cache=self.empty_cache,
                memory_reserved=self.memory_reserved).items():
            patch(torch.cuda, name, value)
        patch(torch._C, "_cuda_clearCublasWorkspaces", self.clear_workspaces, raising=False)

    def __enter__(self):
        self.install()
        return super().__enter__()
