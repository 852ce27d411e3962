"""Emu3 on the shared trunk, in both published layouts (transformers' Emu3-Gen-hf and the original Emu3-Gen with
its tiktoken tokenizer and separate vision tokenizer), checked against transformers' `Emu3ForConditionalGeneration`
and Emu3's own generation recipe: the prompt as its processor writes it (tokenised by `tiktoken` itself), CFG
with its negative prompt on log-softmaxed logits, its prefix constraint (visual tokens, an end-of-line token
after every row), greedy tokens step by step; every decoder keeps the layout and greedy modes equal AR."""
from __future__ import annotations

import json

import pytest
import torch

from lantern_core.config import SamplingConfig
from lantern_core.decoding.generate import generate
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.sampling import make_generators
from lantern_core.errors import CheckpointError, ConfigError
from lantern_core.image_sizes import emu3_ratio_grid, emu3_sizes
from lantern_core.layout import image_codes
from lantern_core.loading.families import detect_family, load_prompted
from lantern_core.prompts import EMU3_NEGATIVE, EMU3_POSITIVE
from lantern_core.decoding.acceptance.neighbors import build_neighbors
from lantern_core.decoding.acceptance.relaxation import Relaxation
from tiny_emu3 import (CODES, TINY_AREA, reference_emu3, special_ids, tiny_ranks, write_hf_folder,
                             write_original_folder)

from tests.tolerances import assert_close_to_reference, float64_copy, model_tolerance

pytest.importorskip("transformers.models.emu3")
GRID = 4


@pytest.fixture(scope="module")
def emu3(tmp_path_factory):
    reference = reference_emu3()
    root = tmp_path_factory.mktemp("emu3")
    folders = {"hf-emu3": write_hf_folder(root / "hf", reference),
               "published": write_hf_folder(root / "published", reference, published_names=True),
               "emu3": write_original_folder(root / "original", reference)}
    loaded = {name: load_prompted(folder, grid_size=GRID, max_prompt_tokens=256) for name, folder in folders.items()}
    return reference, folders, loaded


def test_both_layouts_are_recognised_and_load_the_same_weights(emu3):
    reference, folders, loaded = emu3
    assert detect_family(folders["emu3"]) == ("chameleon", "emu3")
    assert detect_family(folders["hf-emu3"]) == ("chameleon", "hf-emu3")
    hf = loaded["hf-emu3"]
    config = hf.config
    assert not config.qk_norm and config.row_end and config.vocab_size == CODES + 1
    assert (config.n_head, config.n_kv_head, config.rope_base, config.norm_eps) == (4, 2, 1e6, 1e-5)
    assert config.num_image_tokens == GRID * (GRID + 1)
    ids = special_ids(tiny_ranks())
    expected_ids = [ids[f"<|visual token {c:06d}|>"] for c in range(CODES)] + [ids["<|extra_200|>"]]
    for name, one in loaded.items():
        assert one.model.image.token_ids.tolist() == expected_ids, name
        assert one.config == config, name
        for key, value in hf.model.state_dict().items():
            assert torch.equal(one.model.state_dict()[key], value), (name, key)
    assert loaded["published"].source_format == "hf-emu3" and loaded["emu3"].source_format == "emu3"
    # the original's config names its image area (1:1 -> 4 x 4 codes at the tiny area): the default grid
    assert load_prompted(folders["emu3"]).config.grid_shape == emu3_ratio_grid((1, 1), TINY_AREA) == (4, 4)


