"""On a machine with several GPUs the model need not be on the current device (ComfyUI's `--cuda-device`, or
a second GPU picked by a node). Captures and the done reader's events must then use the model's device, not
the current one. Checked without a GPU: torch.cuda's stream, event and graph calls are replaced by a
recorder that tracks which device is current, and the done counts are fake "cuda:1" tensors."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lantern_core.decoding import step_graphs
from lantern_core.decoding.capture import graph_capture
from lantern_core.decoding.batching import DoneReader


class CudaRecorder:
    """Stands in for the torch.cuda calls that capture and the done reader make; `current` is the current
    device's index, `graph_devices` the current device each capture recorded on, `event_streams` the stream
    each event was recorded behind (None: the current device's current stream)."""

    def __init__(self) -> None:
        self.current = 0
        self.graph_devices: list[int] = []
        self.event_streams: list = []
        recorder = self

        class Stream:
            def __init__(self, device=None):
                self.device = recorder.index(device)

            def wait_stream(self, other):
                pass

        class Event:
            def record(self, stream=None):
                recorder.event_streams.append(stream)

            def synchronize(self):
                pass

        @contextlib.contextmanager
        def device(where):
            before, recorder.current = recorder.current, recorder.index(where)
            try:
                yield
            finally:
                recorder.current = before

        @contextlib.contextmanager
        def graph(graph, pool=None, capture_error_mode="global"):
            recorder.graph_devices.append(recorder.current)  # torch.cuda.graph makes its stream here
            yield

        self.api = dict(Stream=Stream, Event=Event, device=device, graph=graph,
                        current_stream=lambda device=None: Stream(device),
                        stream=lambda s: contextlib.nullcontext(), CUDAGraph=lambda: object(),
                        synchronize=lambda device=None: None)

    def index(self, device) -> int:
        if device is None:
            return self.current
        device = torch.device(device)
        return self.current if device.index is None else device.index


@pytest.fixture
def cuda_recorder(monkeypatch) -> CudaRecorder:
    recorder = CudaRecorder()
    for name, value in recorder.api.items():
        monkeypatch.setattr(torch.cuda, name, value)
    return recorder


def test_a_capture_records_on_the_models_device_not_the_current_one(monkeypatch):
    """With device 0 current, a capture for a model on device 1 warms up and records on device 1's own capture
    stream (the stand-in refuses work on another stream than the capturing one), then hands device 0 back."""
    from cuda_stand_in import CudaStandIn

    monkeypatch.setattr(graph_capture, "_STREAMS", {})
    with CudaStandIn(monkeypatch, devices=2, tensor_device=1) as cuda:
        weight, seen = torch.randn(4, 4), []

        def step():
            seen.append((cuda.current, cuda.current_stream(1)))
            weight.mul_(1.0)
            weight @ weight

        graph = step_graphs.capture(step, torch.device("cuda:1"))
        (stream,) = graph_capture._STREAMS.values()
        assert stream.device == torch.device("cuda:1") and not stream.default
        assert seen == [(1, stream)] * (step_graphs.WARMUP_STEPS + 1)  # warm-up and recording on it
        assert cuda.current == 0 and cuda.current_stream(1).default  # the caller's device and stream back
        assert cuda.failures == [] and graph.ops


def test_the_done_reader_records_its_events_behind_the_counts_own_device(cuda_recorder):
    with FakeTensorMode():
        done = torch.ones(3, dtype=torch.long, device="cuda:1")
        reader = DoneReader(done, late=True)
        reader.read(done)
    (stream,) = cuda_recorder.event_streams
    assert stream is not None and stream.device == 1
