"""One rule for a prefix's shape (`conditioning.prefix_shape`): rows, length and padding of what `build_prefix`
makes, for every kind of condition, and the memory planner's meta-device prefix made from the same rule; the
drafter's prefix features take that `padded` flag instead of reading the key mask (so they also run on the
meta device, where no value can be read)."""
from __future__ import annotations

import pytest
import torch

from lantern_core.conditioning import Condition, Prefix, build_prefix, prefix_shape
from lantern_core.config import GPTConfig
from lantern_core.decoding.reservation import meta_prefix, meta_twin
from lantern_core.decoding.trees.prefix_states import drafter_features
from lantern_core.errors import ConfigError
from lantern_core.models.prompted import PromptedImageLM
from tiny_models import TINY_C2I, TINY_T2I, random_gpt

PROMPTED = GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=4, model_type="prompt", family="chameleon", rope_dims=1,
                     row_end=True, text_vocab_size=16, grid_size=2, cls_token_num=8, qk_norm=True)


def prompted_model() -> PromptedImageLM:
    model = PromptedImageLM(PROMPTED)
    model.init_weights(torch.Generator().manual_seed(0), std=0.3)
    return model.eval()


def prompt(lengths: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids (B, width) and their mask for prompts of `lengths` tokens."""
    mask = torch.arange(width)[None] >= (width - torch.tensor(lengths))[:, None]
    return torch.where(mask, torch.tensor(5), torch.tensor(0)), mask


def t2i_caption(lengths: list[int] | None) -> Condition:
    caption = torch.randn(2, TINY_T2I.cls_token_num, TINY_T2I.caption_dim, generator=torch.Generator().manual_seed(3))
    if lengths is None:
        return Condition(caption=caption)
    return Condition(caption=caption, caption_mask=torch.arange(TINY_T2I.cls_token_num)[None]
                     >= (TINY_T2I.cls_token_num - torch.tensor(lengths))[:, None])


def prompted(cond: list[int], width: int, uncond: list[int], uncond_width: int) -> Condition:
    ids, mask = prompt(cond, width)
    u_ids, u_mask = prompt(uncond, uncond_width)
    return Condition(prompt_ids=ids, prompt_mask=mask, uncond_ids=u_ids, uncond_mask=u_mask)


CASES = {  # name: (model maker, condition maker); each a branch of the rule
    "c2i": (lambda: random_gpt(TINY_C2I), lambda: Condition.classes([1, 3])),
    "t2i unpadded (no mask)": (lambda: random_gpt(TINY_T2I), lambda: t2i_caption(None)),
    "t2i full mask": (lambda: random_gpt(TINY_T2I), lambda: t2i_caption([TINY_T2I.cls_token_num] * 2)),
    "t2i padded": (lambda: random_gpt(TINY_T2I), lambda: t2i_caption([TINY_T2I.cls_token_num, 3])),
    "prompt, one-token uncond": (prompted_model, lambda: prompted([3, 3], 3, [1, 1], 1)),
    "prompt, uncond shorter": (prompted_model, lambda: prompted([4, 4], 4, [2, 2], 2)),
    "prompt, uncond longer": (prompted_model, lambda: prompted([2, 2], 2, [5, 5], 5)),
    "prompt, padded cond": (prompted_model, lambda: prompted([4, 2], 4, [4, 4], 4)),
    "prompt, all full": (prompted_model, lambda: prompted([3, 3], 3, [3, 3], 3)),
}


@pytest.mark.parametrize("guided", [False, True], ids=["unguided", "guided"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_shape_rule_is_what_the_builders_make_and_what_the_planner_plans(name, guided):
    make_model, make_condition = CASES[name]
    model, condition = make_model(), make_condition()
    shape = prefix_shape(model.config, condition, guided)
    prefix = build_prefix(model, condition, guided)
    rows, length = prefix.key_valid.shape
    assert (shape.rows, shape.length) == (rows, length) == prefix.embeddings.shape[:2]
    assert shape.padded == prefix.padded == (not bool(prefix.key_valid.all()))
    assert shape.prompted == (prefix.token_ids is not None)
    planned = meta_prefix(meta_twin(model)[0], condition, guided)
    assert planned.embeddings.device.type == "meta" and planned.embeddings.shape == prefix.embeddings.shape
    assert planned.padded == prefix.padded and (planned.token_ids is None) == (prefix.token_ids is None)


def test_the_cases_reach_both_answers_of_padded():
    """The grid above is only a check if it holds padded and unpadded prefixes of every kind."""
    seen = {(name.split(",")[0].split(" ")[0], prefix_shape(make_model().config, make_condition(), guided).padded)
            for name, (make_model, make_condition) in CASES.items() for guided in (False, True)}
    assert seen >= {("c2i", False), ("t2i", False), ("t2i", True), ("prompt", False), ("prompt", True)}


def test_a_condition_of_the_wrong_kind_is_refused_before_any_tensor_is_made():
    for config, condition, needed in ((TINY_C2I, t2i_caption(None), "class labels"),
                                      (TINY_T2I, Condition.classes([1]), "caption features"),
                                      (PROMPTED, Condition.classes([1]), "prompt token ids")):
        with pytest.raises(ConfigError, match=needed):
            prefix_shape(config, condition, guided=True)


def test_drafter_features_follow_the_padded_flag_not_the_key_mask():
    """hf_port features replace the padded rows only when the prefix says it is padded; on the meta device (the
    planner's dry run) the same call runs, where reading the mask would raise."""
    model = random_gpt(TINY_T2I)
    prefix = build_prefix(model, t2i_caption([TINY_T2I.cls_token_num, 3]), guided=True)
    hidden = torch.randn(*prefix.embeddings.shape, generator=torch.Generator().manual_seed(1))
    assert prefix.padded
    replaced = drafter_features(model, prefix, hidden, "hf_port")
    assert not torch.equal(replaced, hidden)
    assert torch.equal(replaced[prefix.key_valid], hidden[prefix.key_valid])  # valid rows keep the prefill's bits
    unflagged = Prefix(prefix.embeddings, prefix.key_valid, padded=False)
    assert drafter_features(model, unflagged, hidden, "hf_port") is hidden
    assert drafter_features(model, prefix, hidden, "native") is hidden
    meta = meta_twin(model)[0]
    on_meta = Prefix(torch.empty(prefix.embeddings.shape, device="meta"), torch.ones(prefix.key_valid.shape,
                     dtype=torch.bool, device="meta"), padded=True)
    features = drafter_features(meta, on_meta, torch.empty(hidden.shape, device="meta"), "hf_port")
    assert features.device.type == "meta" and features.shape == hidden.shape
    with pytest.raises(Exception):  # noqa: B017 -- what the old rule did: read the mask, impossible on meta
        bool(on_meta.key_valid.all())
