"""Exact decoding modes sample the AR law over whole images on the prompted layouts with forced tokens: Emu3's
(GQA without QK-norm, RoPE base 1e6) and Lumina-mGPT 2.0's (QK-norm), each row of codes closed by a forced
end-of-row token.

Tiny random prompted models (2 rows of 2 codes from 3, plus the end-of-row code: 81 images of 6 tokens) with a
prompt and an unconditional row of other lengths under CFG. The law is enumerated from full teacher-forced
forwards of each row on its own (no padding, no cache), CFG-mixed, with the layout rule written here (the
end-of-row token certain at a row's end, impossible elsewhere), independently of `layout.constrain` and of the
decoders under test; images are compared by a pooled chi-square (`tests/whole_image_law.py`). An image the law
gives probability 0 (an end-of-row token out of place) fails at once; a sampler at the wrong temperature is
rejected by the same test (its power)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch

from lantern_core.conditioning import Condition
from lantern_core.config import DrafterConfig, GPTConfig, SamplingConfig
from lantern_core.decoding.generate import generate
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.trees.config import SpeculativeConfig
from lantern_core.decoding.trees.driver import speculative_generate
from lantern_core.decoding.trees.drafting import DynamicShape
from lantern_core.decoding.trees.specs import TreeSpec
from lantern_core.models.drafter import EagleDrafter
from lantern_core.models.gpt import ForwardStep
from lantern_core.models.prompted import PromptedImageLM
from tests.whole_image_law import ImageLaw, pooled_pvalue

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # kilobyte models

PASS, FAIL = 1e-3, 1e-6
CODES, ROWS, COLS = 3, 2, 2
LAYOUTS = {
    "emu3": GPTConfig(dim=32, n_layer=2, n_head=2, n_kv_head=1, ffn_dim=48, vocab_size=CODES + 1, model_type="prompt",
                      family="chameleon", text_vocab_size=16, qk_norm=False, rope_dims=1, rope_base=1e6,
                      norm_eps=1e-5, grid_size=ROWS, grid_cols=0, cls_token_num=8, row_end=True),
    "lumina2": GPTConfig(dim=32, n_layer=2, n_head=2, ffn_dim=48, vocab_size=CODES + 1, model_type="prompt",
                         family="chameleon", text_vocab_size=16, qk_norm=True, rope_dims=1, grid_size=ROWS,
                         cls_token_num=8, row_end=True),
}
PROMPT, UNCOND = [9, 3, 11, 5, 14], [9, 12]  # a prompt and a shorter unconditional row
CFG2 = SamplingConfig(cfg_scale=2.0, temperature=1.0)
# at most 3 children a node (the 3 draftable codes), deeper than a row: drafts cross the forced end-of-row token
TREE = TreeSpec("branching_7", ((0,), (1,), (2,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 0, 0)))


@dataclass(frozen=True)
class Case:
    layout: str
    mode: str  # "ar", "sjd_coupled", "proactive", "static", "dynamic"
    images: int


CASES = {"emu3_sjd_coupled": Case("emu3", "sjd_coupled", 2500), "emu3_static_tree": Case("emu3", "static", 2500),
         "lumina2_proactive": Case("lumina2", "proactive", 2500), "lumina2_eagle2": Case("lumina2", "dynamic", 2500)}
_MODELS: dict[str, tuple] = {}


def models_for(layout: str) -> tuple[PromptedImageLM, EagleDrafter]:
    if layout not in _MODELS:
        config = LAYOUTS[layout]
        model = PromptedImageLM(config)
        model.init_weights(torch.Generator().manual_seed(3), std=0.6)  # peaked, varied laws
        drafter = EagleDrafter(DrafterConfig.for_target(config, ffn_dim=48))
        drafter.init_from_target(model, torch.Generator().manual_seed(4), std=0.3)
        _MODELS[layout] = (model.eval(), drafter.eval())
    return _MODELS[layout]


def condition(batch: int) -> Condition:
    ids, u_ids = torch.tensor([PROMPT] * batch), torch.tensor([UNCOND] * batch)
    return Condition(prompt_ids=ids, prompt_mask=ids.bool(), uncond_ids=u_ids, uncond_mask=u_ids.bool())


@torch.no_grad()
def forced_layout_law(model: PromptedImageLM, sampling: SamplingConfig) -> ImageLaw:
    """Every image's probability: teacher-forced logits of the prompt row and the unconditional row, each
    forwarded alone; CFG; the end-of-row token forced at each row's end and refused elsewhere; log-softmax."""
    config = model.config
    eol, stride = config.vocab_size - 1, config.cols + 1
    images = torch.tensor(list(itertools.product(range(config.vocab_size), repeat=config.num_image_tokens)))
    # (4096, 6) every token sequence in base-V order; the 81 with end-of-row tokens in place get the mass
    logits = []
    for prompt in (PROMPT, UNCOND):
        ids = torch.tensor([prompt]).expand(len(images), -1)
        h = torch.cat([model.embed_prompt(ids), model.embed_tokens(images[:, :-1])], dim=1)
        out = model.logits(model(h, ForwardStep(torch.arange(h.shape[1]))))
        logits.append(out[:, len(prompt) - 1:].float())  # (4096, 6, V): position t predicts image token t
    mixed = logits[1] + sampling.cfg_scale * (logits[0] - logits[1])
    at_row_end = (torch.arange(images.shape[1]) + 1) % stride == 0
    rule = torch.zeros(images.shape[1], config.vocab_size)
    rule[at_row_end, :eol] = float("-inf")
    rule[~at_row_end, eol] = float("-inf")
    log_p = ((mixed + rule) / sampling.temperature).log_softmax(-1).double()  # -inf: an impossible token
    chosen = log_p.gather(-1, images[..., None])[..., 0].sum(1)
    return ImageLaw(images, chosen.exp(), config.vocab_size)


