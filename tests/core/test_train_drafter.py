"""Drafter training: the EAGLE loss pairs (f_s, x_{s+1}) with f_{s+1}; a short run lowers it and raises
top-1 agreement with the target; a run stopped and resumed ends bit-identical to an uninterrupted one;
image folders are read for c2i targets with clear errors; the CLI writes the released layout."""
import json

import pytest
import torch

from lantern_core.conditioning import Condition
from lantern_core.config import DrafterConfig, SamplingConfig
from lantern_core.decoding.generate import generate
from lantern_core.decoding.sampling import make_generators
from lantern_core.errors import ConfigError
from lantern_core.loading.drafter_io import load_drafter
from lantern_core.models.drafter import EagleDrafter
from lantern_core.training.train_drafter import (DrafterData, Recipe, drafter_loss, image_folder_data, main,
                                                 teacher_features, train_drafter)
from tests.tiny_models import TINY_C2I, TINY_VQ, random_gpt, random_vq
from tests.tolerances import assert_close_to_reference, float64_copy, model_tolerance


@pytest.fixture(scope="module")
def target():
    return random_gpt(TINY_C2I, seed=2)


@pytest.fixture(scope="module")
def data(target):
    labels = torch.arange(5).repeat(4)
    tokens = generate(target, Condition(labels=labels), SamplingConfig(cfg_scale=2.0),
                      make_generators(0, labels.numel())).tokens
    return DrafterData(tokens, labels, sources=("self-distilled",))


def test_teacher_features_match_the_generation_forward(target, data):
    """f_s used in training equals the target's final hidden state at s in a plain causal run."""
    cond = data.batch(torch.arange(3), target, torch.zeros(3, dtype=torch.bool))
    teacher = teacher_features(target, cond, data.tokens[:3])
    feats, valid, T = teacher.features, teacher.key_valid, teacher.prefix_len
    assert T == 1 and teacher.prefix_ids is None and feats.shape == (3, TINY_C2I.num_image_tokens, TINY_C2I.dim) and valid.all()
    with torch.no_grad():  # a plain causal run (is_causal, not our mask) in float64: needs no CPU's BLAS
        logits = float64_copy(target).training_logits(cond.labels, data.tokens[:3])
    assert_close_to_reference(target.logits(feats), logits, model_tolerance(feats.dtype, target.config))


def test_unconditional_rows_use_the_null_class(target, data):
    cond = data.batch(torch.arange(4), target, torch.tensor([True, False, True, False]))
    assert cond.labels.tolist()[0] == cond.labels.tolist()[2] == TINY_C2I.num_classes


def test_a_short_run_learns_and_resume_is_exact(tmp_path, target, data):
    recipe = Recipe(epochs=10, batch=4, lr=5e-3, checkpoint_every=7, seed=1)
    g = torch.Generator().manual_seed(0)
    fresh = EagleDrafter(DrafterConfig.for_target(TINY_C2I))
    fresh.init_from_target(target, torch.Generator().manual_seed(recipe.seed))
    cond = data.batch(torch.arange(8), target, torch.zeros(8, dtype=torch.bool))
    before = drafter_loss(fresh, target, cond, data.tokens[:8], recipe, g)[1]
    whole, record = train_drafter(target, data, recipe, tmp_path / "whole")
    after = drafter_loss(whole, target, cond, data.tokens[:8], recipe, torch.Generator().manual_seed(0))[1]
    assert record["finished"] and after["loss"] < 0.85 * before["loss"] and after["top1"] > before["top1"]
    _, part = train_drafter(target, data, recipe, tmp_path / "split", max_steps=11)
    assert not part["finished"] and (tmp_path / "split" / "train_state.pt").is_file()
    resumed, record2 = train_drafter(target, data, recipe, tmp_path / "split", resume=True)
    assert record2["finished"]
    for key, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key
    with pytest.raises(ConfigError, match="resume"):
        train_drafter(target, data, Recipe(epochs=7, batch=4), tmp_path / "split", resume=True)


def test_image_folders_for_c2i(tmp_path, target):
    from PIL import Image

    vq = random_vq(TINY_VQ)
    for cls in ("0", "3"):
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.new("RGB", (40 + 9 * i, 30), (40 * i, 90, 200)).save(tmp_path / cls / f"{i}.png")
    data = image_folder_data(tmp_path, target, vq, None)
    assert data.tokens.shape == (4, TINY_C2I.num_image_tokens) and data.labels.tolist() == [0, 0, 3, 3]
    (tmp_path / "dogs").mkdir()
    with pytest.raises(ConfigError, match="class folder"):
        image_folder_data(tmp_path, target, vq, None)


def test_cli_trains_the_embedded_target_into_the_released_layout(tmp_path):
    out = tmp_path / "drafter"
    assert main(["--target", "embedded", "--out", str(out), "--crops-per-class", "2", "--epochs", "1",
                 "--batch", "4"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 1 and cfg["lantern"]["grid_size"] == 16
    log = json.loads((out / "training_log.json").read_text())
    assert log["steps"] == 4 and log["finished"]
    from lantern_core.loading.embedded import load_embedded

    loaded = load_drafter(out, load_embedded().gpt.config)
    assert loaded.model.embed_tokens.weight.dtype == torch.float32
    assert main(["--target", "embedded", "--out", str(tmp_path / "x"), "--images", str(tmp_path / "none")]) == 2
