"""Position noise: SplitMix64 bits that match the published generator on any machine, uniforms and races with
the right laws (shown to reject a broken race), and noise that depends on (seed, position, code) alone."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from lantern_core.decoding.acceptance.position_noise import (PositionNoise, image_keys, key_tensor, race_tokens,
                                                             splitmix64)
from lantern_core.decoding.sampling import make_generators

# SplitMix64 seeded with 1234567: the first outputs of the reference C code (Vigna, splitmix64.c)
PUBLISHED = [6457827717110365317, 3203168211198807973, 9817491932198370423]


def as_unsigned(t: torch.Tensor) -> list[int]:
    return [v % 2**64 for v in t.reshape(-1).tolist()]


def test_the_python_reference_is_the_published_generator():
    assert splitmix64(1234567, 3) == PUBLISHED


def test_tensor_bits_are_splitmix64_streams_of_seed_then_position():
    """bases[g, i] is output i of SplitMix64(seed g); bits[g, i, v] is output v of SplitMix64(bases[g, i]):
    int64 tensor arithmetic (wrapping products, masked shifts) gives the uint64 generator's bits exactly."""
    seeds = [1234567, 2**64 - 5, 0]
    noise = PositionNoise.of([torch.Generator().manual_seed(s) for s in seeds], 3, 40, 33, "cpu")
    for g, seed in enumerate(seeds):
        assert as_unsigned(noise.bases[g]) == splitmix64(seed, 40)
    bits = noise.bits_at(torch.tensor([0, 17, 39]))
    for g in range(3):
        for j, i in enumerate((0, 17, 39)):
            assert as_unsigned(bits[g, j]) == splitmix64(as_unsigned(noise.bases[g, i])[0], 33)


def test_uniforms_are_uniform_and_pairs_independent():
    """Chi-square over 64 cells for single values, and over 16 x 16 cells for neighbours along the vocabulary,
    along positions and across images with adjacent seeds (the seeds a batch uses)."""
    noise = PositionNoise.of(make_generators(5, 4), 4, 300, 512, "cpu")
    u = noise.uniforms_at(torch.arange(300), torch.float64)  # (4, 300, 512)
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0

    def pvalue(counts: torch.Tensor) -> float:
        expected = counts.sum() / counts.numel()
        return float(chi2.sf(float(((counts - expected) ** 2 / expected).sum()), counts.numel() - 1))

    assert pvalue(torch.histc(u, 64, 0, 1)) > 1e-3
    for a, b in ((u[..., :-1], u[..., 1:]), (u[:, :-1], u[:, 1:]), (u[:-1], u[1:])):
        cells = (a * 16).long() * 16 + (b * 16).long()
        assert pvalue(torch.bincount(cells.reshape(-1), minlength=256).double()) > 1e-3


LAW = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.04, 0.01, 0.0], dtype=torch.float64)


def race_frequencies(race) -> torch.Tensor:
    noise = PositionNoise.of(make_generators(3, 8), 8, 2500, LAW.numel(), "cpu")
    exp = noise.exp_at(torch.arange(2500), torch.float64)  # (8, 2500, V): 20,000 independent races
    tokens = race(LAW.log().expand_as(exp), exp)
    return torch.bincount(tokens.reshape(-1), minlength=LAW.numel()).double()


def law_pvalue(counts: torch.Tensor) -> float:
    keep = LAW > 0
    assert counts[~keep].sum() == 0
    expected = LAW[keep] * counts.sum()
    return float(chi2.sf(float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1))


def test_the_race_draws_the_law():
    assert law_pvalue(race_frequencies(race_tokens)) > 1e-3


def test_the_same_test_rejects_a_race_with_the_wrong_noise():
    """Adding the Exp(1) value itself instead of subtracting its log (a plausible slip) is not the law."""
    assert law_pvalue(race_frequencies(lambda logits, exp: (logits + exp).argmax(-1))) < 1e-6


def test_keys_follow_seeds_not_streams_and_batches_are_single_runs():
    gens = make_generators(7, 3)
    before = key_tensor(gens, 3, "cpu")
    for g in gens:
        torch.rand(4, generator=g)
    assert torch.equal(key_tensor(gens, 3, "cpu"), before)
    assert image_keys(torch.Generator().manual_seed(7), 3) == [7, 8, 9] == image_keys(gens, 3)
    batch = PositionNoise.of(make_generators(7, 3), 3, 20, 16, "cpu")
    single = PositionNoise.of(make_generators(8, 1), 1, 20, 16, "cpu")
    assert torch.equal(batch.bits_at(torch.arange(20))[1], single.bits_at(torch.arange(20))[0])
    assert torch.equal(batch.keep_rows(torch.tensor([1])).bases, single.bases)
    with pytest.raises(ValueError, match="one per sample"):
        key_tensor(make_generators(0, 2), 3, "cpu")


def test_a_position_past_the_table_is_refused_not_read_out_of_bounds():
    noise = PositionNoise.of(make_generators(1, 2), 2, 10, 8, "cpu")
    with pytest.raises(RuntimeError):
        noise.bits_at(torch.tensor([9, 12]))


def test_a_shared_generator_repeated_in_a_list_still_gives_each_image_its_own_key():
    shared = torch.Generator().manual_seed(5)
    assert image_keys([shared] * 3, 3) == [5, 6, 7] == image_keys(shared, 3)
    other = torch.Generator().manual_seed(9)
    assert image_keys([shared, other, shared], 3) == [5, 9, 7]
