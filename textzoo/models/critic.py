"""`Critic`: a causal-LM trunk with a scalar value head, for the actor-critic family.

A V critic reads a state (a prompt) and answers V(s) at its last token; a Q critic reads the state
followed by an action (a completion) and answers Q(s, a) at the action's last token. The trunk is
the transformer without its LM head (`model.base_model`), so a critic can start from the same
pretrained weights as an actor or be a tiny model built locally.

Supported trunks (see `textzoo.decoding.fastlm`) run the plain-torch forward: each distinct prompt once
(the G samples of a group share their state), and a Q critic's completions attend to their prompt's
keys/values in one grouped matmul, as `Policy.score` does. Others run the transformers module.
"""

from __future__ import annotations

from inspect import signature
from types import SimpleNamespace

import torch
from transformers import PreTrainedTokenizerBase

from textzoo.decoding.fastlm import FastDecoder, distinct_rows, first_tokens_first, shared_rows
from textzoo.decoding.generation import left_padded
from textzoo.decoding.modes import eval_mode
from textzoo.decoding.precision import autocast
from textzoo.models.policy import Policy


class Critic(torch.nn.Module):
    """An LM trunk + value head: one scalar per sequence, read at a chosen token."""

    def __init__(
        self,
        trunk: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        hidden: int = 0,
        init_std: float = 0.0,
        max_tokens: int = 1024,
        seed: int = 0,
        shared_trunk: bool = False,
        autocast: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.shared_trunk = shared_trunk
        """The trunk belongs to an actor: it is not this module's parameter, and values do not
        back-propagate into it (only the head learns; see `features`)."""
        if shared_trunk:
            object.__setattr__(self, "trunk", trunk)  # not a submodule: parameters() and state_dict() are the head's
        else:
            self.trunk = trunk
        self.tokenizer = tokenizer
        config = trunk.config
        width = getattr(config, "hidden_size", None) or config.n_embd
        positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        self.max_tokens = min(max_tokens, positions) if positions else max_tokens
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        device = next(trunk.parameters()).device
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            layers: list[torch.nn.Module] = []
            if hidden:
                layers += [torch.nn.Linear(width, hidden), torch.nn.Tanh()]
            out = torch.nn.Linear(hidden or width, 1)
            # init_std 0 starts every value at 0: the first advantages are the plain returns
            torch.nn.init.normal_(out.weight, std=init_std) if init_std > 0 else torch.nn.init.zeros_(out.weight)
            torch.nn.init.zeros_(out.bias)
            self.head = torch.nn.Sequential(*layers, out).to(device)
        self.fast_forward = True
        """Run the plain-torch forward of `textzoo.decoding.fastlm` when the trunk supports it."""
        self._fast_decoder: FastDecoder | None = FastDecoder.build(trunk)
        self.autocast = autocast
        """Run the trunk under ``torch.autocast`` to this dtype (bf16-mixed precision); None = off."""

    @classmethod
    def from_policy(cls, policy: Policy, **kwargs) -> Critic:
        """A critic on the trunk (and tokenizer) of `policy`'s model; the LM head is dropped. With
        ``shared_trunk=True`` it is a value head on that very trunk (IAC's "head on the actor").
        A model without a `base_model` (e.g. a LoRA agent's view of its shared base) is read whole."""
        model = policy.model
        trunk = model.base_model if isinstance(getattr(model, "base_model", None), torch.nn.Module) else LMTrunk(model)
        return cls(trunk, policy.tokenizer, autocast=policy.autocast, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.trunk.parameters()).device

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ids and mask ([S, L]); a long text keeps its last `max_tokens` tokens."""
        rows = [r[-self.max_tokens :] or [self.pad_id] for r in self.tokenizer(list(texts), verbose=False)["input_ids"]]
        return left_padded(rows, self.pad_id, min_width=1)  # [S, L]

    def forward(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion_ids: torch.Tensor | None = None,
        completion_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Values [S]: at the last prompt token (V), or at the last completion token when given (Q).

        Prompts are left-padded ([S, P]); completions right-padded ([S, C]) with at least one token.
        """
        return self.value(self.features(prompt_ids, prompt_mask, completion_ids, completion_mask))

    def value(self, features: torch.Tensor) -> torch.Tensor:
        """The value head on trunk features ([S, d] -> [S])."""
        return self.head(features.to(self.head[-1].weight.device, self.head[-1].weight.dtype)).squeeze(-1)

    def features(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion_ids: torch.Tensor | None = None,
        completion_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The trunk's final hidden state ([S, d]) at the token `forward` reads; without gradient
        when the trunk is shared with an actor."""
        with autocast(self.device, self.autocast):
            if self.shared_trunk:  # the actor's trunk, read as it samples: no gradient, no dropout
                with eval_mode(self.trunk), torch.no_grad():
                    return self._features(prompt_ids, prompt_mask, completion_ids, completion_mask)
            return self._features(prompt_ids, prompt_mask, completion_ids, completion_mask)

    def _features(self, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
        device = self.device
        ids, attention = prompt_ids.to(device), prompt_mask.to(device).long()  # [S, P]
        fast = self._fast()
        width = ids.shape[1] + (0 if completion_ids is None else completion_ids.shape[1])
        if fast is not None and ids.shape[0] and width <= self.max_tokens and bool(attention[:, -1].all()):
            return self._fast_features(fast, ids, attention, completion_ids, completion_mask)
        last = torch.full((ids.shape[0],), ids.shape[1] - 1, dtype=torch.long, device=device)  # [S]
        if completion_ids is not None:
            completion_mask = completion_mask.to(device).long()
            last = last + completion_mask.sum(1)  # [S] index of the last completion token
            ids = torch.cat([ids, completion_ids.to(device)], 1)  # [S, P+C]
            attention = torch.cat([attention, torch.ones_like(completion_mask)], 1)  # [S, P+C]
        if ids.shape[1] > self.max_tokens:
            # keep the last tokens (causal attention: the value token only sees what precedes it)
            cut = ids.shape[1] - self.max_tokens
            ids, attention, last = ids[:, cut:], attention[:, cut:], (last - cut).clamp(min=0)
        # The G samples of a prompt share its state: run each distinct input once and copy its value.
        rows = distinct_rows(torch.cat([ids, last[:, None]], 1), attention)
        if rows is not None:
            first = rows.first
            return self._module_features(ids[first], attention[first], last[first])[rows.inverse]  # [S, d]
        return self._module_features(ids, attention, last)

    def _fast(self) -> FastDecoder | None:
        fast = self._fast_decoder
        return fast if self.fast_forward and fast is not None and fast.usable else None

    def _fast_features(self, fast, ids, attention, completion_ids, completion_mask) -> torch.Tensor:
        """`features` through the plain-torch decoder: each distinct prompt once; Q reads its completion."""
        rows = shared_rows(ids, attention)
        prefix, hidden = fast.prefill(*first_tokens_first(ids[rows.first], attention[rows.first]))  # [U, d]
        if completion_ids is None:
            hidden = hidden[rows.inverse]  # [S, d]
        else:
            completion_ids = completion_ids.to(ids.device)
            C = completion_ids.shape[1]
            position = prefix.lengths[rows.inverse][:, None] + torch.arange(C, device=ids.device)  # [S, C]
            states = fast.extend(completion_ids, position, fast.share(prefix, rows), fast.new_cache(), C)  # [S, C, d]
            last = completion_mask.to(ids.device).long().sum(1).clamp(min=1) - 1  # [S]
            hidden = states[torch.arange(len(last), device=ids.device), last]  # [S, d]
        return hidden

    def _module_features(self, ids: torch.Tensor, attention: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The transformers trunk's final hidden state at column `last` of each row ([S, L] -> [S, d])."""
        position = (attention.cumsum(1) - 1).clamp(min=0)  # [S, L] explicit for left padding (GPT-2)
        hidden = self.trunk(
            input_ids=ids, attention_mask=attention, position_ids=position, use_cache=False
        ).last_hidden_state  # [S, L, D]
        return hidden[torch.arange(ids.shape[0], device=ids.device), last]  # [S, D]

    def values_of_texts(self, texts: list[str]) -> torch.Tensor:
        """Values [S] of whole texts (read at each text's last token)."""
        ids, mask = self.encode(texts)
        return self(ids, mask)


class LMTrunk(torch.nn.Module):
    """A causal LM read as a trunk: its final hidden states (the LM head runs on the last position only, where
    the model allows: its logits go unused)."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm
        base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
        self._last_logits = {"logits_to_keep": 1} if "logits_to_keep" in signature(base.forward).parameters else {}
        """The LM head's logits at the last position only, where the model can: the others go unused."""

    @property
    def config(self):
        return self.lm.config

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        # the LM's own listing (a LoRA view lists only its adapter, not the shared base)
        yield from self.lm.named_parameters(prefix=prefix + "lm.")

    def forward(self, **kwargs) -> SimpleNamespace:
        out = self.lm(**kwargs, **self._last_logits, output_hidden_states=True)
        return SimpleNamespace(last_hidden_state=out.hidden_states[-1])  # after the final norm
