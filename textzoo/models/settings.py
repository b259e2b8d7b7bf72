"""The agents' config sections and the names they choose from, as plain data (no torch import).

`SamplingConfig` (how an agent samples), the family sections `ReinforceConfig`, `ActorCriticConfig` and
`PreferenceConfig`, and the rules across their fields, checked when a config is built. The modules that
do the work (`generation`, `reinforce`, `actor_critic`, `preference`, `rlmath`, `precision`,
`prompting`, `joint`) import these from here, so `textzoo.config` and `textzoo train --help`
never load torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from textzoo.errors import ConfigError
from textzoo.typecheck import check_fields

CREDITS = ("shared", "per_agent", "acting_role")
"""How rewards are credited; "acting_role" (self-play) needs the roles each actor played per turn
(`rlmath.acting_role_returns`), which the reinforce family reads from the rollout."""
"""Who is credited with a reward: the team (shared) or each agent (per_agent)."""
ESTIMATORS = ("grpo", "rloo", "remax", "reinforce")
"""Baselines of the reinforce family (`textzoo.algorithms.rlmath.advantages`)."""
GROUP_ESTIMATORS = ("grpo", "rloo")
"""Estimators that compare the samples of a group (they need group_size >= 2)."""
AGGREGATION_NAMES = ("seq_sum", "seq_mean", "token_mean", "constant")
"""`loss_aggregation` names (`textzoo.algorithms.rlmath.AGGREGATIONS` holds their functions)."""
AUTO = "auto"
"""The precision name resolved per model and device when the model is built (`textzoo.models.precision.resolve`)."""
PRECISION_NAMES = (AUTO, "fp32", "bf16-mixed", "bf16-weights", "fp16-weights")
"""`AgentConfig.precision` names (`textzoo.models.precision.PRECISIONS` holds what each but "auto" means)."""
LEGACY_DTYPES = {"float32": "fp32", "bfloat16": "bf16-weights", "float16": "fp16-weights"}
"""The old `AgentConfig.dtype` values and the precision each meant."""
PROMPT_STYLES = ("auto", "raw", "chat")
"""`AgentConfig.prompt_format` values (`textzoo.models.prompting`)."""
JOINT_FORMATS = ("structured", "tags", "labels", "json")
"""Joint formats of the centralized actor (`textzoo.models.joint`); the free-form ones are all but "structured"."""
TINY_MODELS = ("tiny", "tiny-gpt2", "tiny-llama")
"""Model names built locally from a config (byte-level tokenizers, no chat template)."""
SELECTIONS = ("gap", "random", "all")
REFERENCES = ("initial", "none")
COMPARATORS = ("current", "copy", "history", "model")
POOLINGS = ("mean", "last")


@dataclass
class SamplingConfig:
    """The sampling settings a user chooses; `GenerationConfig` and the runner's `AgentConfig` share them."""

    max_new_tokens: int = 32
    """Token budget of one completion; a sample that reaches it ends there (its last token is scored)."""
    temperature: float = 1.0
    """Logits are divided by this for sampling and scoring alike (log-probs are of the scaled distribution)."""
    top_p: float = 1.0
    """Nucleus sampling: draw from the smallest set of tokens with this much mass (1.0 = off)."""
    top_k: int = 0
    """Draw from the k most likely tokens only (0 = off)."""
    stop_strings: tuple[str, ...] = ()
    """A sample ends once its text contains one of these; the text keeps the stop string."""
    max_prompt_tokens: int = 384
    """Longer prompts keep their last tokens (a runner lowers it further when prompt + completion would
    not fit the model's positions; the centralized joint actor gets N roles x this)."""

    _where: ClassVar[str] = "generation"  # the config name in error messages

    def __post_init__(self) -> None:
        where = self._where
        check_fields(self, f"{where}.")
        if isinstance(self.stop_strings, str):
            raise ConfigError(f"{where}.stop_strings must be a sequence of strings, not one string; wrap it in a tuple")
        self.stop_strings = tuple(self.stop_strings)
        if self.max_new_tokens < 1:
            raise ConfigError(f"{where}.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature > 0:
            raise ConfigError(f"{where}.temperature must be > 0 (use greedy=True for argmax), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"{where}.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"{where}.top_k must be >= 0 (0 = off), got {self.top_k}")
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise ConfigError(f"{where}.stop_strings must be non-empty strings, got {self.stop_strings!r}")
        if self.max_prompt_tokens < 1:
            raise ConfigError(f"{where}.max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")

    def sampling(self) -> dict[str, object]:
        """The `SamplingConfig` fields of this config, by name (what a `GenerationConfig` is derived from)."""
        return {f.name: getattr(self, f.name) for f in fields(SamplingConfig)}


def check_policy_update(
    section: str, aggregation: str, clip_range: float | None, epochs: int, minibatches: int
) -> None:
    """The policy-update settings that the reinforce and actor-critic configs share, checked alike."""
    if aggregation not in AGGREGATION_NAMES:
        raise ConfigError(f"{section}.loss_aggregation must be one of {sorted(AGGREGATION_NAMES)}, got {aggregation!r}")
    if clip_range is not None and not 0 < clip_range < 1:
        raise ConfigError(f"{section}.clip_range must be in (0, 1) or None, got {clip_range}")
    if epochs < 1 or minibatches < 1:
        raise ConfigError(f"{section}.epochs and {section}.minibatches must be >= 1")


def check_estimator(estimator: str, group_size: int) -> None:
    """An estimator exists and has the group it needs (grpo and rloo compare samples of a group)."""
    if estimator not in ESTIMATORS:
        raise ConfigError(f"unknown estimator {estimator!r}; choose one of {ESTIMATORS}")
    if estimator in GROUP_ESTIMATORS and group_size < 2:
        raise ConfigError(f"{estimator} compares samples within a group: set group_size >= 2 (got {group_size})")


@dataclass
class ReinforceConfig:
    """Settings of the group-relative REINFORCE family."""

    advantage_scale: str = "std"
    """"std": divide by the group's std of returns (+1e-6); "none": leave unscaled (Dr. GRPO)."""
    std_floor: float = 0.0
    """Lower bound on the group std when scaling, so near-constant sparse rewards do not blow up."""
    loss_aggregation: str = "seq_sum"
    """seq_sum | seq_mean | token_mean | constant (`textzoo.algorithms.rlmath.AGGREGATIONS`)."""
    clip_range: float | None = None
    """PPO ratio clip ε; None = plain on-policy REINFORCE gradient."""
    epochs: int = 1
    """Passes over each batch (>1 needs clip_range so the off-policy ratio is bounded)."""
    minibatches: int = 1
    """Optimizer steps per pass over a batch."""
    kl_coef: float = 0.0
    """β of the KL to a frozen copy of the initial policy (k1 in the reward, k3 in the loss: see kl_in);
    0 disables the reference copy."""
    kl_in: str = "reward"
    """"reward": subtract β·Σ_k log(π/π_ref) (k1) from the turn's reward; "loss": add β·KL_k3 per token to the loss."""
    joint_mode: str = "aligned"
    """"aligned": sample g of every agent forms joint action g; "cross": all G^N combinations."""
    reinforce_baseline: str = "none"
    """For estimator reinforce: "none", "running_mean" (mean of past returns, momentum 0.9) or "per_role"
    (RAE: an average of the returns of the role each sample played, momentum 0.95; for self-play)."""
    tree_rollout: bool = False
    """atgrpo only: after each turn keep each prompt's best branch (team reward of the turn; ties: the first)
    and copy it to the prompt's other G − 1 env copies, so every turn's G samples come from one state."""

    def __post_init__(self) -> None:
        check_fields(self, "reinforce.")
        if self.advantage_scale not in ("std", "none"):
            raise ConfigError(f"reinforce.advantage_scale must be 'std' or 'none', got {self.advantage_scale!r}")
        check_policy_update("reinforce", self.loss_aggregation, self.clip_range, self.epochs, self.minibatches)
        if self.epochs > 1 and self.clip_range is None:
            raise ConfigError("reinforce.epochs > 1 reuses samples off-policy: set reinforce.clip_range (e.g. 0.2)")
        if self.kl_coef < 0:
            raise ConfigError(f"reinforce.kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_in not in ("reward", "loss"):
            raise ConfigError(f"reinforce.kl_in must be 'reward' or 'loss', got {self.kl_in!r}")
        if self.joint_mode not in ("aligned", "cross"):
            raise ConfigError(f"reinforce.joint_mode must be 'aligned' or 'cross', got {self.joint_mode!r}")
        if self.reinforce_baseline not in ("none", "running_mean", "per_role"):
            raise ConfigError(
                "reinforce.reinforce_baseline must be 'none', 'running_mean' or 'per_role', "
                f"got {self.reinforce_baseline!r}"
            )
        if self.std_floor < 0:
            raise ConfigError(f"reinforce.std_floor must be >= 0, got {self.std_floor}")


@dataclass
class ActorCriticConfig:
    """Settings of the actor-critic family (IAC, MAAC, IPPO, MAPPO)."""

    critic_type: str = "v"
    """"v": V(s) at the last prompt token; "q": Q(s, a) at the last completion token."""
    critic_model: str = ""
    """Critic trunk: "" = a copy of the actor's model (IAC) / of `agent.model` (MAAC); "actor" = a value
    head on the actor's own trunk (IAC/IPPO: no second model; only the head learns from the value
    loss, on features read once per batch); else a model spec."""
    critic_lr: float | None = None
    """AdamW learning rate of the critics; None = the agent's lr."""
    value_head_hidden: int = 0
    """Width of a hidden tanh layer in the value head (0 = a linear head)."""
    value_head_init_std: float = 0.0
    """Std of the value head's output weights at init (0 = zeros: every value starts at 0)."""
    critic_max_tokens: int = 1024
    """Longest critic input (the model's position limit caps it); longer inputs keep their last tokens."""
    gae_lambda: float = 1.0
    """GAE λ over turns: 1 = Monte Carlo returns minus V, 0 = one-step TD."""
    value_coef: float = 1.0
    """c_v, the weight of the critic's squared error."""
    value_clip: float | None = None
    """ε_v of PPO-style value clipping around the old value; None = no clipping."""
    entropy_coef: float = 0.0
    """Weight of the actor's entropy bonus (0 = off)."""
    loss_aggregation: str = "seq_sum"
    """seq_sum | seq_mean | token_mean | constant (`textzoo.algorithms.rlmath.AGGREGATIONS`)."""
    clip_range: float | None = None
    """PPO ratio clip ε of the actor loss; None = on-policy gradient. ippo / mappo default it to 0.2."""
    epochs: int | None = None
    """Passes over each batch, actors and critics alike (>1 needs clip_range); None = the algorithm's
    default: 1, or 2 for ippo / mappo."""
    minibatches: int = 1
    """Optimizer steps per pass over a batch."""

    def __post_init__(self) -> None:
        check_fields(self, "actor_critic.")
        if self.critic_type not in ("v", "q"):
            raise ConfigError(f"actor_critic.critic_type must be 'v' or 'q', got {self.critic_type!r}")
        if self.critic_lr is not None and self.critic_lr <= 0:
            raise ConfigError(f"actor_critic.critic_lr must be > 0 (or None for the agent's lr), got {self.critic_lr}")
        if self.value_head_hidden < 0:
            raise ConfigError(
                f"actor_critic.value_head_hidden must be >= 0 (0 = linear head), got {self.value_head_hidden}"
            )
        if self.value_head_init_std < 0:
            raise ConfigError(f"actor_critic.value_head_init_std must be >= 0, got {self.value_head_init_std}")
        if self.critic_max_tokens < 1:
            raise ConfigError(f"actor_critic.critic_max_tokens must be >= 1, got {self.critic_max_tokens}")
        if not 0 <= self.gae_lambda <= 1:
            raise ConfigError(f"actor_critic.gae_lambda must be in [0, 1], got {self.gae_lambda}")
        if self.value_coef <= 0:
            raise ConfigError(f"actor_critic.value_coef must be > 0, got {self.value_coef}")
        if self.value_clip is not None and self.value_clip <= 0:
            raise ConfigError(f"actor_critic.value_clip must be > 0 or None, got {self.value_clip}")
        if self.entropy_coef < 0:
            raise ConfigError(f"actor_critic.entropy_coef must be >= 0, got {self.entropy_coef}")
        epochs = 1 if self.epochs is None else self.epochs  # None: the algorithm's default
        check_policy_update("actor_critic", self.loss_aggregation, self.clip_range, epochs, self.minibatches)


def check_actor_critic(config: ActorCriticConfig, centralized: bool, credit: str) -> None:
    """The actor-critic rules across fields (`TrainConfig` checks them before anything is built)."""
    if (config.epochs or 1) > 1 and config.clip_range is None:
        raise ConfigError("actor_critic.epochs > 1 reuses samples off-policy: set actor_critic.clip_range (e.g. 0.2)")
    if centralized and credit != "shared":
        raise ConfigError(
            "maac/mappo's centralized critic estimates the team's return: use credit='shared' "
            "(or iac/ippo, whose per-agent critics follow credit='per_agent')"
        )
    if centralized and config.critic_model == "actor":
        raise ConfigError(
            "actor_critic.critic_model='actor' puts a value head on each actor's trunk: use it with "
            "iac/ippo (maac/mappo's critic reads the whole state, not one actor's prompt)"
        )


@dataclass
class PreferenceConfig:
    """Settings of the preference family: MADPO, MARLHF's reward model, iterative rounds."""

    beta: float = 0.1
    """β of DPO: the scale of the implicit reward β·(ℓ − ℓ_ref)."""
    reference: str = "initial"
    """"initial": a frozen copy of each agent's initial weights; "none": reference-free DPO."""
    pair_selection: str = "gap"
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
    comparator: str = "current"
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
    rm_pooling: str = "mean"
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
    rm_pair_selection: str = "all"
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
        if self.reference not in REFERENCES:
            raise ConfigError(f"preference.reference must be one of {REFERENCES}, got {self.reference!r}")
        if self.pair_selection not in SELECTIONS:
            raise ConfigError(f"preference.pair_selection must be one of {SELECTIONS}, got {self.pair_selection!r}")
        if self.comparator not in COMPARATORS:
            raise ConfigError(f"preference.comparator must be one of {COMPARATORS}, got {self.comparator!r}")
        if self.comparator == "model" and not self.comparator_model:
            raise ConfigError("preference.comparator='model' needs preference.comparator_model (a model id or folder)")
        if self.rm_pair_selection not in SELECTIONS:
            raise ConfigError(
                f"preference.rm_pair_selection must be one of {SELECTIONS}, got {self.rm_pair_selection!r}"
            )
        if self.rm_pooling not in POOLINGS:
            raise ConfigError(f"preference.rm_pooling must be one of {POOLINGS}, got {self.rm_pooling!r}")
        for name in ("pairs_per_prompt", "replay_pairs", "replay_capacity", "rm_pairs_per_prompt", "hacking_window"):
            if getattr(self, name) < 0:
                raise ConfigError(f"preference.{name} must be >= 0, got {getattr(self, name)}")
        for name in (
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
