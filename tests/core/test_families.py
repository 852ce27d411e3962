"""Chameleon and Janus-Pro on the shared machinery, checked against transformers' own implementations:
tiny random models are built with transformers' classes, saved as real folders, loaded by our loader,
and must give the same logits for prompt + image tokens and the same VQ decodes."""
from __future__ import annotations

import pytest
import torch

from lantern_core.config import SamplingConfig
from lantern_core.errors import CheckpointError
from lantern_core.loading.families import detect_family, load_prompted
from lantern_core.decoding.generate import generate
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.models.gpt import ForwardStep
from lantern_core.prompts import chameleon_image_token_ids
from tests.tolerances import assert_close_to_reference, float64_copy, model_tolerance, vq_decode_tolerance
from tests.tiny_families import (IMAGE_CODES, chameleon_vocab, save_chameleon_folder, save_deepseek_janus_folder,
                                 save_janus_folder)

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def chameleon(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chameleon")
    return save_chameleon_folder(folder), folder


@pytest.fixture(scope="module")
def janus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("janus")
    return save_janus_folder(folder), folder


def _ours_logits(model, prompt: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    h = torch.cat([model.embed_prompt(prompt), model.embed_tokens(codes)], dim=1)
    return model.logits(model(h, ForwardStep(torch.arange(h.shape[1]))))


@pytest.mark.parametrize("swin_norm", [False, True])
def test_chameleon_logits_match_transformers(tmp_path, swin_norm):
    reference = save_chameleon_folder(tmp_path, swin_norm=swin_norm, seed=3)
    loaded = load_prompted(tmp_path)
    assert loaded.source_format == "hf-chameleon" and loaded.config.qk_norm and loaded.config.swin_norm == swin_norm
    assert loaded.config.norm_eps == reference.config.rms_norm_eps  # its effect (~1e-5) hides under float32's rounding
    ids = loaded.model.image.token_ids
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 90, (2, 7), generator=g)
    codes = torch.randint(0, IMAGE_CODES, (2, 9), generator=g)
    exact = float64_copy(reference)  # transformers' model in float64: the comparison needs no CPU's BLAS
    with torch.no_grad():
        hidden = exact.model(input_ids=torch.cat([prompt, ids[codes]], 1)).last_hidden_state
        expected = exact.lm_head(hidden)[..., ids]  # the image-token columns, in code order
        ours = _ours_logits(loaded.model, prompt, codes)
    assert expected.abs().max() > 1.0  # the comparison is not between near-zero numbers
    assert_close_to_reference(ours, expected, model_tolerance(ours.dtype, loaded.config))


def test_chameleon_image_ids_come_from_names(chameleon):
    _, folder = chameleon
    loaded = load_prompted(folder)
    vocab = chameleon_vocab()
    ids = loaded.model.image.token_ids
    for code in (0, 7, 63):
        name = "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"
        assert int(ids[code]) == vocab[name]
    assert not torch.equal(ids, torch.arange(4, 4 + IMAGE_CODES))  # shuffled: no "id - 4" shortcut


def test_janus_logits_and_vq_match_transformers(janus):
    reference, folder = janus
    loaded = load_prompted(folder)
    assert loaded.source_format == "hf-janus" and loaded.config.grid_size == 4
    assert loaded.config.norm_eps == reference.config.text_config.rms_norm_eps  # its effect hides under the rounding
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 48, (2, 6), generator=g)
    codes = torch.randint(0, IMAGE_CODES, (2, 16), generator=g)
    exact = float64_copy(reference)  # transformers' model in float64: the comparisons need no CPU's BLAS
    with torch.no_grad():
        emb = torch.cat([exact.get_input_embeddings()(prompt), exact.prepare_embeddings_for_image_generation(codes)], 1)
        expected = exact.model.generation_head(exact.model.language_model(inputs_embeds=emb).last_hidden_state)
        ours = _ours_logits(loaded.model, prompt, codes)
        # 2 reductions outside the layers on each side: the aligner's 2 linears, the head's 2 linears
        assert_close_to_reference(ours, expected, model_tolerance(ours.dtype, loaded.config, extra=4))
        image_ref = exact.model.vqmodel.decode(codes)
        image_ours = loaded.vq.decode(codes)
    assert image_ours.shape == image_ref.shape == (2, 3, 8, 8)
    assert_close_to_reference(image_ours, image_ref, vq_decode_tolerance(image_ours.dtype, loaded.vq))


def test_deepseek_janus_layout_loads_the_same_model(janus, tmp_path):
    reference, folder = janus
    save_deepseek_janus_folder(tmp_path, reference)
    assert detect_family(tmp_path) == ("janus", "deepseek-janus")
    hf, ds = load_prompted(folder), load_prompted(tmp_path, grid_size=4)
    assert ds.vq.config.codebook_show_usage and not hf.vq.config.codebook_show_usage
    codes = torch.randint(0, IMAGE_CODES, (1, 16), generator=torch.Generator().manual_seed(2))
    prompt = torch.tensor([[0, 7, 10, 11, 8, 4]])
    with torch.no_grad():
        torch.testing.assert_close(_ours_logits(ds.model, prompt, codes), _ours_logits(hf.model, prompt, codes))
        torch.testing.assert_close(ds.vq.decode(codes), hf.vq.decode(codes))


