"""Prompt formatting: how an agent turns the prompt its actor built (plain text) into model input.

- ``raw``: the text goes to the model as it is (the policy's own encoding: tokenizer special tokens,
  the last ``max_prompt_tokens`` tokens kept). Base models and the tiny byte-level models use it.
- ``chat``: the text is the user message of a conversation rendered by the tokenizer's chat
  template, with ``add_generation_prompt=True`` so the model writes the assistant turn; an optional
  system prompt comes first and ``chat_template_kwargs`` go to the template (e.g.
  ``{"enable_thinking": False}``). The token ids are exactly
  ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``; a user message too long
  for ``max_prompt_tokens`` keeps its last tokens, inside the template.
- ``auto`` (the default): ``chat`` when the tokenizer has a chat template, else ``raw``.

The ids made here are what the policy samples from and what every later score reads (the
`Generation` carries them), so sampling and scoring always see the same tokens. In ``raw`` mode a
system prompt is written before the text, separated by a blank line.

Multi-turn tasks: each turn's observation is formatted the same way, as the one user message of a
fresh conversation, so an env that wants the model to see earlier turns writes them into its next
observation (as `textzoo/Code-v0` does with its feedback turn).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from textzoo.decoding.generation import left_padded
from textzoo.errors import ConfigError
from textzoo.models.settings import PROMPT_STYLES

STYLES = PROMPT_STYLES


@dataclass(frozen=True)
class PromptFormat:
    """A resolved prompt format (``style`` is "raw" or "chat"); build it with `PromptFormat.resolve`."""

    style: str = "raw"
    """raw | chat (see the module docstring)."""
    system_prompt: str = ""
    """A system message before the user message (raw: text before the prompt); empty = none."""
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Extra variables of the chat template."""

    def __post_init__(self) -> None:
        if self.style not in ("raw", "chat"):
            raise ConfigError(f"a resolved prompt format is 'raw' or 'chat', got {self.style!r}")

    @classmethod
    def resolve(
        cls,
        tokenizer: Any,
        style: str = "auto",
        system_prompt: str = "",
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> PromptFormat:
        """The format ``style`` means for ``tokenizer`` ("auto": chat when it has a chat template)."""
        if style not in STYLES:
            raise ConfigError(f"prompt_format must be one of {', '.join(STYLES)}, got {style!r}")
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if style == "chat" and not has_template:
            raise ConfigError(
                "prompt_format='chat' needs a tokenizer with a chat template, and this model's has none: "
                "use prompt_format='raw' (or 'auto'), or load an instruct model"
            )
        resolved = "chat" if style == "chat" or (style == "auto" and has_template) else "raw"
        return cls(resolved, system_prompt, dict(chat_template_kwargs or {}))

    @property
    def chat(self) -> bool:
        return self.style == "chat"

    def messages(self, text: str) -> list[dict[str, str]]:
        """The conversation of one prompt: the system message (when set), then ``text`` as the user's."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": text}]

    def raw_text(self, text: str) -> str:
        """What a raw prompt sends: the system prompt (when set) and a blank line before ``text``."""
        return f"{self.system_prompt}\n\n{text}" if self.system_prompt else text

    # ---------------------------------------------------------------------------------- encoding
    def chat_ids(self, tokenizer: Any, text: str, budget: int) -> list[int]:
        """Token ids of ``text`` as a chat prompt, at most ``budget`` of them (the user message keeps
        its last tokens; the template around it is kept whole)."""
        ids = self._render(tokenizer, text)
        content = None
        while len(ids) > budget:
            if content is None:
                content = tokenizer(text, add_special_tokens=False)["input_ids"]
            if not content:
                raise ConfigError(
                    f"the chat template and system prompt alone take {len(ids)} tokens, more than "
                    f"max_prompt_tokens={budget}: raise agent.max_prompt_tokens or shorten agent.system_prompt"
                )
            content = content[len(ids) - budget :]
            text = tokenizer.decode(content)
            ids = self._render(tokenizer, text)
        return ids

    def next_turn(self, tokenizer: Any, text: str) -> str:
        """What the chat template writes after an assistant reply to bring in ``text`` as the next user
        message and open the assistant's answer to it: the end of the reply's turn, the user turn and the
        assistant's opening (ChatML: ``<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n``)."""
        mark = "\ue000textzoo-reply\ue000"  # a private-use marker no template writes itself
        messages = [*self.messages("x"), {"role": "assistant", "content": mark}, {"role": "user", "content": text}]
        try:
            rendered = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
            )
        except Exception as e:
            raise ConfigError(
                f"the tokenizer's chat template cannot render a conversation ({type(e).__name__}: {e}); "
                "use joint_format='tags' or prompt_format='raw' for the joint actor"
            ) from e
        if rendered.count(mark) != 1:
            raise ConfigError(
                "the tokenizer's chat template drops or repeats an assistant reply, so the joint actor cannot "
                "answer role after role in one conversation: use joint_format='tags' or prompt_format='raw'"
            )
        return rendered.split(mark, 1)[1]

    def _render(self, tokenizer: Any, text: str) -> list[int]:
        try:
            out = tokenizer.apply_chat_template(
                self.messages(text), add_generation_prompt=True, tokenize=True, return_dict=False,
                **self.chat_template_kwargs,
            )  # fmt: skip
        except Exception as e:  # a jinja error in the model's template or from our kwargs
            raise ConfigError(
                f"the tokenizer's chat template failed ({type(e).__name__}: {e}); check agent.chat_template_kwargs "
                "and agent.system_prompt (some templates reject a system message), or use prompt_format='raw'"
            ) from e
        return list(out)

    def encode(self, policy: Any, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids and mask ([S, P]) of the formatted prompts, on the policy's device."""
        if not self.chat:
            return policy.encode([self.raw_text(t) for t in texts])
        tokenizer = policy.tokenizer
        budget = policy.generation.max_prompt_tokens
        distinct = {t: self.chat_ids(tokenizer, t, budget) for t in dict.fromkeys(texts)}  # G copies render once
        ids, mask = left_padded([distinct[t] for t in texts], policy.pad_id)  # [S, P]
        return ids.to(policy.device), mask.to(policy.device)

    def check(self, policy: Any) -> None:
        """Fail now (a `ConfigError`) when the template cannot render or leaves no room for a message."""
        if self.chat:
            self.chat_ids(policy.tokenizer, "x", policy.generation.max_prompt_tokens)

    def generate(
        self, policy: Any, texts: Sequence[str], *, greedy: bool = False, generator: torch.Generator | None = None
    ):
        """Sample one completion per prompt text through this format (a `Generation`)."""
        if not self.chat:
            return policy.generate([self.raw_text(t) for t in texts], greedy=greedy, generator=generator)
        ids, mask = self.encode(policy, texts)
        return policy.generate_ids(ids, mask, greedy=greedy, generator=generator)
