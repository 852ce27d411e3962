"""A text-to-image model through the nodes: tiny random LlamaGen-t2i GPT, VQ and T5 files placed in the
models/lantern folders, picked in the loader's combos, prompt -> tokens -> IMAGE."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lantern_core.loading.checkpoint_io import write_safetensors
from lantern_core.config import GPTConfig, VQConfig
from tiny_models import random_gpt, random_vq

T2I = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=32, model_type="t2i", caption_dim=16, cls_token_num=8,
                grid_size=4)
VQ = VQConfig(codebook_size=32, codebook_embed_dim=4, ch=32, encoder_ch_mult=(1, 1, 2), decoder_ch_mult=(1, 1, 2),
              z_channels=32, num_res_blocks=1)


@pytest.fixture(scope="module")
def files(pack):
    import folder_paths

    root = Path(folder_paths.get_folder_paths("lantern_checkpoints")[0]).parents[1]  # models/
    ckpt = root / "lantern" / "checkpoints" / "tiny_t2i.safetensors"
    vq = root / "lantern" / "vq" / "tiny_vq.safetensors"
    t5 = root / "lantern" / "text_encoders" / "tiny-t5"
    for p in (ckpt.parent, vq.parent, t5):
        p.mkdir(parents=True, exist_ok=True)
    write_safetensors(ckpt, random_gpt(T2I).state_dict(), {"kind": "gpt", "config": T2I.to_dict()})
    write_safetensors(vq, random_vq(VQ).state_dict(), {"kind": "vq", "config": VQ.to_dict()})
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    words = ["<pad>", "</s>", "<unk>", "a", "red", "cat", "blue", "dog"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(str(t5))
    torch.manual_seed(0)  # test-only: transformers initialises from the global generator
    T5EncoderModel(T5Config(vocab_size=len(words), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)).save_pretrained(str(t5))
    return ckpt, vq, t5


def test_t2i_model_runs_through_the_nodes(pack, files, node):
    nodes = node
    schema = nodes["LanternModelLoader"].define_schema()
    options = {i.id: i.options for i in schema.inputs if hasattr(i, "options")}
    assert "tiny_t2i.safetensors" in options["checkpoint"]
    assert "tiny_vq.safetensors" in options["vq_tokenizer"]
    assert "tiny-t5/" in options["text_encoder"]
    from lantern_pack.lantern_core.errors import LanternError

    with pytest.raises(LanternError, match="text_encoder"):
        nodes["LanternModelLoader"].execute(checkpoint="tiny_t2i.safetensors", vq_tokenizer="tiny_vq.safetensors",
                                            text_encoder="none", dtype="fp32")
    model = nodes["LanternModelLoader"].execute(checkpoint="tiny_t2i.safetensors", vq_tokenizer="tiny_vq.safetensors",
                                                text_encoder="tiny-t5/", dtype="fp32").args[0]
    assert model.text_encoder is not None and model.config.model_type == "t2i"
    with pytest.raises(LanternError, match="prompt"):
        nodes["LanternConditioning"].execute(model=model, class_name="0", prompt="  ")
    red = nodes["LanternConditioning"].execute(model=model, class_name="0", prompt="a red cat").args[0]
    blue = nodes["LanternConditioning"].execute(model=model, class_name="0", prompt="a blue dog").args[0]
    assert red.caption.shape == (1, 8, 16) and red.caption_mask.sum() == 4  # 3 words + </s>, left-padded
    assert not red.caption_mask[0, :4].any()
    kwargs = dict(cfg=4.0, temperature=0.0, top_k=0, top_p=1.0, seed=0, batch_size=2)
    a = nodes["LanternSampler"].execute(model=model, conditioning=red, **kwargs).args[0]
    b = nodes["LanternSampler"].execute(model=model, conditioning=blue, **kwargs).args[0]
    assert a.tokens.shape == (2, 16) and not torch.equal(a.tokens, b.tokens)
    image = nodes["LanternDecode"].execute(tokens=a).args[0]
    assert image.shape == (2, 16, 16, 3)


def test_t2i_speculation_with_a_drafter_folder(pack, files, node):
    """A drafter saved in the released layout into models/lantern/drafters/ is listed, loaded against the t2i
    target (prefix 8 -> drafter prefix 7), refused for the embedded model, and greedy LANTERN++ with
    lambda = 1 reproduces greedy AR for left-padded prompts."""
    import folder_paths
    from lantern_core.loading.drafter_io import save_drafter
    from lantern_core.models.drafter import EagleDrafter
    from lantern_core.config import DrafterConfig
    from lantern_pack.lantern_core.errors import LanternError

    nodes = node
    target = random_gpt(T2I)
    drafter = EagleDrafter(DrafterConfig.for_target(T2I))
    drafter.init_from_target(target, torch.Generator().manual_seed(3), std=0.1)
    root = Path(folder_paths.get_folder_paths("lantern_drafters")[0])
    save_drafter(drafter, root / "tiny_t2i_drafter")
    assert "tiny_t2i_drafter/" in nodes["LanternDrafterLoader"].define_schema().inputs[1].options
    model = nodes["LanternModelLoader"].execute(checkpoint="tiny_t2i.safetensors", vq_tokenizer="tiny_vq.safetensors",
                                                text_encoder="tiny-t5/", dtype="fp32").args[0]
    loaded = nodes["LanternDrafterLoader"].execute(model=model, drafter="tiny_t2i_drafter/").args[0]
    assert loaded.config.cls_token_num == 7
    embedded = nodes["LanternModelLoader"].execute(checkpoint=pack.nodes.paths.EMBEDDED, vq_tokenizer="auto",
                                                   text_encoder="none", dtype="fp32").args[0]
    from lantern_pack.lantern_core.errors import CheckpointError

    with pytest.raises(CheckpointError, match="hidden size 64 \\(target: 256\\)"):
        nodes["LanternDrafterLoader"].execute(model=embedded, drafter="tiny_t2i_drafter/")
    with pytest.raises(LanternError, match="only fits the embedded model"):
        nodes["LanternDrafterLoader"].execute(model=model, drafter=pack.nodes.paths.EMBEDDED)
    decoding = nodes["LanternDecodingConfig"].execute(
        mode="lantern_pp", drafter=loaded, tree="naive_extend_57", chain_length=4, custom_tree="", lantern_k=5,
        delta=0.1, lam=1.0, eagle_depth=4, eagle_top_k=4, eagle_nodes=12).args[0]
    cond = nodes["LanternConditioning"].execute(model=model, class_name="0", prompt="a red cat").args[0]
    kwargs = dict(cfg=4.0, temperature=0.0, top_k=0, top_p=1.0, seed=0, batch_size=2)
    ar = nodes["LanternSampler"].execute(model=model, conditioning=cond, **kwargs).args[0]
    fast = nodes["LanternSampler"].execute(model=model, conditioning=cond, decoding=decoding, **kwargs)
    assert torch.equal(fast.args[0].tokens, ar.tokens)
    assert fast.ui["lantern_stats"][0]["mode"] == "lantern_pp"
