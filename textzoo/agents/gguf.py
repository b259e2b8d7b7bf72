"""Models from `.gguf` files (llama.cpp's format), dequantized into float weights by transformers.

transformers reads the file's config, tokenizer (with its chat template) and tensors; every
quantized tensor is unpacked to ``dtype`` (float32 by default), so the model trains like any other
and the plain-torch decoder runs it. Needs the `gguf` package (``pip install 'textzoo[gguf]'``).
Dequantizing takes a while (~20 s for a 135M-parameter Q4_1 file on one CPU core): `convert_gguf`
writes the result as a transformers folder that loads in a fraction of a second.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

from textzoo.errors import ModelError


def is_gguf(source: str | os.PathLike) -> bool:
    """Whether ``source`` names a GGUF file (by its suffix; the file may not exist)."""
    return str(source).lower().endswith(".gguf")


def gguf_architecture(path: Path) -> str:
    """The `general.architecture` of a GGUF file (e.g. "llama")."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(path)).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except (KeyError, IndexError, ValueError, OSError) as e:
        raise ModelError(
            f"{str(path)!r} is not a readable GGUF file ({type(e).__name__}: {e}); pass a complete .gguf model file"
        ) from e


def load_gguf(path: str | os.PathLike, *, dtype: torch.dtype | str | None = None):
    """The causal LM (float weights, no quantizer attached) and tokenizer of a `.gguf` file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelError(f"GGUF file {str(path)!r} does not exist; pass the path of a .gguf model file")
    if importlib.util.find_spec("gguf") is None:
        raise ModelError("loading a .gguf file needs the gguf package: pip install 'textzoo[gguf]'")
    arch = gguf_architecture(path)
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ModelError(
            f"{path.name} is a {arch!r} model, which this transformers version cannot read from GGUF "
            f"(it reads {', '.join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ('general', 'tokenizer'))}); "
            "load the model's original Hugging Face folder or hub id instead"
        )
    folder, name = str(path.parent), path.name
    try:
        model = AutoModelForCausalLM.from_pretrained(
            folder,
            gguf_file=name,
            quantization_config=GgufConfig(dequantize=True),
            dtype=torch.float32 if dtype is None else dtype,
        )
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (OSError, ValueError, KeyError, RuntimeError, NotImplementedError) as e:
        raise ModelError(
            f"could not load {str(path)!r} ({type(e).__name__}: {e}); check that the file is complete, or load the "
            "model's Hugging Face folder or hub id instead"
        ) from e
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the weights are dense floats now: drop what marks the model as quantized
        quantizer.remove_quantization_config(model)
    return model, tokenizer


def convert_gguf(path: str | os.PathLike, out: str | os.PathLike, *, dtype: torch.dtype | str | None = None) -> Path:
    """Dequantize a `.gguf` file once into a transformers folder ``out`` (model + tokenizer); return ``out``."""
    model, tokenizer = load_gguf(path, dtype=dtype)
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