def test_the_prompt_is_what_emu3s_processor_writes_tokenised_by_tiktoken(emu3):
    tiktoken = pytest.importorskip("tiktoken")
    from lantern_core.tiktoken_bpe import QWEN_PATTERN

    _, _, loaded = emu3
    encoder = loaded["emu3"].encoder
    ranks = tiny_ranks()
    official = tiktoken.Encoding("emu3", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=special_ids(ranks))
    image_prompt = f"<|image start|>{GRID}*{GRID}<|image token|>"
    for prompt in ("a red cat", "the cat**  on the grass\n"):
        text = "<|extra_203|>" + prompt + EMU3_POSITIVE + image_prompt  # its processor's string, BOS first
        assert encoder.token_ids(prompt) == official.encode(text, allowed_special="all")
    # the positive suffix is optional, and a prompt that already ends with it does not get it twice
    plain = "<|extra_203|>" + "a red cat" + image_prompt
    assert encoder.token_ids("a red cat", quality=False) == official.encode(plain, allowed_special="all")
    assert encoder.token_ids("a red cat" + EMU3_POSITIVE) == encoder.token_ids("a red cat")
    assert encoder.encode(["a red cat"], quality=False).prompt_ids[0].tolist()[-len(official.encode(
        plain, allowed_special="all")):] == official.encode(plain, allowed_special="all")
    negative = "<|extra_203|>" + EMU3_NEGATIVE + image_prompt
    cond = encoder.encode(["a red cat"])
    assert cond.uncond_ids[0][cond.uncond_mask[0]].tolist() == official.encode(negative, allowed_special="all")


def emu3_reference_greedy(reference, loaded, prompt: str, cfg: float, eol_shift: int = 0) -> list[int]:
    """Emu3's image_generation.py step by step on transformers' model (float64, full forwards): CFG on
    log-softmaxed logits of the prompt and the negative prompt, then the prefix constraint (end-of-line where
    offset % (W + 1) == 0, visual tokens elsewhere), argmax. `eol_shift` moves the end-of-line rule (a wrong
    variant)."""
    encoder, config = loaded.encoder, loaded.config
    cond = encoder.token_ids(prompt)
    uncond = encoder.uncond_ids(cond)
    visual = loaded.model.image.token_ids[:-1]
    eol = int(loaded.model.image.token_ids[-1])
    out: list[int] = []
    for i in range(config.num_image_tokens):
        with torch.no_grad():
            scores = [torch.log_softmax(reference(input_ids=torch.tensor([ctx + out])).logits[0, -1], -1)
                      for ctx in (cond, uncond)]
        mixed = cfg * (scores[0] - scores[1]) + scores[1]
        if (i + 1 + eol_shift) % (config.cols + 1) == 0:
            out.append(eol)
            continue
        allowed = torch.full_like(mixed, float("-inf"))
        allowed[visual] = 0
        out.append(int((mixed + allowed).argmax()))
    return out


def test_logits_match_transformers_and_greedy_images_match_emu3s_generator(emu3):
    reference, _, loaded = emu3
    exact = float64_copy(reference)
    hf = loaded["hf-emu3"]
    ids = hf.model.image.token_ids
    g = torch.Generator().manual_seed(0)
    prompt = torch.tensor([hf.encoder.token_ids("a red cat")])
    codes = torch.randint(0, CODES + 1, (1, 9), generator=g)
    with torch.no_grad():
        expected = exact(input_ids=torch.cat([prompt, ids[codes]], 1)).logits[..., ids]
        h = torch.cat([hf.model.embed_prompt(prompt), hf.model.embed_tokens(codes)], dim=1)
        from lantern_core.models.gpt import ForwardStep

        ours = hf.model.logits(hf.model(h, ForwardStep(torch.arange(h.shape[1]))))
    assert expected.abs().max() > 1.0
    assert_close_to_reference(ours, expected, model_tolerance(ours.dtype, hf.config))
    for name in ("hf-emu3", "emu3"):
        one = loaded[name]
        for prompt in ("a red cat", "a painting of the sky"):
            with torch.no_grad():
                greedy = SamplingConfig(cfg_scale=3.0, temperature=0.0)
                condition = one.encoder.encode([prompt])
                tokens = generate(one.model, condition, greedy, make_generators(0, 1, "cpu")).tokens[0]
            want = emu3_reference_greedy(exact, one, prompt, 3.0)
            assert one.model.image.token_ids[tokens].tolist() == want, (name, prompt)
            assert len(set(want)) > 4


