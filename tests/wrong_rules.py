"""Deliberately wrong acceptance rules shared by the exactness tests, to show each test can fail."""
from __future__ import annotations

import torch

from lantern_core.decoding.acceptance import siblings as acceptance


def residual_forgotten(p, log_q, children, uniforms, valid=None, rule=None, neighbors=None):
    """After every sibling is rejected, draw the bonus from p instead of the residual."""
    verdict = acceptance.accept_siblings(p, log_q, children, uniforms, valid, rule, neighbors)
    return acceptance.SiblingVerdict(verdict.accepted, p.clone(), verdict.absorbed)


def conditional_draft_floored(log_q_left: torch.Tensor) -> torch.Tensor:
    """A renormalisation bug once shipped: the drafter mass left after rejected siblings renormalised in probability
    space, its total floored at float32's smallest normal number (patch over acceptance.conditional_draft)."""
    q = log_q_left.exp()
    return q / q.sum(-1, keepdim=True).clamp(min=torch.finfo(q.dtype).tiny)
