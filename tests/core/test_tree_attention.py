"""Tree verification against the static cache: every root-to-leaf path sees exactly what a causal run of
that path would, a chain tree is a causal forward, and compacting the accepted path equals recomputing."""
import pytest
import torch

from lantern_core.models.gpt import ForwardStep
from lantern_core.models.kv_cache import attention_mask
from lantern_core.decoding.trees.specs import MC_SIM_7B_63, build_tree_buffers, chain_tree
from lantern_core.decoding.trees.attention import commit_path, forward_tree
from tiny_models import TINY_C2I, random_gpt
from tolerances import assert_close_to_reference, float64_copy, model_tolerance


def full_hidden(model, labels, tokens):
    """Causal, cache-free hidden states of [class prefix; tokens]."""
    h = torch.cat([model.embed_condition(labels), model.embed_tokens(tokens)], dim=1)
    positions = torch.arange(h.shape[1])
    valid = torch.ones(h.shape[0], h.shape[1], dtype=torch.bool)
    return model(h, ForwardStep(positions, mask=attention_mask(valid, positions, h.shape[1])))


def prefill(model, labels, tokens, max_len):
    """Cache holding the prefix and `tokens`; returns (cache, key_valid, length)."""
    cache = model.allocate_cache(labels.shape[0], max_len)
    h = torch.cat([model.embed_condition(labels), model.embed_tokens(tokens)], dim=1)
    n = h.shape[1]
    positions = torch.arange(n)
    valid = torch.ones(labels.shape[0], max_len, dtype=torch.bool)
    model(h, ForwardStep(positions, cache, n, attention_mask(valid, positions, n)))
    return cache, valid, n


@pytest.mark.parametrize("spec", [MC_SIM_7B_63, chain_tree(4)], ids=lambda s: s.name)
@torch.no_grad()
def test_every_tree_path_matches_a_causal_run(spec):
    model = random_gpt(TINY_C2I, seed=3)
    g = torch.Generator().manual_seed(0)
    labels = torch.tensor([1, 4])
    history = torch.randint(0, 48, (2, 5), generator=g)
    buffers = build_tree_buffers(spec)
    tree_tokens = torch.randint(0, 48, (2, spec.num_nodes + 1), generator=g)
    cache, valid, length = prefill(model, labels, history, max_len=1 + 16 + 16)
    hidden = forward_tree(model, cache, valid, length, tree_tokens, buffers)
    exact = float64_copy(model)  # the causal runs in float64: the check needs no CPU's BLAS
    tol = model_tolerance(hidden.dtype, model.config, extra=0)  # hidden states: no head
    for row in buffers.retrieve:
        path = row[row >= 0]
        reference = full_hidden(exact, labels, torch.cat([history, tree_tokens[:, path]], dim=1))
        assert_close_to_reference(hidden[:, path], reference[:, length:], tol)


@torch.no_grad()
def test_compacting_the_accepted_path_equals_recompute():
    model = random_gpt(TINY_C2I, seed=4)
    g = torch.Generator().manual_seed(1)
    labels = torch.tensor([0, 2])
    history = torch.randint(0, 48, (2, 3), generator=g)
    buffers = build_tree_buffers(MC_SIM_7B_63)
    tree_tokens = torch.randint(0, 48, (2, MC_SIM_7B_63.num_nodes + 1), generator=g)
    cache, valid, length = prefill(model, labels, history, max_len=1 + 16 + 16)
    forward_tree(model, cache, valid, length, tree_tokens, buffers)
    row = buffers.retrieve[1]
    path = row[row >= 0][:3]  # accept the root and two drafted nodes of the second branch
    new_length = commit_path(cache, length, path)
    assert new_length == length + 3
    nxt = torch.randint(0, 48, (2, 1), generator=g)
    step = ForwardStep(torch.tensor([new_length]), cache, new_length + 1)
    cached = model(model.embed_tokens(nxt), step)[:, -1]
    exact = float64_copy(model)  # the causal run in float64: the check needs no CPU's BLAS
    reference = full_hidden(exact, labels, torch.cat([history, tree_tokens[:, path], nxt], dim=1))[:, -1]
    tol = model_tolerance(cached.dtype, model.config, extra=0)  # hidden states: no head
    assert_close_to_reference(cached, reference, tol)
    # without compaction the same step reads the wrong keys: the check above can fail
    cache2, valid2, length2 = prefill(model, labels, history, max_len=1 + 16 + 16)
    forward_tree(model, cache2, valid2, length2, tree_tokens, buffers)
    wrong = model(model.embed_tokens(nxt), ForwardStep(torch.tensor([length2 + 3]), cache2, length2 + 4))[:, -1]
    assert (wrong.double() - reference).abs().max() > 100 * tol * reference.abs().max()  # far beyond the tolerance
