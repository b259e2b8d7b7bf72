"""textzoo/Relay-v0: a two-turn communication game: a sender relays a secret symbol to a receiver.

Roles and turns:
- turn 0: `sender` sees the secret (one of K symbols) and writes a message; `receiver` is inactive
  (`infos["receiver"]["active"] is False`; its prompt says to wait; its action is ignored).
- turn 1: `receiver` sees only the sender's message, cut to `message_chars` characters, and names
  the secret; `sender` is inactive. The episode then ends.

Observations (prompts, variant v of `SENDER_PROMPTS` / `RECEIVER_PROMPTS`), e.g.::

    sender, turn 0:    Secret: B\\nSend a short message so your partner can tell the secret.\\nMessage:
    receiver, turn 1:  Message: {message}\\nWhich symbol is the secret (A, B, C, D)? Answer:

Actions: any string. The receiver's answer is parsed as: strip it, take its first
whitespace-separated token, strip the punctuation `.,;:!?'"()[]{}<>*` around it; that token is
the answer. It matches a symbol when equal to it, or, if no symbol is equal and the symbols are
distinct ignoring case, when equal ignoring case.
`env.symbols` lists the symbols; `infos["receiver"]["allowed_outputs"]` lists them too, so a
runner can restrict the receiver's output tokens.

Reward terms (turn 1, both agents; turn 0 reports none and rewards 0):
- `correct`: 1 if the answer matches the secret, else 0. This is the team reward, given to both.
- `answered_symbol`: 1 if the answer matches any symbol (a diagnostic; not part of the reward).

Items: item i = (secret `symbols[i % K]`, prompt variant). `split="train"` uses variants 0-3,
`split="eval"` the held-out variant 4 (`"all"`: 0-4), so num_items = 4K, K or 5K, and the
receiver's task is the same in every split. `options={"index": i}` picks item i.

Version history:
- v0: first version.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

from textzoo.envs.base import StepResult, TextParallelEnv
from textzoo.envs.declare import SPLIT, anything, entry_points, integer, task, text_args
from textzoo.errors import EnvError

SENDER_PROMPTS = (
    "Secret: {secret}\nSend a short message so your partner can tell the secret.\nMessage:",
    "The secret symbol is {secret}.\nWrite a message for your partner.\nMessage:",
    "Your secret: {secret}\nTell your partner which symbol it is.\nMessage:",
    "Secret symbol = {secret}\nCompose a brief note for the receiver.\nMessage:",
    "You hold the secret {secret}.\nSend your partner a message about it.\nMessage:",
)
RECEIVER_PROMPTS = (
    "Message: {message}\nWhich symbol is the secret ({choices})? Answer:",
    "Your partner wrote: {message}\nName the secret symbol ({choices}). Answer:",
    "Note from partner: {message}\nThe secret is one of {choices}. Answer:",
    "Received: {message}\nPick the secret ({choices}). Answer:",
    "Message: {message}\nWhat is the secret ({choices})? Answer:",
)
WAIT_PROMPT = "Wait: your partner acts this turn."
TRAIN_VARIANTS = (0, 1, 2, 3)
EVAL_VARIANTS = (4,)
_PUNCTUATION = ".,;:!?'\"()[]{}<>*"


def parse_answer(answer: str) -> str:
    """The receiver's answer token: first whitespace-separated token, surrounding punctuation stripped."""
    tokens = answer.strip().split()
    return tokens[0].strip(_PUNCTUATION) if tokens else ""


def match_symbol(answer: str, symbols: Sequence[str]) -> str | None:
    """The symbol `answer` names (see the module docstring for the rules), or None."""
    token = parse_answer(answer)
    if token in symbols:
        return token
    folded = [s.casefold() for s in symbols]
    if len(set(folded)) == len(folded) and token.casefold() in folded:
        return symbols[folded.index(token.casefold())]
    return None


