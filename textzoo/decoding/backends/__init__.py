"""Model backends: the forward passes a `Policy` samples and scores with, behind one small interface.

A backend runs one model; `Policy` picks one per call from the two it builds once per model:
`PlainBackend` (the plain-torch decoder of `textzoo.decoding.fastlm`, for the architectures in its
`ARCHITECTURES` table) when the model is one that decoder reproduces exactly in the current mode, and
`ModuleBackend` (the transformers module itself: any architecture, the fallback) otherwise. Sampling,
stop strings, texts and the log-prob arithmetic live in `textzoo.decoding.sampling` and are the same
whichever backend runs the model.

The interface (`Backend`):

- ``prefill(prompt_ids [S, P], prompt_mask [S, P], max_new_tokens) -> Decoding``: run the prompts
  (left-padded); ``Decoding.logits`` ([S, V]) predict the first completion token.
- ``Decoding.decode(tokens [S]) -> logits [S, V]``: append one token per row and predict the next.
  ``Decoding.retain(rows)`` lets finished rows go: later calls take and return the kept rows only.
- ``score(prompt_ids, prompt_mask, completion_ids [S, C], scored) -> HeadInput``: what the logits predicting
  each completion token are made from (final hidden states and the LM head), so that the caller can
  compute the selected tokens' log-probs a chunk of positions at a time, with gradients.

How an external engine would implement it (a vLLM or SGLang server, not built here): ``prefill``
sends the prompt ids as a new request and returns the first position's logits, ``decode`` appends
one token per request (both servers take token ids as input and keep the request's KV cache);
``retain`` aborts finished requests. A server returns log-probs of its top tokens rather than full
logits, so an engine backend would return those as logits with -inf elsewhere, or sample on the
server with the same temperature and allowed-token restriction and hand back the tokens (its own
``Decoding`` whose ``decode`` ignores the logits it is given). ``score`` has no server equivalent with
gradients: the update keeps a local model (the engine's weights are then refreshed from it after each
optimizer step), and the old log-probs of a batch can come from the server's prompt log-probs.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class HeadInput:
    """The inputs of the LM head at every scored position: ``head(hidden)`` are the logits ([S, C, V]).

    Keeping them apart lets a scorer run the head on a chunk of positions at a time (the [S, C, V]
    logits of a large vocabulary are the largest tensor of an update).
    """

    hidden: torch.Tensor  # [S, C, d] (or the logits themselves, with `head` the identity)
    head: Callable[[torch.Tensor], torch.Tensor]  # [..., d] -> [..., V]

    @property
    def vocab_size(self) -> int:
        """V, the number of logits per position."""
        return self.head(self.hidden[..., :0, :]).shape[-1]

    def logits(self) -> torch.Tensor:
        """All logits at once ([S, C, V])."""
        return self.head(self.hidden)


class Decoding(Protocol):
    """One batch of rows being decoded: prompts prefilled, one token appended per `decode` call."""

    logits: torch.Tensor
    """[S, V] logits of the first completion token."""
    features: torch.Tensor | None
    """[S, d] the final hidden state at each prompt's last token, when the backend has it (else None)."""

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append ``tokens`` ([S'], one per kept row) and return the next logits ([S', V])."""
        ...

    def retain(self, rows: torch.Tensor) -> torch.Tensor:
        """Keep at least the current rows ``rows`` (sorted indices); return the sorted indices of the rows
        actually kept (a superset where dropping a row is not cheap), which later calls then take."""
        ...

    # Optional: ``decode_many(tokens [S', k]) -> logits [S', V]`` appends k columns in one pass. `sampling.decode`
    # then feeds a run of forced columns (a scripted completion's fixed text) at once instead of token by token.


class Backend(Protocol):
    """The forward passes of one model that sampling and scoring need."""

    share_prompts: bool
    """Run each distinct prompt of a batch once (rows that share a prompt attend to its keys/values)."""

    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int) -> Decoding: ...

    def score(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        scored: torch.Tensor | None = None,
    ) -> HeadInput:
        """The head input predicting each completion token (``completion_ids`` [S, C], C >= 1). ``scored``
        ([S, C] bool): the tokens whose log-probs the caller reads; a backend may skip the positions no
        scored token depends on (those after a row's last scored token), whose head inputs are then 0."""
        ...

    def prompt_cache(self) -> AbstractContextManager[None]:
        """A context within which scoring calls of one repeated prompt may share its forward."""
        ...


def keep_all(rows: torch.Tensor, total: int) -> torch.Tensor:
    """`Decoding.retain` for a decoding that cannot drop rows: all ``total`` current rows."""
    return torch.arange(total, device=rows.device)