def test_wrong_variants_are_caught(emu3, tmp_path, monkeypatch):
    """Each piece the checks above rest on, done wrong, is seen: an end-of-line rule one token off, CFG without
    Emu3's negative prompt, q/k kept in rotate-half order (no RoPE permutation)."""
    reference, folders, loaded = emu3
    exact = float64_copy(reference)
    one = loaded["emu3"]
    with torch.no_grad():
        ours = generate(one.model, one.encoder.encode(["a red cat"]), SamplingConfig(cfg_scale=3.0, temperature=0.0),
                        make_generators(0, 1, "cpu")).tokens[0]
    ours = one.model.image.token_ids[ours].tolist()
    assert ours != emu3_reference_greedy(exact, one, "a red cat", 3.0, eol_shift=1)
    plain = one.encoder.token_ids("a red cat")
    assert plain != one.encoder.uncond_ids(plain) and one.encoder.uncond_ids(plain)[0] == plain[0]
    import lantern_core.loading.family_io as family_io

    monkeypatch.setattr(family_io, "permute_rotate_half", lambda weight, heads: weight)
    unpermuted = load_prompted(folders["hf-emu3"], grid_size=GRID, max_prompt_tokens=256)
    with torch.no_grad():
        wrong = generate(unpermuted.model, unpermuted.encoder.encode(["a red cat"]),
                         SamplingConfig(cfg_scale=3.0, temperature=0.0), make_generators(0, 1, "cpu")).tokens[0]
    assert unpermuted.model.image.token_ids[wrong].tolist() != ours


def layout_ok(config, tokens: torch.Tensor) -> bool:
    index = torch.arange(tokens.shape[1])
    row_end = (index + 1) % config.row_stride == 0
    eol = config.vocab_size - 1
    return bool((tokens[:, row_end] == eol).all() and (tokens[:, ~row_end] != eol).all())


@pytest.mark.parametrize("shape", [(GRID, GRID), (3, 6)], ids=["square", "wide"])
def test_every_training_free_decoder_keeps_the_layout_and_greedy_equals_ar(emu3, shape):
    _, _, loaded = emu3
    one = loaded["emu3"]
    model = one.model.with_grid(*shape)
    config = model.config
    from lantern_core.prompts import emu3_format

    encoder = one.encoder.with_format(emu3_format(*shape))
    condition = encoder.encode(["a red cat", "a photo of a dog on the grass"])
    neighbors = build_neighbors(one.vq.embedding.weight, 4)
    runs = {
        "sjd": JacobiConfig(window=4), "sjd_coupled": JacobiConfig(window=4, coupled=True),
        "continuation": JacobiConfig(window=4, continuation=True),
        "proactive": JacobiConfig(window=4, coupled=True, proactive=3, proactive_depth=2),
        "lossless_2d": JacobiConfig(window=4, coupled=True, rows=2, row_window=4, row_offset=-1),
        "sjd_relaxed": JacobiConfig(window=4, relaxation=Relaxation(k=4, lam=1.0)),  # lambda 1: exact
    }
    relaxed_2d = JacobiConfig(window=4, coupled=True, rows=2, row_window=3, row_commit=True, row_lead=0)
    greedy = SamplingConfig(cfg_scale=3.0, temperature=0.0)
    sampled = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)
    with torch.no_grad():
        base = generate(model, condition, greedy, make_generators(0, 2, "cpu")).tokens
        assert layout_ok(config, base)
        for name, jacobi in runs.items():
            table = neighbors if jacobi.relaxation is not None else None
            tokens = jacobi_generate(model, condition, greedy, jacobi, make_generators(0, 2, "cpu"), table).tokens
            assert torch.equal(tokens, base), name
            tokens = jacobi_generate(model, condition, sampled, jacobi, make_generators(5, 2, "cpu"), table).tokens
            assert layout_ok(config, tokens) and tokens.unique().numel() > 6, name
        for sampling in (greedy, sampled):  # lossy: only the layout is promised
            tokens = jacobi_generate(model, condition, sampling, relaxed_2d, make_generators(5, 2, "cpu")).tokens
            assert layout_ok(config, tokens) and tokens.unique().numel() > 6
    codes, grid = image_codes(config, base)
    assert grid == shape and int(codes.max()) < CODES
    step = one.vq.config.downsample
    assert one.vq.decode(codes, grid).shape == (2, 3, shape[0] * step, shape[1] * step)


