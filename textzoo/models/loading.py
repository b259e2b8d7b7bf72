"""Where a policy's model and tokenizer come from: a hub id, a local folder, a `.gguf` file, or a tiny model.

`Policy.from_pretrained` and `Policy.tiny` are thin wrappers over `load_pretrained` and `build_tiny`.

A `.gguf` file (llama.cpp's format) is read by transformers' GGUF support (config, tokenizer with
its chat template, tensors) and every quantized tensor is dequantized into float weights, so the
model trains like any other and the plain-torch decoder runs it; it needs the `gguf` package
(``pip install 'textzoo[gguf]'``). transformers opens the file three times (config, weights, tokenizer)
and rebuilds gguf's tensor-name map for every submodule; `load_gguf` lets it parse the file and build
the map once (`_one_gguf_parse`: 26 s -> 10 s for SmolLM2-135M's Q4_1 file on one core of a 2-core Xeon).
`convert_gguf` writes the result once as a folder that loads in under a second.

`end_token_ids` lists every id that ends a sample: the tokenizer's EOS, the model's generation
config EOS ids, and the tokenizer's own end-of-text / end-of-turn special tokens (a GGUF file names
one EOS, e.g. `<|im_end|>`, while its `<|endoftext|>` ends text too).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

from textzoo.errors import ConfigError, ModelError
from textzoo.models.tokenizer import byte_tokenizer

TINY_ARCHS = ("gpt2", "llama", "qwen2", "qwen3")
"""Architectures `build_tiny` makes."""

END_TOKENS = frozenset(
    {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>", "<end_of_turn>", "<|end|>", "</s>"}
)
"""Special tokens that end text or a turn in the common tokenizers: a sample ends on any of them."""


def load_pretrained(
    name_or_path: str | os.PathLike,
    *,
    dtype: torch.dtype | str | None = None,
    trust_remote_code: bool = False,
    local_files_only: bool | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The causal LM and tokenizer of a hub id, a local folder (e.g. one written by `save_pretrained`)
    or a `.gguf` file (dequantized, see the module docstring)."""
    source = str(name_or_path)
    if is_gguf(source):
        return load_gguf(source, dtype=dtype)
    local = Path(source).expanduser()
    # A hub id is "name" or "org/name"; anything else that is not a folder is a missing path.
    looks_like_path = (
        source.startswith((".", "/", "~")) or source.count("/") > 1 or (os.sep != "/" and os.sep in source)
    )
    if local.is_dir():
        source = str(local)
        if not (local / "config.json").is_file():
            raise ModelError(
                f"model folder {source!r} has no config.json, so it is not a transformers model folder: pass a "
                "folder written by save_pretrained (config.json + weights + tokenizer), a hub id or a .gguf file"
            )
    elif local.exists() or looks_like_path:
        raise ModelError(
            f"model folder {source!r} does not exist (or is not a folder); pass a folder written by "
            "Policy.save_pretrained / transformers save_pretrained, a .gguf file, or a hub id such as "
            "'Qwen/Qwen2.5-0.5B'"
        )
    kwargs: dict = {"trust_remote_code": trust_remote_code}
    if local_files_only is not None:
        kwargs["local_files_only"] = local_files_only
    try:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs, **({} if dtype is None else {"dtype": dtype}))
        if local.is_dir() and (local / "tokenizer.json").exists():
            # AutoTokenizer may swap the pre-tokenizer of locally built folders (a transformers 5.x sharp edge).
            tokenizer = PreTrainedTokenizerFast.from_pretrained(source, **kwargs)
        else:
            tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError, KeyError) as err:
        raise ModelError(
            f"could not load model {source!r}: {err}. Check the hub id (and network access or the local "
            "Hugging Face cache; set local_files_only=True offline), or pass a folder written by save_pretrained "
            "or a .gguf file; a model that is not a causal LM (an encoder, a seq2seq model) cannot be an agent"
        ) from err
    return model, tokenizer


# ------------------------------------------------------------------------------------------ GGUF
def is_gguf(source: str | os.PathLike) -> bool:
    """Whether ``source`` names a GGUF file (by its suffix; the file may not exist)."""
    return str(source).lower().endswith(".gguf")


def gguf_architecture(path: str | os.PathLike) -> str:
    """The `general.architecture` of a GGUF file (e.g. "llama")."""
    arch = gguf_metadata(path).get("general.architecture")
    if arch is None:
        raise ModelError(f"{str(path)!r} names no general.architecture; pass a complete .gguf model file")
    return arch