def test_greedy_generation_matches_transformers_janus_generate(janus):
    """Whole-image parity: our static-cache AR loop (CFG rows built by our prompt encoder) picks the same
    576-style token sequence as transformers' Janus `generate(generation_mode="image")` when greedy."""
    reference, folder = janus
    loaded = load_prompted(folder)
    condition = loaded.encoder.encode(["a red cat on the grass"])
    from transformers import GenerationConfig

    settings = GenerationConfig(do_sample=False, guidance_scale=5.0, bos_token_id=0, pad_token_id=2,
                                generation_kwargs={"boi_token_id": 4})
    expected = reference.generate(condition.prompt_ids, attention_mask=torch.ones_like(condition.prompt_ids),
                                  generation_mode="image", generation_config=settings)
    ours = generate(loaded.model, condition, SamplingConfig(cfg_scale=5.0, temperature=0.0)).tokens
    assert expected.unique().numel() >= 8  # a varied image, not one repeated code
    assert torch.equal(ours, expected)


def test_prompt_encoders_build_each_familys_cfg_rows(chameleon, janus):
    j = load_prompted(janus[1]).encoder
    cond = j.encode(["a cat", "a red dog on the grass"])
    row = cond.prompt_ids[1][cond.prompt_mask[1]].tolist()
    assert row[0] == 0 and row[-1] == 4  # BOS ... <begin_of_image>
    urow = cond.uncond_ids[1][cond.uncond_mask[1]].tolist()
    assert urow == [0] + [2] * (len(row) - 2) + [4]  # pads inside, as DeepSeek's generator
    assert not cond.prompt_mask[0, 0] and cond.prompt_mask[0, -1]  # left padding
    c = load_prompted(chameleon[1]).encoder
    vocab = chameleon_vocab()
    cc = c.encode(["a photo of a cat"])
    assert cc.prompt_ids[0].tolist()[-2:] == [vocab["<reserved08706>"], vocab["<racm3:break>"]]
    assert cc.prompt_ids[0, 0] == 0 and cc.uncond_ids[0].tolist() == [0, vocab["<racm3:break>"]]


@pytest.mark.parametrize("family", ["chameleon", "janus"])
def test_decoders_run_on_every_family(family, chameleon, janus):
    """AR and every Jacobi mode on the prompted families: greedy SJD (plain and coupled) equals greedy AR
    token for token; sampled runs are reproducible by seed; a batch of prompts of different lengths
    equals the prompts run one by one (left padding is invisible)."""
    folder = (chameleon if family == "chameleon" else janus)[1]
    loaded = load_prompted(folder, grid_size=4)
    model, enc = loaded.model, loaded.encoder
    greedy = SamplingConfig(cfg_scale=3.0, temperature=0.0)
    cond = enc.encode(["a cat", "a blue painting of the sky"])
    ar = generate(model, cond, greedy).tokens
    for config in (JacobiConfig(window=5), JacobiConfig(window=5, coupled=True),
                   JacobiConfig(window=2, coupled=True, rows=2, row_window=2, row_offset=0),  # lossless 2-D too
                   JacobiConfig(window=3, coupled=True, proactive=3, proactive_depth=2)):  # and proactive leaves
        assert torch.equal(jacobi_generate(model, cond, greedy, config).tokens, ar), config.describe()
    relaxed = JacobiConfig(window=3, coupled=True, rows=3, row_window=2, row_commit=True, row_lead=0)
    rows = jacobi_generate(model, cond, greedy, relaxed).tokens  # relaxed 2-D: left padding stays invisible
    assert torch.equal(rows, torch.cat([jacobi_generate(model, enc.encode([p]), greedy, relaxed).tokens
                                        for p in ("a cat", "a blue painting of the sky")]))
    assert rows.min() >= 0 and rows.max() < IMAGE_CODES
    one_by_one = torch.cat([generate(model, enc.encode([p]), greedy).tokens for p in ("a cat", "a blue painting of the sky")])
    assert torch.equal(one_by_one, ar)
    sampling = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)
    gen = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
    for config in (JacobiConfig(window=4, coupled=True), JacobiConfig(window=4),
                   JacobiConfig(window=4, proactive=3, proactive_depth=2)):
        a = jacobi_generate(model, cond, sampling, config, generator=gen(5)).tokens
        assert torch.equal(a, jacobi_generate(model, cond, sampling, config, generator=gen(5)).tokens)
        assert a.min() >= 0 and a.max() < IMAGE_CODES