_LAWS: dict[tuple, ImageLaw] = {}


def law_for(layout: str, sampling: SamplingConfig) -> ImageLaw:
    if (layout, sampling) not in _LAWS:
        _LAWS[(layout, sampling)] = forced_layout_law(models_for(layout)[0], sampling)
    return _LAWS[(layout, sampling)]


@torch.no_grad()
def decode(case: Case, sampling: SamplingConfig = CFG2, seed: int = 321) -> torch.Tensor:
    model, drafter = models_for(case.layout)
    cond, generators = condition(case.images), make_generators(seed, case.images)
    if case.mode == "ar":
        return generate(model, cond, sampling, generators).tokens
    if case.mode in ("sjd_coupled", "proactive"):
        config = JacobiConfig(window=3, coupled=True, **(dict(proactive=2, proactive_depth=2)
                                                          if case.mode == "proactive" else {}))
        return jacobi_generate(model, cond, sampling, config, generators).tokens
    spec = SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(depth=4, top_k=3, nodes=8)) \
        if case.mode == "dynamic" else SpeculativeConfig(tree="static", static_tree=TREE)
    return speculative_generate(model, drafter, cond, sampling, spec, generators).tokens


def test_the_forced_layout_law_sums_to_one():
    for layout in LAYOUTS:
        assert abs(float(law_for(layout, CFG2).probs.sum()) - 1.0) < 1e-5


@pytest.mark.parametrize("name", sorted(CASES))
def test_exact_mode_samples_the_ar_law_on_a_forced_token_layout(name):
    case = CASES[name]
    p = pooled_pvalue(law_for(case.layout, CFG2), decode(case))
    assert p > PASS, f"{name}: whole-image chi-square p = {p:.3g}"


def test_a_miscalibrated_sampler_is_rejected_on_the_forced_layout():
    hot = SamplingConfig(cfg_scale=2.0, temperature=1.3)
    assert pooled_pvalue(law_for("emu3", CFG2), decode(Case("emu3", "ar", 2500), hot)) < FAIL
