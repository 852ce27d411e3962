"""The Inductor-compiled AR step writes the KV cache in place: its generated code (C++ on this CPU) allocates
nothing as large as one layer's cache and runs no loop nest over that many elements. The write the cache
used to make (`index_copy_` on a view of the 5-D cache taken inside the step) is lowered out of place, a
copy of every layer written and the whole cache copied back, and trips both checks: the detector is proven
on the same step. A compiled iteration compacts one layer view at a time (`compact_layers`), which must move
what the eager two-kernel compaction moves."""
from __future__ import annotations

import re
from math import prod

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from lantern_core.config import SamplingConfig
from lantern_core.decoding.ar_step import ARBuffers, ARShape, ar_step
from lantern_core.models.kv_cache import KVCache, compact_layers
from tiny_models import TINY_C2I, random_gpt

SHAPE = ARShape(batch=1, slots=24, image_tokens=16, sampling=SamplingConfig(cfg_scale=3.0, temperature=0.0))
ALLOCATION = re.compile(r"empty_strided_\w+\(\(([\d, ]*)\)")  # a buffer the wrapper allocates: its shape
LOOP = re.compile(r"for\(int64_t x\d+=static_cast<int64_t>\((\d+)L\); x\d+<static_cast<int64_t>\((\d+)L\);")


def allocation_sizes(code: str) -> list[int]:
    """Elements of every buffer the generated wrapper allocates."""
    return [prod(int(d) for d in m.group(1).split(",") if d.strip()) for m in ALLOCATION.finditer(code)]


def loop_nest_sizes(code: str) -> list[int]:
    """Elements each loop nest of the generated C++ kernels covers: the product of the trip counts of a loop
    and the loops around it (braces give the nesting; Inductor opens every loop body with one)."""
    sizes, open_loops, depth, pending = [], [], 0, None
    for line in code.splitlines():
        loop = LOOP.search(line)
        if loop:
            pending = int(loop.group(2)) - int(loop.group(1))
        for ch in line:
            if ch == "{":
                depth += 1
                if pending is not None:
                    open_loops.append((depth, pending))
                    sizes.append(prod(trips for _, trips in open_loops))
                    pending = None
            elif ch == "}":
                if open_loops and open_loops[-1][0] == depth:
                    open_loops.pop()
                depth -= 1
    return sizes


def cache_copies(code: str, layer_elements: int) -> list[str]:
    """What in `code` is as large as one layer's cache (a copy of it; an in-place write touches a few slots)."""
    return ([f"allocation of {n}" for n in allocation_sizes(code) if n >= layer_elements]
            + [f"loop nest over {n}" for n in loop_nest_sizes(code) if n >= layer_elements])


def write_through_step_views(self, layer, slots, k, v, kv_len):
    """The cache's write before the fix: `index_copy_` on a layer view of the 5-D cache made inside the step."""
    self.keys[layer].index_copy_(2, slots, k)
    self.values[layer].index_copy_(2, slots, v)
    return self.keys[layer, :, :, :kv_len], self.values[layer, :, :, :kv_len]


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def ready_buffers(model) -> ARBuffers:
    buffers = ARBuffers.allocate(model, SHAPE)
    buffers.prefix_len.fill_(2)  # the step feeds image token 0 at slot 2
    return buffers


@torch.no_grad()
def compiled_step_code(model, buffers: ARBuffers) -> str:
    step = torch.compile(lambda: ar_step(model, SHAPE, buffers, SHAPE.slots), backend="inductor", fullgraph=True,
                         dynamic=False)
    _, codes = run_and_get_code(step)
    code = "\n".join(codes)
    assert "def call(" in code and "extern \"C\"" in code  # Inductor's C++ code, not a fallback
    return code


def test_the_compiled_ar_step_writes_the_cache_in_place(fresh_dynamo):
    model = random_gpt(TINY_C2I, seed=3)
    buffers = ready_buffers(model)
    code = compiled_step_code(model, buffers)
    layer_elements = buffers.cache.keys[0].numel()  # (rows, H_kv, slots, D)
    assert len(buffers.cache.keys) == 2 and layer_elements == 2 * 4 * 24 * 16
    assert not cache_copies(code, layer_elements)
    eager = ready_buffers(model)
    with torch.no_grad():
        ar_step(model, SHAPE, eager, SHAPE.slots)
    assert buffers.cache.keys[:, :, :, 2].abs().sum() > 0  # the compiled writes landed in the caller's cache
    torch.testing.assert_close(buffers.cache.keys, eager.cache.keys)
    torch.testing.assert_close(buffers.cache.values, eager.cache.values)


def test_a_write_through_views_made_inside_the_step_is_caught_as_a_copy(fresh_dynamo, monkeypatch):
    monkeypatch.setattr(KVCache, "update", write_through_step_views)
    model = random_gpt(TINY_C2I, seed=3)
    buffers = ready_buffers(model)
    copies = cache_copies(compiled_step_code(model, buffers), buffers.cache.keys[0].numel())
    assert any(c.startswith("allocation") for c in copies) and any(c.startswith("loop nest") for c in copies), copies


@pytest.mark.parametrize("per_row", [False, True], ids=["shared", "per-row"])
def test_compacting_layer_by_layer_moves_what_the_eager_compaction_moves(per_row):
    g = torch.Generator().manual_seed(0)
    cache = KVCache.allocate(3, 2, 2, 10, 4, "cpu", torch.float32)  # (L, B, H_kv, S, D)
    cache.keys.copy_(torch.randn(cache.keys.shape, generator=g))
    cache.values.copy_(torch.randn(cache.values.shape, generator=g))
    twin = KVCache(cache.keys.clone(), cache.values.clone())
    if per_row:  # overlapping source and destination: every entry is read before any is written
        source, dest = torch.tensor([[3, 4, 6], [7, 8, 9]]), torch.tensor([2, 5])
    else:
        source, dest = torch.tensor([5, 7, 8]), torch.tensor(4)
    before = cache.keys.clone()
    cache.compact(source, dest)
    compact_layers(twin, source, dest)
    assert not torch.equal(cache.keys, before)
    assert torch.equal(twin.keys, cache.keys) and torch.equal(twin.values, cache.values)
    assert twin.layer_keys[2].data_ptr() == twin.keys[2].data_ptr()  # the layer views write the 5-D tensors
