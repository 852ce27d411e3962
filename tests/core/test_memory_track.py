"""The CPU allocation tracker (`lantern_core/memory_track.py`) the reservation work measures with: it counts each
new storage once while any tensor (views included) holds it, ignores storages made before it started, and
sees a decoding run's KV cache."""
from __future__ import annotations

import torch

from lantern_core.memory_track import track_allocations
from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.decoding.generate import generate
from lantern_core.decoding.sampling import make_generators
from tests.tiny_models import TINY_GQA, random_gpt


def test_a_storage_counts_once_while_any_view_holds_it():
    outside = torch.zeros(100)
    with track_allocations() as tally:
        a = torch.empty(1000)  # 4,000 bytes
        view = a.view(10, 100)
        del a
        b = torch.zeros(500)  # 2,000 bytes: both alive
        assert tally.live == 6000
        del view  # the last tensor on a's storage
        assert tally.live == 2000
        outside.add_(1.0)  # in place on a storage made before: not an allocation
        outside[:10].zero_()
        assert tally.live == 2000
        del b
    assert tally.peak == 6000 and tally.live == 0


def test_a_run_allocates_at_least_its_kv_cache():
    model = random_gpt(TINY_GQA)
    c = TINY_GQA
    rows = 2 * 3  # three images under CFG
    cache = 2 * c.n_layer * rows * c.n_kv_head * c.max_seq_len * c.head_dim * 4  # keys and values, float32
    with torch.no_grad(), track_allocations() as tally:
        generate(model, Condition.classes([0, 1, 2]), SamplingConfig(cfg_scale=2.0), make_generators(0, 3),
                 compile="off")
    assert cache <= tally.peak < 3 * cache


def test_keep_rows_compacts_in_place_without_a_second_copy():
    """`kv_cache.keep_rows` (an image leaving a batch): the kept rows, in order, as a view of the same storage,
    and no allocation the size of the tensor; rows that do not ascend are refused."""
    import pytest

    from lantern_core.models.kv_cache import KVCache, keep_rows

    cache = KVCache.allocate(2, 5, 1, 3, 2, "cpu", torch.float32)
    cache.keys.copy_(torch.arange(cache.keys.numel(), dtype=torch.float32).view_as(cache.keys))
    expected = cache.keys[:, [1, 3, 4]].clone()
    with track_allocations() as tally:
        kept = cache.keep_rows([1, 3, 4])
    assert torch.equal(kept.keys, expected) and kept.keys.untyped_storage().data_ptr() == \
        cache.keys.untyped_storage().data_ptr()
    assert tally.peak < cache.keys.nbytes // 5  # at most one row's worth, never a second cache
    with pytest.raises(ValueError, match="ascend"):
        keep_rows(torch.zeros(4), [2, 1])