def gguf_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The text fields of a GGUF file's `general.*` metadata (architecture, name, organization, license,
    source repository, ...), read from its header alone (no tensor is read, no `gguf` package needed)."""
    try:
        with open(path, "rb") as f:
            return _gguf_header_strings(f, "general.")
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as e:
        raise ModelError(
            f"{str(path)!r} is not a readable GGUF file ({type(e).__name__}: {e}); pass a complete .gguf model file"
        ) from e


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
"""GGUF metadata value types (the format's numbering) -> struct codes; 8 is a string, 9 an array."""


def _gguf_header_strings(f, prefix: str) -> dict[str, str]:
    """The string values of the metadata keys starting with `prefix` in the GGUF header of file `f`."""

    def read(code: str):
        data = f.read(struct.calcsize("<" + code))
        return struct.unpack("<" + code, data)[0]

    def text() -> str:
        return f.read(read("Q")).decode()

    def skip(kind: int) -> None:
        if kind == 8:
            f.seek(read("Q"), os.SEEK_CUR)
        elif kind == 9:
            item, count = read("I"), read("Q")
            if item in _GGUF_SCALARS:
                f.seek(count * struct.calcsize("<" + _GGUF_SCALARS[item]), os.SEEK_CUR)
            else:
                for _ in range(count):
                    skip(item)
        else:
            f.seek(struct.calcsize("<" + _GGUF_SCALARS[kind]), os.SEEK_CUR)

    if f.read(4) != b"GGUF":
        raise ValueError("no GGUF magic number")
    version = read("I")
    if version < 2:
        raise ValueError(f"GGUF version {version} (textzoo reads 2 and later)")
    read("Q")  # tensor count
    out = {}
    for _ in range(read("Q")):
        key, kind = text(), read("I")
        if kind == 8 and key.startswith(prefix):
            out[key] = text()
        elif kind in _GGUF_SCALARS or kind in (8, 9):
            skip(kind)
        else:
            raise ValueError(f"unknown metadata type {kind} of {key!r}")
    return out


def load_gguf(
    path: str | os.PathLike, *, dtype: torch.dtype | str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The causal LM (float weights, no quantizer attached) and tokenizer of a `.gguf` file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelError(f"GGUF file {str(path)!r} does not exist; pass the path of a .gguf model file")
    if importlib.util.find_spec("gguf") is None:
        raise ModelError("loading a .gguf file needs the gguf package: pip install 'textzoo[gguf]'")
    from transformers import GgufConfig
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = gguf_architecture(path)
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        readable = ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
        raise ModelError(
            f"{path.name} is a {arch!r} model, which this transformers version cannot read from GGUF (it reads "
            f"{readable}); load the model's Hugging Face folder or hub id instead"
        )
    folder, name = str(path.parent), path.name
    try:
        with _one_gguf_parse():
            model = AutoModelForCausalLM.from_pretrained(
                folder,
                gguf_file=name,
                quantization_config=GgufConfig(dequantize=True),  # float weights, even where a kernel keeps blocks
                dtype=torch.float32 if dtype is None else dtype,
            )
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (OSError, ValueError, KeyError, RuntimeError, NotImplementedError) as e:
        raise ModelError(
            f"could not load {str(path)!r} ({type(e).__name__}: {e}); check that the file is complete, or load "
            "the model's Hugging Face folder or hub id instead"
        ) from e
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the weights are dense floats now: drop what marks the model as quantized
        quantizer.remove_quantization_config(model)
    return model, tokenizer


_GGUF_PATCH = threading.Lock()  # gguf's functions are process-wide: one load patches them at a time


@contextlib.contextmanager
def _one_gguf_parse() -> Iterator[None]:
    """Inside: `gguf.GGUFReader` parses each file once and `gguf.get_tensor_name_map` builds each map once.

    transformers imports both from `gguf` at each call (config, weights, tokenizer; the map once per
    submodule), and a reader only reads (a read-only memory map), so sharing one changes no value.
    The module's own functions are put back on the way out."""
    import gguf

    with _GGUF_PATCH:
        reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        gguf.GGUFReader, gguf.get_tensor_name_map = functools.cache(reader), functools.cache(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def convert_gguf(path: str | os.PathLike, out: str | os.PathLike, *, dtype: torch.dtype | str | None = None) -> Path:
    """Dequantize a `.gguf` file once into a transformers folder ``out`` (model + tokenizer); return ``out``."""
    model, tokenizer = load_gguf(path, dtype=dtype)
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def end_token_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """Every id that ends a sample, the tokenizer's EOS first (see the module docstring)."""
    model_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    model_eos = [] if model_eos is None else [model_eos] if isinstance(model_eos, int) else list(model_eos)
    special = dict(zip(tokenizer.all_special_tokens, tokenizer.all_special_ids))
    added = {t.content: i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special}
    named = [i for token, i in sorted({**special, **added}.items()) if token in END_TOKENS]
    return tuple(dict.fromkeys([tokenizer.eos_token_id, *model_eos, *named]))


def build_tiny(
    arch: str = "gpt2",
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 2,
    n_positions: int = 512,
    seed: int = 0,
    dropout: float = 0.0,
    tokenizer: PreTrainedTokenizerFast | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A randomly initialised tiny model of ``arch`` (one of `TINY_ARCHS`) and its tokenizer
    (`byte_tokenizer`, or ``tokenizer``, whose vocabulary and special ids shape the model).

    Deterministic given ``seed``; the global RNG is left untouched.
    """
    if tokenizer is None:
        tokenizer = byte_tokenizer(model_max_length=n_positions)
    ids = dict(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if arch == "gpt2":
        # Exact GELU instead of GPT-2's tanh approximation: same shapes, ~4x faster activation on CPU.
        config = GPT2Config(
            n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=n_positions, activation_function="gelu",
            resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, **ids,
        )  # fmt: skip
    elif arch in ("llama", "qwen2", "qwen3"):
        config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[arch]
        config = config_cls(
            hidden_size=n_embd, intermediate_size=4 * n_embd, num_hidden_layers=n_layer,
            num_attention_heads=n_head, num_key_value_heads=n_head, max_position_embeddings=n_positions,
            attention_dropout=dropout, tie_word_embeddings=True, **ids,
            **({"head_dim": n_embd // n_head} if arch == "qwen3" else {}),
        )  # fmt: skip
    else:
        raise ConfigError(f"arch must be one of {', '.join(map(repr, TINY_ARCHS))}, got {arch!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    return model, tokenizer
