"""The tiktoken-format encoder (Emu3's emu3.tiktoken) against the `tiktoken` package on a trained rank table."""
from __future__ import annotations

import base64
import random
from collections import Counter

import pytest

from lantern_core.errors import CheckpointError
from lantern_core.tiktoken_bpe import QWEN_PATTERN, TiktokenBPE, read_ranks

tiktoken = pytest.importorskip("tiktoken")

CORPUS = ("The quick brown fox's 12 jumps, they'll say: \"isn't it?\"  A portrait of a young girl, masterpiece,"
          " film grained, best quality.\n\nlowres, bad anatomy, bad hands, text, error, missing fingers 90*90 "
          "café naïve 東京 🙂 \t tabs\r\n") * 3
SPECIAL_NAMES = ["<|endoftext|>", "<|extra_200|>", "<|extra_203|>", "<|image start|>", "<|image token|>",
                 "<|visual token 000000|>", "<|visual token 000001|>"]


def train_ranks(text: str, merges: int = 300) -> dict[bytes, int]:
    """Every byte (ranks 0..255), then `merges` most frequent adjacent pairs inside the pattern's pieces."""
    import regex

    ranks = {bytes([b]): b for b in range(256)}
    words = [[bytes([b]) for b in piece.encode()] for piece in regex.findall(QWEN_PATTERN, text)]
    for _ in range(merges):
        pairs = Counter((w[i], w[i + 1]) for w in words for i in range(len(w) - 1))
        if not pairs:
            break
        (a, b), _count = pairs.most_common(1)[0]
        ranks[a + b] = len(ranks)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                i += 1
    return ranks


@pytest.fixture(scope="module")
def tables():
    ranks = train_ranks(CORPUS)
    special = {name: len(ranks) + i for i, name in enumerate(SPECIAL_NAMES)}
    reference = tiktoken.Encoding("tiny", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=special)
    return ranks, special, reference


def sample_texts(count: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    pool = list("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 ,.'!?*\n\t\r-_:;\"()éïü東京🙂") + [
        "'s", "'ll", "'T", " the", "  ", "\n\n", " 90*90", *SPECIAL_NAMES, "<|", "|>", "<|extra_2", "masterpiece"]
    words = CORPUS.split(" ")
    texts = []
    for _ in range(count):
        parts = [rng.choice(pool) if rng.random() < 0.7 else rng.choice(words) for _ in range(rng.randint(0, 25))]
        texts.append("".join(parts))
    return texts


def test_ids_match_tiktoken_with_every_special_token_allowed(tables):
    ranks, special, reference = tables
    ours = TiktokenBPE(ranks, special, normalize=None)
    for text in sample_texts():
        assert ours.encode(text).ids == reference.encode(text, allowed_special="all"), text


def test_a_leftmost_merge_rule_is_caught(tables):
    """The comparison above can fail: merging the leftmost mergeable pair instead of the lowest rank differs."""

    class Leftmost(TiktokenBPE):
        def _encode_piece(self, piece):
            parts = [piece[i:i + 1] for i in range(len(piece))]
            merged = True
            while merged:
                merged = False
                for i in range(len(parts) - 1):
                    if parts[i] + parts[i + 1] in self.ranks:
                        parts[i:i + 2] = [parts[i] + parts[i + 1]]
                        merged = True
                        break
            return [self.ranks[p] for p in parts]

    ranks, special, reference = tables
    wrong = Leftmost(ranks, special, normalize=None)
    assert any(wrong.encode(t).ids != reference.encode(t, allowed_special="all") for t in sample_texts())


def test_vocabulary_calls_and_nfc(tables):
    ranks, special, _ = tables
    ours = TiktokenBPE(ranks, special)
    assert ours.token_to_id("<|image token|>") == special["<|image token|>"]
    assert ours.token_to_id("a") == ranks[b"a"]
    assert ours.token_to_id("<|no such|>") is None
    assert ours.get_vocab_size() == len(ranks) + len(special)
    assert ours.get_vocab()["<|visual token 000001|>"] == special["<|visual token 000001|>"]
    # NFC first, as Emu3's tokenizer does: a decomposed e + combining acute encodes as the composed é
    assert ours.encode("cafe\u0301").ids == ours.encode("caf\u00e9").ids


def test_rank_file_is_read_and_bad_lines_are_named(tmp_path, tables):
    ranks, _, _ = tables
    good = tmp_path / "emu3.tiktoken"
    good.write_bytes(b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for t, r in ranks.items()))
    assert read_ranks(good) == ranks
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(b"YQ== 0\nnot-base64! 1\n")
    with pytest.raises(CheckpointError, match=r"bad\.tiktoken.*line 2"):
        read_ranks(bad)
    repeated = tmp_path / "repeated.tiktoken"
    repeated.write_bytes(b"YQ== 0\nYg== 0\n")
    with pytest.raises(CheckpointError, match="repeated"):
        read_ranks(repeated)
