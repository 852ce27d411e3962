"""2-D RoPE: table values against a hand computation, the zero prefix, and the rotation itself."""
import copy
import math

import torch

from lantern_core.models.rope import apply_rope, build_rope_2d


def test_table_matches_hand_computed_values():
    # head_dim 8 -> 4 complex pairs -> 2 frequencies: omega_0 = 1, omega_1 = base**(-2/4) = 0.01 (base 1e4)
    table = build_rope_2d(grid_size=3, head_dim=8, base=10000.0, prefix_len=2)
    assert table.shape == (2 + 9, 4, 2)
    assert torch.count_nonzero(table[:2]) == 0  # the conditioning prefix is not rotated at all
    r, c = 2, 1  # grid cell (row 2, column 1) = sequence row 2 + 2*3 + 1
    row = table[2 + r * 3 + c]
    expected_angles = [r * 1.0, r * 0.01, c * 1.0, c * 0.01]  # first half by row, second half by column
    for j, angle in enumerate(expected_angles):
        assert math.isclose(row[j, 0].item(), math.cos(angle), abs_tol=1e-6)
        assert math.isclose(row[j, 1].item(), math.sin(angle), abs_tol=1e-6)


def test_head_dim_100_like_gpt_3b():
    table = build_rope_2d(grid_size=2, head_dim=100, prefix_len=1)
    assert table.shape == (5, 50, 2)
    omega_1 = 10000.0 ** (-2 / 50)
    assert math.isclose(table[1 + 1 * 2 + 0, 1, 1].item(), math.sin(omega_1), rel_tol=1e-5)  # row 1, col 0
    assert math.isclose(table[1 + 0 * 2 + 1, 25 + 1, 1].item(), math.sin(omega_1), rel_tol=1e-5)  # col 1


def test_apply_rope_rotates_interleaved_pairs():
    x = torch.tensor([[[[1.0, 2.0, 3.0, 4.0]]]])  # (B=1, T=1, H=1, D=4)
    angle = 0.5
    table = torch.tensor([[[math.cos(angle), math.sin(angle)], [1.0, 0.0]]])  # (T=1, D/2=2, 2)
    out = apply_rope(x, table)[0, 0, 0]
    assert torch.allclose(out[:2], torch.tensor([1 * math.cos(angle) - 2 * math.sin(angle),
                                                 2 * math.cos(angle) + 1 * math.sin(angle)]))
    assert torch.allclose(out[2:], torch.tensor([3.0, 4.0]))


def test_prefix_positions_zero_q_and_k(c2i_model):
    x = torch.randn(1, 1, 4, 16)
    zero_row = c2i_model.rope_table[:1]
    assert torch.count_nonzero(apply_rope(x, zero_row)) == 0


def test_rope_table_stays_float32_in_half_precision(c2i_model):
    model = copy.deepcopy(c2i_model).to(torch.bfloat16)  # .to changes a module in place
    assert model.rope_table.dtype == torch.float32
    assert model.tok_embeddings.weight.dtype == torch.bfloat16