def test_both_layouts_decode_the_same_images(emu3):
    _, _, loaded = emu3
    codes = torch.randint(0, CODES, (1, GRID * GRID), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = loaded["hf-emu3"].vq.decode(codes, (GRID, GRID))
        b = loaded["emu3"].vq.decode(codes, (GRID, GRID))
    assert torch.equal(a, b) and a.abs().max() > 0.1


def test_fields_a_config_leaves_out_take_emu3s_defaults_and_are_named(emu3, tmp_path):
    """transformers 4.x writes only the fields that differ from the config class's defaults: a text_config
    without key/value heads, eps or RoPE theta means Emu3TextConfig's 8, 1e-5 and 1e6 (not Llama's)."""
    import shutil

    _, folders, _ = emu3
    folder = tmp_path / "diff-only"
    shutil.copytree(folders["hf-emu3"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    for field in ("num_key_value_heads", "rms_norm_eps", "rope_parameters"):
        cfg["text_config"].pop(field)
    cfg["text_config"]["num_attention_heads"] = 8  # so that the default 8 key/value heads divide the heads
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="wqkv"):  # the weights hold 2 key/value heads of width 16
        load_prompted(folder, grid_size=GRID)
    from lantern_core.loading.emu3 import emu3_config

    config, defaults = emu3_config(cfg, "hf-emu3", (GRID, GRID), 64, CODES)
    assert (config.n_kv_head, config.norm_eps, config.rope_base) == (8, 1e-5, 1e6)
    assert set(defaults) == {"num_key_value_heads", "rms_norm_eps", "rope_theta"}


def test_a_text_config_that_spells_out_default_rope_loads_as_plain_rope(emu3, tmp_path):
    """`rope_scaling: {"rope_type": "default"}` (with or without the base) is transformers' spelling of no
    scaling: it loads, with the same weights and RoPE base as the released config; a real scaling is refused."""
    import shutil

    _, folders, loaded = emu3
    reference = loaded["hf-emu3"]
    for scaling in ({"rope_type": "default"}, {"rope_type": "default", "rope_theta": reference.config.rope_base}):
        folder = tmp_path / f"default-rope-{len(scaling)}"
        shutil.copytree(folders["hf-emu3"], folder)
        cfg = json.loads((folder / "config.json").read_text())
        cfg["text_config"]["rope_scaling"] = scaling
        (folder / "config.json").write_text(json.dumps(cfg))
        got = load_prompted(folder, grid_size=GRID)
        assert got.config == reference.config
        cfg["text_config"]["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
        (folder / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(CheckpointError, match="rope_scaling"):
            load_prompted(folder, grid_size=GRID)


def test_sizes_follow_emu3s_processor():
    assert emu3_sizes()[0] == (720, 720)  # Emu3-Gen: 90 x 90 codes
    assert emu3_ratio_grid((16, 9)) == (68, 120)  # round(67.5) = 68: Python's rounding, as its processor
    assert (960, 544) in emu3_sizes()


def test_bad_emu3_folders_are_refused_naming_the_file(emu3, tmp_path):
    reference, _, _ = emu3
    folder = write_original_folder(tmp_path / "wrong-ids", reference, with_vision_tokenizer=False)
    cfg = json.loads((folder / "config.json").read_text())
    loaded = load_prompted(folder, grid_size=GRID)
    assert loaded.vq is None and any("vision tokenizer" in n for n in loaded.notes)
    cfg["eol_token_id"] = cfg["eol_token_id"] + 1
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"emu3\.tiktoken.*<\|extra_200\|>"):
        load_prompted(folder, grid_size=GRID)
    cfg["eol_token_id"] -= 1
    cfg["rope_scaling"] = {"type": "linear", "factor": 2.0}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="rope_scaling"):
        load_prompted(folder, grid_size=GRID)
    cfg["rope_scaling"] = None
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "emu3.tiktoken").unlink()
    with pytest.raises(CheckpointError, match="emu3.tiktoken and emu3_vision_tokens.txt"):
        load_prompted(folder, grid_size=GRID)
    with pytest.raises(ConfigError, match="8-pixel steps"):
        load_prompted(tmp_path / "wrong-ids", image_size=(60, 64))


def test_drafter_modes_with_a_drafter_trained_by_train_drafter(emu3, tmp_path):
    """No drafter is released for Emu3: `train_drafter` distils one from the target's own samples (a few steps),
    and every drafter mode runs on it: greedy equals AR, sampled runs keep the end-of-line layout."""
    from lantern_core.decoding.trees.config import SpeculativeConfig
    from lantern_core.decoding.trees.driver import speculative_generate
    from lantern_core.decoding.trees.specs import NAIVE_EXTEND_57
    from lantern_core.training.train_drafter import Recipe, self_distilled_data, train_drafter

    _, _, loaded = emu3
    one = loaded["hf-emu3"]
    model, config = one.model, one.config
    prompts = one.encoder.encode(["a red cat", "the sky", "a dog on the grass", "a painting"] * 2)
    data = self_distilled_data(model, prompts, SamplingConfig(cfg_scale=3.0, temperature=1.0), seed=7)
    drafter, record = train_drafter(model, data, Recipe(epochs=1, batch=4), tmp_path / "drafter", max_steps=4)
    drafter.eval()
    neighbors = build_neighbors(one.vq.embedding.weight, 4)
    static = dict(tree="static", static_tree=NAIVE_EXTEND_57)
    specs = {"static_tree": SpeculativeConfig(**static), "eagle2": SpeculativeConfig(tree="dynamic"),
             "lantern_pp": SpeculativeConfig(**static, relaxation=Relaxation(k=4, lam=1.0)),
             "lantern": SpeculativeConfig(tree="dynamic", relaxation=Relaxation(k=4, delta=0.0))}
    condition = one.encoder.encode(["a red cat", "a photo of a dog on the grass"])
    greedy = SamplingConfig(cfg_scale=3.0, temperature=0.0)
    sampled = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)
    with torch.no_grad():
        base = generate(model, condition, greedy, make_generators(0, 2, "cpu")).tokens
        for name, spec in specs.items():
            table = neighbors if spec.relaxation is not None else None
            run = speculative_generate(model, drafter, condition, greedy, spec, make_generators(0, 2, "cpu"), table)
            assert torch.equal(run.tokens, base), name
            tokens = speculative_generate(model, drafter, condition, sampled, spec, make_generators(5, 2, "cpu"),
                                          table).tokens
            assert layout_ok(config, tokens) and tokens.unique().numel() > 6, name


