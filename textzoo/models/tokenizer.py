"""A byte-level tokenizer built locally: tests and tiny models need no download.

Ids: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, then byte ``b`` = ``b + 3`` (vocab 259).
Every string (any unicode, the empty string) encodes to its UTF-8 bytes and decodes back exactly.
Text never produces a special id: ``"<eos>"`` written in a prompt is five bytes, so an
environment cannot inject control tokens (``split_special_tokens=True``).
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
BYTE_OFFSET = len(SPECIAL_TOKENS)
VOCAB_SIZE = BYTE_OFFSET + 256


def byte_tokenizer(model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """A 259-token byte-level tokenizer (ids in the module docstring), left padding."""
    # ByteLevel maps each byte to one printable unicode symbol (GPT-2's table); a BPE with no
    # merges over exactly those 256 symbols is then one token per byte.
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_symbols = sorted(alphabet, key=_byte_of_symbol)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({sym: BYTE_OFFSET + i for i, sym in enumerate(byte_symbols)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # use_regex=False: the regex split only matters for merges, which we have none of.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        padding_side="left",
        truncation_side="left",
        model_max_length=model_max_length,
        split_special_tokens=True,
        clean_up_tokenization_spaces=False,
    )


def llama_byte_tokenizer(model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """`byte_tokenizer` with Llama's special-token layout: ``<s>`` = 259 (BOS, put before every
    encoded text), ``</s>`` = 260 (EOS), ``<pad>`` = 0; vocab 261. Same bytes, different ids and
    prompts than `byte_tokenizer`: a team of both has two genuinely different tokenizers."""
    tokenizer = byte_tokenizer(model_max_length)
    tokenizer.add_special_tokens({"bos_token": "<s>", "eos_token": "</s>"})
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.bos_token_id)]
    )
    return tokenizer


def _byte_of_symbol(symbol: str) -> int:
    """The byte that GPT-2's byte-to-unicode table maps to ``symbol`` (inverse of the table)."""
    code = ord(symbol)
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    if code in printable:
        return code
    # Non-printable bytes were shifted to 256 + k in byte order (k = rank among them).
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]
