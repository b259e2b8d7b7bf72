"""The preference family's config section (`TrainConfig.preference`), plain data: no torch import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from textzoo.errors import ConfigError
from textzoo.typecheck import check_fields

Selection = Literal["gap", "random", "all"]
SELECTIONS: tuple[str, ...] = get_args(Selection)
"""How pairs are picked among a prompt's samples (`textzoo.algorithms.preference.madpo.select_pairs`)."""
Pooling = Literal["mean", "last"]
POOLINGS: tuple[str, ...] = get_args(Pooling)
"""How a reward-model member reads a joint text (`textzoo.algorithms.preference.reward_model`)."""


@dataclass
class PreferenceConfig:
    """Settings of the preference family: MADPO, MARLHF's reward model, iterative rounds."""

    rl_algo: str = "magrpo"
    """The online algorithm marlhf trains with its reward model's rewards (any non-preference algo)."""
    iterations: int = 1
    """Rounds of the preference pipeline (madpo, marlhf); `steps` is split evenly between them."""
    beta: float = 0.1
    """β of DPO: the scale of the implicit reward β·(ℓ − ℓ_ref)."""
    reference: Literal["initial", "none"] = "initial"
    """"initial": a frozen copy of each agent's initial weights; "none": reference-free DPO."""
    pair_selection: Selection = "gap"
    """gap (largest reward gap first) | random | all (every ordered pair r_w > r_l, in sample order)."""
    pairs_per_prompt: int = 4
    """At most this many pairs per prompt (0 = no cap)."""
    epochs: int = 1
    """Passes over each step's pairs (DPO is off-policy, so several are fine)."""
    minibatches: int = 1
    """Optimizer steps per pass over the pairs."""
    replay_pairs: int = 0
    """Older pairs (stored as token ids) replayed beside each step's new pairs (0 = no replay)."""
    replay_capacity: int = 512
    """Newest pairs the replay store keeps."""
    comparator: Literal["current", "copy", "history", "model"] = "current"
    """Who the current team is compared with each round: current (its own K samples only), copy (a
    frozen copy taken at the round's start), history (the team `history_k` rounds back), model
    (`comparator_model`, frozen; it must share the agents' tokenizer)."""
    history_k: int = 1
    """Rounds back of the `history` comparator (round r compares with the team of round max(r−k, 0))."""
    comparator_model: str = ""
    """Model of the `model` comparator (a hub id or local folder; "tiny" builds one locally)."""
    reward_model: str = "tiny"
    """MARLHF reward-model trunk: "tiny" (a tiny model built like the agents'), "actor" (a copy of the first
    actor's model at the start of the run), or a model id / folder."""
    rm_train_trunk: bool = True
    """Train the reward model's trunk with its head; False freezes the trunk and trains the head only."""
    rm_pooling: Pooling = "mean"
    """How a reward-model member reads a joint text: "mean" (its head averaged over every token) or
    "last" (its head at the last token)."""
    rm_ensemble: int = 1
    """Reward-model members (each on its own bootstrap weights of the pairs; "tiny" members on their own
    random trunks); the reward is their mean less `rm_disagreement_penalty` x their std."""
    rm_disagreement_penalty: float = 0.0
    """λ of the ensemble reward mean − λ·std (needs rm_ensemble >= 2 to have an effect)."""
    rm_lr: float = 1e-3
    """AdamW learning rate of the reward model."""
    rm_epochs: int = 6
    """Bradley–Terry passes over each round's reward-model pairs (at most, with early stopping)."""
    rm_minibatches: int = 8
    """Optimizer steps per reward-model pass."""
    rm_batches: int = 16
    """Batches of batch_prompts x group_size samples collected per round for the reward model."""
    rm_pair_selection: Selection = "all"
    """Pairs of each reward-model prompt: all (every pair r_w > r_l) | gap (largest reward gap first) | random."""
    rm_pairs_per_prompt: int = 0
    """At most this many reward-model pairs per prompt (0 = no cap)."""
    rm_holdout: float = 0.2
    """Fraction of each round's reward-model prompts held out (all their pairs) to measure pair accuracy."""
    rm_early_stopping: bool = True
    """Keep the reward model of the epoch with the best held-out pair accuracy (needs rm_holdout > 0)."""
    rm_max_tokens: int = 128
    """Longest joint text the reward model reads (keeps the last tokens)."""
    hacking_window: int = 20
    """Steps over which a rising reward-model score and a falling task reward are flagged as reward
    hacking (a logged warning and `rm/hacking`); 0 turns the check off."""
    hacking_threshold: float = 0.5
    """How clear both trends must be: |Pearson r| between step and per-step mean, in (0, 1]."""

    def __post_init__(self) -> None:
        check_fields(self, "preference.")
        if self.beta <= 0:
            raise ConfigError(f"preference.beta must be > 0, got {self.beta}")
        if self.comparator == "model" and not self.comparator_model:
            raise ConfigError("preference.comparator='model' needs preference.comparator_model (a model id or folder)")
        for name in ("pairs_per_prompt", "replay_pairs", "replay_capacity", "rm_pairs_per_prompt", "hacking_window"):
            if getattr(self, name) < 0:
                raise ConfigError(f"preference.{name} must be >= 0, got {getattr(self, name)}")
        for name in (
            "iterations",
            "epochs",
            "minibatches",
            "history_k",
            "rm_epochs",
            "rm_minibatches",
            "rm_batches",
            "rm_max_tokens",
            "rm_ensemble",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"preference.{name} must be >= 1, got {getattr(self, name)}")
        if self.replay_pairs > self.replay_capacity:
            raise ConfigError("preference.replay_pairs cannot exceed preference.replay_capacity; raise the capacity")
        if self.rm_lr <= 0:
            raise ConfigError(f"preference.rm_lr must be > 0, got {self.rm_lr}")
        if not 0 <= self.rm_holdout < 1:
            raise ConfigError(f"preference.rm_holdout must be in [0, 1), got {self.rm_holdout}")
        if self.rm_disagreement_penalty < 0:
            raise ConfigError(f"preference.rm_disagreement_penalty must be >= 0, got {self.rm_disagreement_penalty}")
        if not 0 < self.hacking_threshold <= 1:
            raise ConfigError(f"preference.hacking_threshold must be in (0, 1], got {self.hacking_threshold}")