def test_loader_errors_name_the_problem(tmp_path, chameleon):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(CheckpointError, match="model_type"):
        load_prompted(tmp_path)
    folder = chameleon[1]
    bad = tmp_path / "no_tokenizer"
    bad.mkdir()
    for f in folder.iterdir():
        if f.name != "tokenizer.json":
            (bad / f.name).write_bytes(f.read_bytes())
    with pytest.raises(CheckpointError, match="tokenizer"):
        load_prompted(bad)
    from tests.tiny_families import write_tokenizer
    write_tokenizer(bad / "tokenizer.json", {"<s>": 0, "<unk>": 1}, ["<s>"])
    with pytest.raises(CheckpointError, match="IMGIMG"):
        load_prompted(bad)


def test_image_token_table_rejects_an_incomplete_vocabulary(tmp_path):
    from lantern_core.prompts import load_tokenizer
    from tests.tiny_families import write_tokenizer

    vocab = chameleon_vocab()
    vocab.pop("IMGIMGHZ")  # code 7
    path = tmp_path / "tokenizer.json"
    write_tokenizer(path, {k: i for i, k in enumerate(vocab)}, ["<s>"])
    with pytest.raises(CheckpointError, match="63"):
        chameleon_image_token_ids(load_tokenizer(path), IMAGE_CODES, path)


def test_chameleon_vqgan_loads_from_a_taming_checkpoint_and_encodes_like_transformers(tmp_path):
    """Chameleon's VQGAN (taming layout, as Meta's vqgan.ckpt: Lightning `state_dict` with `loss.*`
    discriminator entries) loads strictly; its encoder + quantiser give the same codes as transformers'
    ChameleonVQVAE holding the same weights, and the decoder is the one written (decode round trip)."""
    from transformers import ChameleonVQVAE, ChameleonVQVAEConfig

    from lantern_core.loading.families import load_chameleon_vq
    from tests.tiny_families import save_chameleon_vqgan

    source, sd = save_chameleon_vqgan(tmp_path / "vqgan.ckpt")
    vq, where = load_chameleon_vq(tmp_path)
    assert where.endswith("vqgan.ckpt") and vq.config == source.config
    reference = ChameleonVQVAE(ChameleonVQVAEConfig(
        embed_dim=16, num_embeddings=IMAGE_CODES, latent_channels=32, base_channels=32, channel_multiplier=[1, 2],
        num_res_blocks=1, resolution=16, attn_resolutions=[])).eval()
    reference.load_state_dict({k: v for k, v in sd.items() if not k.startswith(("decoder.", "loss."))})
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    codes = torch.randint(0, IMAGE_CODES, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference.encode(images).image_tokens.reshape(2, -1)
        assert expected.unique().numel() > 4
        assert torch.equal(vq.encode(images), expected)
        torch.testing.assert_close(vq.decode(codes), source.decode(codes))


def test_family_benchmark_writes_a_report(tmp_path):
    """`python -m lantern_core.benchmarks.families` on the CPU: every family (Anole, Lumina, Janus), every method
    (AR, Jacobi, drafter modes with a briefly trained drafter), cost curve, files. The code paths at the smallest
    size (the micro shapes, 4 x 4 tokens); the CPU-sized tiny shapes run in `make bench`."""
    from lantern_core.benchmarks.families import main

    report = main(["--out", str(tmp_path), "--images", "1", "--train-steps", "2", "--grid", "4",
                   "--models", "chameleon:micro", "lumina:micro", "janus:micro"])
    assert [r["model"] for r in report["rows"]] == ["chameleon micro (random)", "lumina micro (random)",
                                                    "janus micro (random)"]
    assert report["rows"][1]["image_tokens"] == 4 * 5  # Lumina: an end-of-row token per row
    for row in report["rows"]:
        assert set(row["methods"]) == {"ar", "sjd", "sjd_coupled", "sjd_coupled 2-D", "sjd_2d_relaxed", "static_tree",
                                       "lantern_pp"}
        assert row["methods"]["ar"]["forward_passes"] == row["image_tokens"]
        assert all((m["graphs"], m["compiled"], m["fell_back"]) == ("off", "off", False)
                   for m in row["methods"].values())
        for name in ("sjd_coupled", "sjd_coupled 2-D", "sjd_2d_relaxed", "static_tree", "lantern_pp"):
            assert row["methods"][name]["forward_passes"] <= row["image_tokens"]
        assert [n for n, _ in row["curve_ms"]][:2] == [1, 2] and all(ms > 0 for _, ms in row["curve_ms"])
    # Lumina's forced end-of-row drafts are always accepted, so drafting passes > 1 token per step even untrained
    assert report["rows"][1]["methods"]["lantern_pp"]["mean_accepted_length"] > 1.0
    assert (tmp_path / "families_cpu_float32.md").read_text().count("| janus micro (random) |") == 7
