"""Latent neighbours: brute-force agreement, self exclusion, ordering, and the hash-checked disk cache."""
import pytest
import torch

from lantern_core.decoding.acceptance import neighbors
from lantern_core.errors import ConfigError


def codebook(seed=0, V=50, C=8):
    return torch.randn(V, C, generator=torch.Generator().manual_seed(seed))


def test_matches_brute_force_nearest_first_without_self():
    book = codebook()
    table = neighbors.build_neighbors(book, 7)
    dist = ((book[:, None] - book[None]) ** 2).sum(-1)
    for x in range(book.shape[0]):
        expected = [j for j in sorted(range(50), key=lambda j: (dist[x, j].item(), j)) if j != x][:7]
        assert table[x].tolist() == expected
    assert not (table == torch.arange(50)[:, None]).any()


def test_uses_raw_not_normalised_codes():
    book = torch.tensor([[1.0, 0.0], [10.0, 0.0], [0.0, 1.1]])
    # by direction code 1 is identical to code 0; by raw L2 code 2 is much closer
    assert neighbors.build_neighbors(book, 1)[0].tolist() == [2]


def test_chunked_rows_equal_one_block(monkeypatch):
    book = codebook(V=70)
    full = neighbors.build_neighbors(book, 5)
    monkeypatch.setattr(neighbors, "ROW_CHUNK", 16)
    assert torch.equal(neighbors.build_neighbors(book, 5), full)


def test_bad_k_names_the_parameter():
    with pytest.raises(ConfigError, match="neighbour count k"):
        neighbors.build_neighbors(codebook(), 50)


def test_cache_reuses_slices_and_rebuilds_corrupted_or_short_tables(tmp_path, monkeypatch):
    book = codebook(1)
    first = neighbors.load_or_build_neighbors(book, 6, tmp_path)
    files = list(tmp_path.glob("neighbors_*.safetensors"))
    assert len(files) == 1
    calls = []
    real = neighbors.build_neighbors
    monkeypatch.setattr(neighbors, "build_neighbors", lambda b, k: calls.append(k) or real(b, k))
    assert torch.equal(neighbors.load_or_build_neighbors(book, 4, tmp_path), first[:, :4]) and calls == []
    data = bytearray(files[0].read_bytes())
    data[-5] ^= 0xFF  # flip a byte inside the table
    files[0].write_bytes(bytes(data))
    assert torch.equal(neighbors.load_or_build_neighbors(book, 6, tmp_path), first) and calls == [6]
    assert torch.equal(neighbors.load_or_build_neighbors(book, 9, tmp_path)[:, :6], first) and calls == [6, 9]
    other = neighbors.load_or_build_neighbors(codebook(2), 3, tmp_path)
    assert len(list(tmp_path.glob("neighbors_*.safetensors"))) == 2 and other.shape == (50, 3)
