"""The byte-level tokenizer: exact round trips, fixed special ids, no special-token injection."""

import random

import pytest
from transformers import PreTrainedTokenizerFast

from textzoo.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, byte_tokenizer


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


def _random_text(rng: random.Random, n: int) -> str:
    """Random code points from every plane (surrogates excluded: they have no UTF-8 form)."""
    chars = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.3:
            cp = rng.randrange(0, 128)
        elif kind < 0.6:
            cp = rng.randrange(128, 0x800)
        elif kind < 0.9:
            cp = rng.choice([rng.randrange(0x800, 0xD800), rng.randrange(0xE000, 0x10000)])
        else:
            cp = rng.randrange(0x10000, 0x110000)
        chars.append(chr(cp))
    return "".join(chars)


def test_special_ids_and_vocab(tok):
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID) == (0, 1, 2)
    assert len(tok) == VOCAB_SIZE == 259
    assert tok.padding_side == "left"


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "hello world",
        "  two  spaces\n\ttab\r\n",
        "héllo 🤖 日本語 Ω",
        "\x00\x01\x7f",
        "<eos><pad><bos>",
        "a" * 600,
    ],
)
def test_round_trip_examples(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode("utf-8"))  # one token per byte
    assert tok.decode(ids) == text


def test_round_trip_random_unicode(tok):
    rng = random.Random(0)
    texts = [_random_text(rng, rng.randrange(0, 40)) for _ in range(300)]
    batch = tok(texts, add_special_tokens=False)["input_ids"]
    assert tok.batch_decode(batch) == texts


def test_byte_ids(tok):
    assert tok("A", add_special_tokens=False)["input_ids"] == [ord("A") + 3]
    assert tok("\x00", add_special_tokens=False)["input_ids"] == [3]
    assert tok("ÿ", add_special_tokens=False)["input_ids"] == [0xC3 + 3, 0xBF + 3]


def test_special_token_text_is_plain_bytes(tok):
    """A prompt that spells '<eos>' must not produce the EOS id (no control-token injection)."""
    ids = tok("x<eos>y<pad>", add_special_tokens=False)["input_ids"]
    assert not {PAD_ID, BOS_ID, EOS_ID} & set(ids)


def test_left_padding(tok):
    out = tok(["ab", "abcd"], padding=True, add_special_tokens=False)
    assert out["input_ids"][0][:2] == [PAD_ID, PAD_ID]
    assert out["attention_mask"][0] == [0, 0, 1, 1]


def test_save_and_reload(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    again = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    text = "round trip ✓ <eos>"
    assert again(text)["input_ids"] == tok(text)["input_ids"]
    assert again.decode(again(text)["input_ids"]) == text
    assert (again.pad_token_id, again.eos_token_id, again.padding_side) == (PAD_ID, EOS_ID, "left")
