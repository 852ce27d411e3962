"""A tiktoken-format byte-pair encoder, for tokenizers published as a rank file (Emu3's `emu3.tiktoken`).

Emu3's original release ships its text tokenizer as `emu3.tiktoken` (one line per token: its bytes in Base64, then
its rank) plus `emu3_vision_tokens.txt` (the image special tokens), read by remote code through the `tiktoken`
package. This module encodes text the same way without that package or any remote code: special tokens
are split out first (every special token is allowed in text, tiktoken's `allowed_special="all"`, the
earliest match winning and, at one position, the one listed first), the rest is cut into pieces by the
pre-tokenizer pattern, and each piece's UTF-8 bytes are merged pairwise, always the adjacent pair whose
merged bytes have the lowest rank (leftmost on ties), until no pair is in the table; a token's id is its
rank. `TiktokenBPE` answers the calls `prompts.PromptEncoder` makes of a `tokenizers.Tokenizer`
(`encode(...).ids`, `token_to_id`, `get_vocab`, `get_vocab_size`). It only encodes (no decoding).
"""
from __future__ import annotations

import binascii
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError

# Qwen's pre-tokenizer pattern, which Emu3's tokenizer uses (needs the `regex` package's \p{...} classes)
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


ENCODED = re.compile(rb"[A-Za-z0-9+/]+={0,2}")  # a token's bytes as its rank file writes them


@dataclass(frozen=True)
class Encoding:
    """What `encode` returns: the ids, as `tokenizers.Encoding.ids`."""

    ids: list[int]


def read_ranks(path: str | Path) -> dict[bytes, int]:
    """A tiktoken rank file -> {token bytes: rank}; a CheckpointError naming the file and line when a line is
    not `<Base64 bytes> <rank>` or a rank repeats (the bytes are read with `binascii`, nothing is run)."""
    path = Path(path)
    fix = "use the emu3.tiktoken that ships with the model (download it again)"
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise CheckpointError(path, "a readable tiktoken rank file", f"an unreadable file ({exc})", fix) from exc
    ranks: dict[bytes, int] = {}
    seen: set[int] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = line.split()
        try:
            if not ENCODED.fullmatch(fields[0]):
                raise ValueError
            token, rank = binascii.a2b_base64(fields[0]), int(fields[1])
            if len(fields) != 2 or rank < 0:
                raise ValueError
        except (IndexError, ValueError, binascii.Error) as exc:
            raise CheckpointError(path, f"'<Base64 bytes> <rank>' on line {number}", repr(line[:60]), fix) from exc
        if rank in seen or token in ranks:
            raise CheckpointError(path, f"each token and rank once (line {number})", f"rank {rank} repeated", fix)
        ranks[token] = rank
        seen.add(rank)
    if not ranks:
        raise CheckpointError(path, "a tiktoken rank file", "no tokens", fix)
    return ranks


class TiktokenBPE:
    """Byte-pair encoding over a tiktoken rank table with special tokens (name -> id)."""

    def __init__(self, ranks: dict[bytes, int], special: dict[str, int], pattern: str = QWEN_PATTERN,
                 normalize: str | None = "NFC"):
        import regex  # comes with transformers; imported lazily like the tokenizers wheel

        self.ranks = ranks
        self.special = dict(special)
        self.order = {name: i for i, name in enumerate(special)}  # alternation order of tiktoken's special regex
        self.lengths = sorted({len(name) for name in special})
        self.starts = {name[0] for name in special if name}
        self.pattern = regex.compile(pattern)
        self.normalize = normalize

    def get_vocab_size(self) -> int:
        return max([*self.ranks.values(), *self.special.values()]) + 1

    def token_to_id(self, name: str) -> int | None:
        if name in self.special:
            return self.special[name]
        return self.ranks.get(name.encode("utf-8"))

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        """Special tokens by name, and the ordinary tokens whose bytes are valid UTF-8 by their text."""
        vocab = {}
        for token, rank in self.ranks.items():
            try:
                vocab[token.decode("utf-8")] = rank
            except UnicodeDecodeError:
                continue
        if with_added_tokens:
            vocab.update(self.special)
        return vocab

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding:
        """Text -> ids (special tokens in the text become their ids; there is no post-processor, so
        `add_special_tokens` changes nothing)."""
        if self.normalize:
            text = unicodedata.normalize(self.normalize, text)
        ids: list[int] = []
        start = 0
        while start <= len(text):
            found = self._next_special(text, start)
            end = len(text) if found is None else found[0]
            for piece in self.pattern.findall(text[start:end]):
                ids.extend(self._encode_piece(piece.encode("utf-8")))
            if found is None:
                break
            ids.append(self.special[found[1]])
            start = end + len(found[1])
        return Encoding(ids)

    def _next_special(self, text: str, start: int) -> tuple[int, str] | None:
        """(position, name) of the earliest special token at or after `start`; at one position, the one
        listed first (as an ordered regex alternation picks)."""
        for p in range(start, len(text)):
            if text[p] not in self.starts:
                continue
            names = [text[p:p + n] for n in self.lengths if text[p:p + n] in self.special]
            if names:
                return p, min(names, key=self.order.__getitem__)
        return None

    def _encode_piece(self, piece: bytes) -> list[int]:
        if piece in self.ranks:
            return [self.ranks[piece]]
        parts = [piece[i:i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            best, where = None, -1
            for i in range(len(parts) - 1):
                rank = self.ranks.get(parts[i] + parts[i + 1])
                if rank is not None and (best is None or rank < best):
                    best, where = rank, i
            if best is None:
                break
            parts[where:where + 2] = [parts[where] + parts[where + 1]]
        try:
            return [self.ranks[p] for p in parts]
        except KeyError as exc:  # a byte missing from the table: not a complete byte-level vocabulary
            raise CheckpointError("tokenizer", "every single byte in the tiktoken rank table", f"no rank for {exc}",
                                  "use the emu3.tiktoken that ships with the model") from None
