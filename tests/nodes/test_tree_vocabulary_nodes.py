"""A tree wider than the model's vocabulary through the nodes: a 3-code c2i model placed in
the models/lantern folders, its drafter loaded by Lantern: Load Drafter; the sampler refuses naive_extend_57
(5 children at the root) and an EAGLE-2 top_k of 4 with the pack's ConfigError naming the tree, the widest
node's child count and the vocabulary size (the message ComfyUI shows), never torch's "selected index k out
of range"; a tree of at most 3 children per node runs."""
from __future__ import annotations

from pathlib import Path

import pytest

from lantern_core.config import GPTConfig, VQConfig
from lantern_core.loading.checkpoint_io import write_safetensors
from tiny_models import random_drafter, random_gpt, random_vq

THREE = GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=3, model_type="c2i", num_classes=3, cls_token_num=1,
                  grid_size=2)
VQ3 = VQConfig(codebook_size=3, codebook_embed_dim=4, ch=32, encoder_ch_mult=(1, 1, 2), decoder_ch_mult=(1, 1, 2),
               z_channels=32, num_res_blocks=1)
DECODING = dict(tree="naive_extend_57", chain_length=4, custom_tree="[[0], [1], [2], [0, 0]]", lantern_k=2,
                delta=0.1, lam=5.0, eagle_depth=3, eagle_top_k=3, eagle_nodes=8)


@pytest.fixture(scope="module")
def three_codes(pack, node):
    import folder_paths
    from lantern_core.loading.drafter_io import save_drafter

    root = Path(folder_paths.get_folder_paths("lantern_checkpoints")[0]).parents[1]  # models/
    target = random_gpt(THREE, seed=3)
    write_safetensors(root / "lantern" / "checkpoints" / "three_codes.safetensors", target.state_dict(),
                      {"kind": "gpt", "config": THREE.to_dict()})
    write_safetensors(root / "lantern" / "vq" / "three_codes_vq.safetensors", random_vq(VQ3).state_dict(),
                      {"kind": "vq", "config": VQ3.to_dict()})
    save_drafter(random_drafter(target), Path(folder_paths.get_folder_paths("lantern_drafters")[0]) / "three_codes")
    model = node["LanternModelLoader"].execute(checkpoint="three_codes.safetensors",
                                               vq_tokenizer="three_codes_vq.safetensors", text_encoder="none",
                                               dtype="fp32").args[0]
    drafter = node["LanternDrafterLoader"].execute(model=model, drafter="three_codes/").args[0]
    return model, drafter


@pytest.mark.parametrize("mode,overrides,refusal", [
    ("static_tree", {}, ("Invalid tree 'naive_extend_57'", "5 children under its widest node")),
    ("lantern_pp", {"tree": "auto"}, ("'naive_extend_57' (the base tree of 'auto')", "5 children")),
    ("eagle2", {"eagle_top_k": 4}, ("Invalid dynamic tree 'eagle2 d3 k4 n8'", "4 children", "eagle_top_k")),
    ("static_tree", {"tree": "custom"}, None),
    ("eagle2", {}, None),
])
def test_the_sampler_names_a_tree_wider_than_the_vocabulary(pack, node, three_codes, mode, overrides, refusal):
    from lantern_pack.lantern_core.errors import ConfigError

    model, drafter = three_codes
    decoding = node["LanternDecodingConfig"].execute(mode=mode, drafter=drafter,
                                                     **{**DECODING, **overrides}).args[0]
    cond = node["LanternConditioning"].execute(model=model, class_name="1", prompt="").args[0]
    sample = lambda: node["LanternSampler"].execute(model=model, conditioning=cond, decoding=decoding,  # noqa: E731
                                                    cfg=2.0, temperature=1.0, top_k=1000, top_p=1.0, seed=0,
                                                    batch_size=2)
    if refusal is None:
        out = sample()
        assert out.args[0].tokens.shape == (2, 4) and int(out.args[0].tokens.max()) < 3
        assert out.ui["lantern_stats"][0]["mode"] == mode
        return
    with pytest.raises(ConfigError) as exc:
        sample()
    text = str(exc.value)
    assert all(part in text for part in refusal), text
    assert "at most 3 children" in text and "3 image codes" in text and "larger vocabulary" in text, text