def test_batches_equal_single_runs_and_int8_weights_load(emu3):
    """Image i of a sampled coupled-SJD batch is the single run with seed + i (left-padded prompts of other
    lengths); the same folder loads with int8 blocks, whose greedy SJD equals its own greedy AR."""
    _, folders, loaded = emu3
    one = loaded["emu3"]
    prompts = ["a red cat", "a photo of a dog on the grass under the sky"]
    sampled = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)
    jacobi = JacobiConfig(window=4, coupled=True)
    with torch.no_grad():
        batch = jacobi_generate(one.model, one.encoder.encode(prompts), sampled, jacobi,
                                make_generators(11, 2, "cpu")).tokens
        for i, prompt in enumerate(prompts):
            single = jacobi_generate(one.model, one.encoder.encode([prompt]), sampled, jacobi,
                                     make_generators(11 + i, 1, "cpu")).tokens
            assert torch.equal(batch[i], single[0]), prompt
    quantized = load_prompted(folders["hf-emu3"], grid_size=GRID, max_prompt_tokens=256, weights="int8")
    greedy = SamplingConfig(cfg_scale=3.0, temperature=0.0)
    condition = quantized.encoder.encode(prompts)
    with torch.no_grad():
        base = generate(quantized.model, condition, greedy, make_generators(0, 2, "cpu")).tokens
        assert torch.equal(jacobi_generate(quantized.model, condition, greedy, jacobi,
                                           make_generators(0, 2, "cpu")).tokens, base)
    assert any("int8" in note for note in quantized.notes)
