"""The t2i text path with a tiny random T5 saved to a local folder (transformers, offline)."""
import pytest
import torch

from tiny_models import random_gpt
from tolerances import assert_close_to_reference, transformer_tolerance
from lantern_core.config import GPTConfig, SamplingConfig
from lantern_core.errors import CheckpointError
from lantern_core.decoding.generate import generate
from lantern_core.text_encoder import T5CaptionEncoder, clean_prompt, left_pad


@pytest.fixture(scope="module")
def t5_folder(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    folder = tmp_path_factory.mktemp("flan-t5-tiny")
    words = ["<pad>", "</s>", "<unk>", "a", "cat", "red", "on", "mat", "photo", "of", "the"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(str(folder))
    config = T5Config(vocab_size=len(words), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)  # test-only: transformers initialises from the global generator
    T5EncoderModel(config).save_pretrained(str(folder))
    return folder


def test_left_pad_moves_valid_tokens_to_the_end():
    feats = torch.arange(1, 13, dtype=torch.float32).reshape(2, 6, 1)
    mask = torch.tensor([[True, True, False, False, False, False], [True] * 6])
    out, new_mask = left_pad(feats, mask)
    assert new_mask.tolist() == [[False] * 4 + [True] * 2, [True] * 6]
    assert out[0, :, 0].tolist() == [0, 0, 0, 0, 1, 2]
    assert torch.equal(out[1], feats[1])


def test_encode_matches_t5_and_is_left_padded(t5_folder):
    from transformers import AutoTokenizer, T5EncoderModel

    encoder = T5CaptionEncoder(t5_folder, max_tokens=120)
    cond = encoder.encode(["a cat", "a  red cat on the &amp; mat"])
    assert cond.caption.shape == (2, 120, 16) and cond.caption_mask.shape == (2, 120)
    lengths = cond.caption_mask.sum(-1).tolist()
    assert lengths == [3, 8]  # words + </s> ("&amp;" is unescaped to "&", an unknown word)
    for row, n in enumerate(lengths):
        assert not cond.caption_mask[row, : 120 - n].any() and cond.caption_mask[row, 120 - n:].all()
        assert torch.count_nonzero(cond.caption[row, : 120 - n]) == 0
    tok = AutoTokenizer.from_pretrained(str(t5_folder), local_files_only=True)
    model = T5EncoderModel.from_pretrained(str(t5_folder), local_files_only=True).double()
    ids = tok(["a cat"], return_tensors="pt")
    with torch.no_grad():  # unpadded, alone and in float64: the check needs no CPU's BLAS
        direct = model(**ids).last_hidden_state[0]
    c = model.config  # one layer's attention and MLP, inner size at most d_ff; no head
    tol = transformer_tolerance(cond.caption.dtype, max(c.d_model, c.d_ff, c.num_heads * c.d_kv), c.num_layers, 0)
    assert_close_to_reference(cond.caption[0, -3:], direct, tol)


def test_t5_features_drive_a_t2i_model(t5_folder):
    encoder = T5CaptionEncoder(t5_folder, max_tokens=8)
    config = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=32, model_type="t2i", caption_dim=16,
                       cls_token_num=8, grid_size=3)
    model = random_gpt(config)
    sampling = SamplingConfig(cfg_scale=5.0, temperature=0.0)
    a = generate(model, encoder.encode(["a red cat"]), sampling).tokens
    b = generate(model, encoder.encode(["photo of the mat"]), sampling).tokens
    assert a.shape == (1, 9) and not torch.equal(a, b)


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="flan-t5-xl"):
        T5CaptionEncoder(tmp_path)


def test_clean_prompt():
    assert clean_prompt("  a &amp;amp; b\n c ") == "a & b c"