@task(
    "relay_v0",
    num_symbols=integer(4, low=2, doc="how many of the default symbols A, B, C, ... (at most 26)"),
    symbols=anything(None, doc="the symbols, a list or a space-separated string; None: the first num_symbols letters"),
    message_chars=integer(32, low=1, doc="the longest message the receiver is shown"),
    split=SPLIT,
    **text_args(max_prompt_chars=256),
)
class RelayEnv(TextParallelEnv):
    """Relay-v0: sender relays a secret symbol to a receiver; see the module docstring."""

    def __init__(self, num_symbols, symbols, message_chars, split, **text: Any):
        super().__init__(["sender", "receiver"], num_turns=2, **text)
        max_prompt_chars = text["max_prompt_chars"]
        if symbols is None:
            if num_symbols > 26:
                raise EnvError(f"num_symbols must be an int in [2, 26] with the default symbols, got {num_symbols!r}")
            symbols = list(string.ascii_uppercase[:num_symbols])
        else:
            symbols = symbols.split() if isinstance(symbols, str) else list(symbols)
            if len(symbols) < 2 or len(set(symbols)) != len(symbols):
                raise EnvError(f"symbols must hold at least 2 distinct strings, got {symbols!r}")
            for s in symbols:
                if not isinstance(s, str) or not s or s != s.strip(_PUNCTUATION) or len(s.split()) != 1:
                    raise EnvError(
                        f"symbols: {s!r} cannot be answered; each symbol must be one non-empty token "
                        f"without spaces or surrounding punctuation {_PUNCTUATION!r}"
                    )
            if num_symbols not in (4, len(symbols)):  # 4 is the default: only a contradiction is an error
                raise EnvError(
                    f"num_symbols={num_symbols} contradicts the {len(symbols)} symbols given; pass one of them"
                )
        self.split = split
        self.symbols: list[str] = list(symbols)
        self.message_chars = message_chars
        self.variants = {"train": TRAIN_VARIANTS, "eval": EVAL_VARIANTS, "all": TRAIN_VARIANTS + EVAL_VARIANTS}[split]
        self.secret = ""
        self.variant = 0
        self.message = ""
        longest = max(
            len(RECEIVER_PROMPTS[v].format(message="x" * message_chars, choices=", ".join(self.symbols)))
            for v in self.variants
        )
        if longest > max_prompt_chars:
            raise EnvError(
                f"max_prompt_chars={max_prompt_chars} is too small for message_chars={message_chars}; "
                f"use at least {longest}"
            )

    def num_items(self) -> int:
        return len(self.symbols) * len(self.variants)

    def _reset_task(self, index: int) -> tuple[dict[str, str], set[str]]:
        k = len(self.symbols)
        self.secret = self.symbols[index % k]
        self.variant = self.variants[index // k]
        self.message = ""
        prompts = {"sender": SENDER_PROMPTS[self.variant].format(secret=self.secret), "receiver": WAIT_PROMPT}
        return prompts, {"sender"}

    def _step_task(self, actions: dict[str, str], notes: dict[str, list[str]]) -> StepResult:
        idle = "receiver" if self.turn == 0 else "sender"
        extra = {idle: ["inactive this turn; action ignored"]} if actions[idle] else {}
        if self.turn == 0:
            self.message = actions["sender"][: self.message_chars]
            if len(actions["sender"]) > self.message_chars:
                extra["sender"] = [f"message cut to its first {self.message_chars} characters"]
            receiver = RECEIVER_PROMPTS[self.variant].format(message=self.message, choices=", ".join(self.symbols))
            return StepResult(
                rewards={"sender": 0.0, "receiver": 0.0},
                observations={"sender": WAIT_PROMPT, "receiver": receiver},
                active={"receiver"},
                notes=extra,
            )
        answer = match_symbol(actions["receiver"], self.symbols)
        correct = float(answer == self.secret)
        terms = {"correct": correct, "answered_symbol": float(answer is not None)}
        if answer is None:
            extra["receiver"] = [f"answer {parse_answer(actions['receiver'])!r} is not one of {self.symbols}"]
        return StepResult(
            rewards={"sender": correct, "receiver": correct},
            reward_terms={"sender": dict(terms), "receiver": dict(terms)},
            notes=extra,
            active=set(),
        )

    def _base_info(self, agent: str) -> dict[str, Any]:
        info = super()._base_info(agent)
        if agent == "receiver":
            info["allowed_outputs"] = list(self.symbols)
        return info


parallel_env, env, raw_env = entry_points(RelayEnv)
