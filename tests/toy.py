"""Tiny non-LLM agents and tasks with known optima, for fast algorithm tests.

`CategoricalPolicy` implements the whole policy interface (`textzoo.models.interface.PolicyInterface`:
generate/score returning `Generation`s, tokenizer None) but is a single softmax over a handful of
words, so learning can be checked against an exact optimum. `TargetWordEnv` rewards each agent for
saying its own target word.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from textzoo.decoding.generation import Generation, GenerationConfig
from textzoo.envs.base import StepResult, TextParallelEnv


class _Logits(torch.nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(k))


class CategoricalPolicy:
    """π(word) = softmax(θ)[word]; a completion is one token (the word's index)."""

    def __init__(self, words: list[str]):
        self.words = list(words)
        self.model = _Logits(len(words))
        self.generation = GenerationConfig(max_new_tokens=1)
        self.pad_id = 0
        self.eos_id = 0
        self.eos_ids: tuple[int, ...] = ()  # a completion is one word: no token ends it early
        self.tokenizer = None
        self.engine = None  # samples with its own draw

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def probs(self) -> torch.Tensor:
        return torch.softmax(self.model.logits.detach(), -1)

    def generate(self, prompts: list[str], *, greedy: bool = False, generator=None) -> Generation:
        n = len(prompts)
        with torch.no_grad():
            logp = torch.log_softmax(self.model.logits, -1)
            if greedy:
                tokens = logp.argmax().repeat(n)
            else:
                tokens = torch.multinomial(logp.exp().expand(n, -1), 1, generator=generator).squeeze(-1)
        ones = torch.ones(n, 1, dtype=torch.long)
        return Generation(
            prompt_ids=ones.clone(),
            prompt_mask=ones.clone(),
            completion_ids=tokens.view(n, 1),
            completion_mask=ones.clone(),
            logprobs=logp[tokens].view(n, 1),
            texts=[self.words[t] for t in tokens],
        )

    def prompt_cache(self):
        return nullcontext()  # nothing to share: the prompt is not read

    def score(self, prompt_ids, prompt_mask, completion_ids, completion_mask, *, return_entropy=False):
        logp = torch.log_softmax(self.model.logits, -1)  # [K]
        out = logp[completion_ids] * completion_mask  # [S, 1]
        if return_entropy:
            ent = -(logp.exp() * logp).sum().expand_as(out)
            return out, ent
        return out


class TargetWordEnv(TextParallelEnv):
    """Agent i earns 1 for saying `targets[i]`; the team reward is the mean (per-agent terms in infos)."""

    metadata = {"name": "target_word", "render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(self, targets: dict[str, str], items: int = 16):
        super().__init__(list(targets), num_turns=1, max_prompt_chars=64, max_action_chars=64)
        self.targets = targets
        self.items = items

    def num_items(self) -> int:
        return self.items

    def _reset_task(self, index: int) -> dict[str, str]:
        return {a: f"say your word ({index})" for a in self.possible_agents}

    def _step_task(self, actions, notes) -> StepResult:
        own = {a: float(actions[a].strip() == self.targets[a]) for a in self.possible_agents}
        terms = {a: {"own_hit": own[a]} for a in self.possible_agents}
        return StepResult(rewards=own, reward_terms=terms)
