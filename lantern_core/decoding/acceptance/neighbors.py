"""Latent neighbours of VQ codes, for LANTERN's relaxed acceptance.

For each code x, B_k(x) is the k nearest other codes by L2 distance on the **raw** codebook weights
(as LANTERN computes them, although LlamaGen quantises with the L2-normalised codebook), self excluded,
nearest first, ties broken by code index. Only the first k columns are kept (LANTERN's full table for
LlamaGen is 16384 x 16383 uint16, 537 MB). Tables are cached on disk as safetensors, keyed by a hash of
the codebook, with a hash of the table itself so a corrupted file is detected and rebuilt. The caller
chooses the cache folder; this module never picks one.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

from ...errors import ConfigError
from ...layout import draftable_codes

log = logging.getLogger(__name__)
ROW_CHUNK = 1024  # rows of the distance matrix computed at once: bounds memory to ROW_CHUNK x V floats


def build_neighbors(codebook: torch.Tensor, k: int) -> torch.Tensor:
    """codebook (V, C) -> (V, k) int64 indices of the k nearest other codes, nearest first."""
    V = codebook.shape[0]
    if not 1 <= k <= V - 1:
        raise ConfigError("neighbour count k", f"an integer in 1..{V - 1} (codebook size - 1)", k)
    book = codebook.detach().float().cpu()
    out = torch.empty(V, k, dtype=torch.long)
    for start in range(0, V, ROW_CHUNK):
        rows = book[start:start + ROW_CHUNK]
        dist = torch.cdist(rows, book)  # (chunk, V)
        dist[torch.arange(rows.shape[0]), torch.arange(start, start + rows.shape[0])] = float("inf")
        order = torch.sort(dist, dim=1, stable=True).indices  # ties keep index order
        out[start:start + rows.shape[0]] = order[:, :k]
    return out


def codebook_hash(codebook: torch.Tensor) -> str:
    data = codebook.detach().float().cpu().contiguous().numpy().tobytes()
    return hashlib.sha256(data + str(tuple(codebook.shape)).encode()).hexdigest()


def _table_hash(table: torch.Tensor) -> str:
    return hashlib.sha256(table.contiguous().numpy().tobytes()).hexdigest()


def load_or_build_neighbors(codebook: torch.Tensor, k: int, cache_dir: str | Path) -> torch.Tensor:
    """The (V, k) neighbour table for this codebook, from the cache when a valid entry covers k."""
    key = codebook_hash(codebook)
    path = Path(cache_dir) / f"neighbors_{key[:16]}.safetensors"
    if path.is_file():
        table = _read_valid(path, key)
        if table is not None and table.shape[1] >= k:
            return table[:, :k]
    table = build_neighbors(codebook, k)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    meta = {"codebook_sha256": key, "table_sha256": _table_hash(table), "k": k}
    save_file({"neighbors": table}, str(tmp), metadata={"lantern": json.dumps(meta)})
    tmp.replace(path)  # atomic: a reader never sees half a file
    return table


def _read_valid(path: Path, key: str) -> torch.Tensor | None:
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("lantern", "{}"))
        table = load_file(str(path))["neighbors"]
    except (SafetensorError, OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        log.warning("neighbour cache %s is unreadable (%s): rebuilding it", path, exc)
        return None
    if meta.get("codebook_sha256") != key or meta.get("table_sha256") != _table_hash(table):
        log.warning("neighbour cache %s does not match its hashes: rebuilding it", path)
        return None
    return table


def check_neighbors(k: int, neighbors: torch.Tensor | None, device: torch.device, config) -> torch.Tensor | None:
    """The neighbour table on `device` when the acceptance reads k > 0 neighbours, else None. A relaxation
    reading more latent neighbours than the target `config` has other codes is a ConfigError (tree and
    Jacobi decoders alike), before any forward."""
    if k == 0:
        return None
    V = draftable_codes(config)
    if k > V - 1:
        raise ConfigError("lantern_k", f"at most {V - 1} latent neighbours per token (the {V} codes less the "
                          "token itself)", k, f"lower lantern_k (command line: --k) to at most {V - 1}")
    if neighbors is None or neighbors.shape[1] < k:
        raise ConfigError("neighbour table", f"a (V, >= {k}) table for lantern k",
                          None if neighbors is None else tuple(neighbors.shape),
                          "build it with lantern_core.decoding.neighbors.load_or_build_neighbors")
    return neighbors.to(device)
