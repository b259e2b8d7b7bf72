"""Family `actor_critic`: IAC and MAAC with V or Q critics; IPPO and MAPPO with ratio clipping.

Critics (`textzoo.models.critic.Critic`): IAC gives every trainable actor its own critic reading the
actor's prompt (V) or prompt + completion (Q); MAAC has one centralized critic reading `state()`
before the turn (V), followed by every actor's completion of that turn (Q).

Turn-level GAE (Schulman et al. 2016) over each actor's decision turns t (r̃ = the team reward with
credit "shared", the actor's own reward with "per_agent"):
    δ_t = r̃_t + γ V(s_{t+1}) − V(s_t),   V = 0 after the last turn (termination and truncation alike)
    A_t = Σ_k (γλ)^k δ_{t+k},            y_t = A_t + V(s_t)   (λ = 1: Monte Carlo, λ = 0: TD(0))
A turn where the actor does not act (Relay's receiver at turn 0) folds into the decision before it:
its reward is discounted onto that decision and γ spans the gap. With a Q critic, V(s_t) above reads
Q(s_t, a_t) (the SARSA(λ) form). Optional per-actor advantage standardisation over the batch.
Every formula is a function of `textzoo.algorithms.rlmath` (`gae`, `policy_gradient_loss`, `critic_loss`).

Losses: the actor's is `policy_gradient_loss` (the REINFORCE family's, PPO-clip with `clip_range`,
each token of a rollout engine's sample weighted by min(π_trainer/π_engine, C) under `agent.engine.tis`)
minus an optional entropy bonus; the critic's is c_v·(V − y)², or with value clipping ε_v
c_v·max((V − y)², (V_old + clip(V − V_old, −ε_v, ε_v) − y)²) (PPO2 value clipping).
Values are computed once per sample under no_grad when the batch arrives (the old values of value
clipping); MAAC's critic is one learner stepped once per batch over all its samples.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import torch

from textzoo.algorithms.actor_critic.config import ActorCriticConfig, check_actor_critic
from textzoo.algorithms.batch import ActorSamples, Job, Rollout, SampleBatch
from textzoo.algorithms.family import RolloutNeeds, engine_token_weights, policy_jobs, trainable_samples
from textzoo.algorithms.rlmath import (
    BatchNorm,
    credited_rewards,
    critic_loss,
    entropy_bonus,
    gae,
    policy_gradient_loss,
)
from textzoo.decoding.generation import Generation
from textzoo.decoding.inference import chunks
from textzoo.decoding.modes import eval_mode
from textzoo.errors import ConfigError
from textzoo.models.critic import Critic
from textzoo.models.policy import Policy
from textzoo.models.team import Actor


# ---- losses of one micro-batch: routing to textzoo.algorithms.rlmath ----------------------------------
def actor_loss(policy: Policy, cfg: ActorCriticConfig, batch: SampleBatch, norm: BatchNorm):
    """Per-sample actor contributions: the shared policy-gradient loss (engine samples weighted by their
    truncated importance weights, `engine_token_weights`), minus β_H·entropy when set."""
    g = batch.gen
    scored = policy.score(
        g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask, return_entropy=cfg.entropy_coef > 0
    )
    logprobs, entropy = scored if cfg.entropy_coef > 0 else (scored, None)  # [S, C]
    weights, tis_stats = engine_token_weights(policy, g)
    contrib, stats = policy_gradient_loss(
        logprobs, g.logprobs, batch.advantages, g.completion_mask, norm, cfg.loss_aggregation, cfg.clip_range, weights
    )
    stats.update(tis_stats)
    if entropy is not None:
        mask = g.completion_mask.to(entropy.dtype)
        contrib = contrib + cfg.entropy_coef * entropy_bonus(entropy, mask, norm, cfg.loss_aggregation)
        stats["entropy"] = ((entropy * mask).sum() / mask.sum().clamp(min=1)).detach()
    return contrib, stats


def value_job_loss(critic: Critic, cfg: ActorCriticConfig, at_completion: bool, batch: SampleBatch, norm: BatchNorm):
    """Critic loss of one micro-batch: values with gradient against the stored targets and old values."""
    g = batch.gen
    if "features" in batch.extra:  # a head on an actor's trunk learns from the features read at collection
        values = critic.value(batch.extra["features"])
    else:
        values = critic(g.prompt_ids, g.prompt_mask, *((g.completion_ids, g.completion_mask) if at_completion else ()))
    return critic_loss(values, batch.extra["old_values"], batch.extra["targets"], norm, cfg.value_coef, cfg.value_clip)


# ---- the family ---------------------------------------------------------------------------------
@dataclass
class CriticInput:
    """What a critic reads for each of its samples, as a `Generation` (so `run_job` can split it)."""

    gen: Generation
    at_completion: bool  # read at the last completion token (Q on the actor's own tokens)


CriticJobs = tuple[torch.Tensor, list[Job], dict[str, float]]
"""The actors' advantages [E, A, T], the critics' update jobs and their statistics."""


class ActorCriticFamily:
    """Actor jobs (policy gradient on GAE advantages) plus one job per critic; `IACFamily` and `MAACFamily`
    say which critics there are and what they read (`critic_jobs`).

    `critics` maps a learner name to a critic: for IAC `"<actor id>.critic"` per trainable actor,
    for MAAC the single `"critic"`. These names are stable, so checkpoints find the critics and their
    optimizers again.
    """

    centralized: ClassVar[bool] = False
    """One critic over the whole state (MAAC) rather than one per actor (IAC)."""

    def __init__(
        self,
        config: ActorCriticConfig,
        actors: list[Actor],
        critics: dict[str, Critic],
        gamma: float = 1.0,
        credit: str = "shared",
        critic_settings: dict[str, Any] | None = None,
        normalize_per_agent: bool = False,
    ):
        check_actor_critic(config, self.centralized, credit)
        if config.epochs is None:  # built without an algorithm's defaults: one pass
            config = dataclasses.replace(config, epochs=1)
        self.config = config
        self.actors = {a.id: a for a in actors}
        self.gamma = gamma
        self.credit = credit
        self.critics = critics
        self.critic_settings = critic_settings or {}
        self.normalize_per_agent = normalize_per_agent
        expected = self.expected_critics(actors)
        if sorted(critics) != sorted(expected):
            raise ConfigError(f"{self.name} needs critics {expected}, got {sorted(critics)}")
        self.needs = RolloutNeeds()

    name: ClassVar[str] = "actor-critic"

    def expected_critics(self, actors: list[Actor]) -> list[str]:
        """The critics' learner names for this team."""
        raise NotImplementedError

    def critic_jobs(self, rollout: Rollout, rewards: torch.Tensor, samples: dict[str, ActorSamples]) -> CriticJobs:
        """The actors' advantages [E, A, T] (from `rewards` [E, A, T]), the critics' jobs and their statistics."""
        raise NotImplementedError

    def trainable_models(self) -> dict[str, tuple[torch.nn.Module, Any]]:
        return {name: (critic, self.critic_settings.get(name)) for name, critic in self.critics.items()}

    def frozen_models(self) -> dict[str, torch.nn.Module]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}  # critics and their optimizers are learners: the trainer checkpoints them

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def jobs(self, rollout: Rollout) -> tuple[list[Job], dict[str, float]]:
        cfg = self.config
        rewards = credited_rewards(rollout.rewards, rollout.actor_roles, self.credit)  # [E, A, T]
        samples = trainable_samples(rollout, self.actors)
        adv, critic_jobs, stats = self.critic_jobs(rollout, rewards, samples)
        jobs, job_stats = policy_jobs(
            rollout,
            samples,
            adv,
            self.actors,
            lambda policy: partial(actor_loss, policy, cfg),
            cfg.epochs,
            cfg.minibatches,
            self.normalize_per_agent,
        )
        return jobs + critic_jobs, {**stats, **job_stats}

    # ---- critic inputs and values ------------------------------------------------------------
    def _own_inputs(self, name: str, policy: Policy, gen: Generation) -> CriticInput:
        """An IAC critic reads the actor's own tokens when it shares the actor's vocabulary, else text."""
        q = self.config.critic_type == "q"
        if self.reads_ids[name]:
            return CriticInput(gen, at_completion=q)
        prompts = policy.tokenizer.batch_decode(
            [ids[m.bool()].tolist() for ids, m in zip(gen.prompt_ids, gen.prompt_mask)], skip_special_tokens=True
        )
        texts = [p + c for p, c in zip(prompts, gen.texts)] if q else prompts
        return CriticInput(_text_generation(self.critics[name], texts), at_completion=False)

    def _central_inputs(self, rollout: Rollout, where: torch.Tensor) -> CriticInput:
        """`state()` before each (env, turn) of `where` ([N, 2]); a Q critic also reads every actor's action."""
        texts = [rollout.states[t][e] for e, t in where.tolist()]
        if self.config.critic_type == "q":
            row = {(int(e), int(t)): i for i, (e, t) in enumerate(where.tolist())}
            for step in rollout.steps:  # in generation order: actors in team order within a turn
                for e, text in zip(step.env_ids.tolist(), step.gen.texts):
                    i = row[(e, step.turn)]
                    texts[i] += f"\n<{step.actor} action>\n{text}"
        critic = self.critics["critic"]
        return CriticInput(_text_generation(critic, texts), at_completion=False)

    @torch.no_grad()
    def _values(
        self, critic: Critic, inputs: CriticInput, chunk: int = 256
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Values [S] of every sample, once, in eval mode (no dropout): the old values of this batch;
        and, for a head on an actor's trunk, the trunk features [S, d] its job trains the head on."""
        out, feats = [], []
        with eval_mode(critic):
            for part in chunks(inputs.gen, chunk):
                comp = (part.completion_ids, part.completion_mask) if inputs.at_completion else ()
                if critic.shared_trunk and not comp and part.prompt_features is not None:
                    features = part.prompt_features  # the actor's sampling pass read them (same weights)
                else:
                    features = critic.features(part.prompt_ids, part.prompt_mask, *comp)  # [s, d]
                out.append(critic.value(features).float().cpu())
                if critic.shared_trunk:
                    feats.append(features)
        values = torch.cat(out) if out else torch.zeros(0)
        return values, (torch.cat(feats) if feats else None)

    def _critic_job(
        self,
        name: str,
        inputs: CriticInput,
        old: torch.Tensor,
        targets: torch.Tensor,
        advantages: torch.Tensor,
        features: torch.Tensor | None = None,
    ) -> Job:
        cfg = self.config
        extra = {"old_values": old, "targets": targets}
        if features is not None:
            extra["features"] = features
        batch = SampleBatch(inputs.gen, advantages, extra=extra)
        return Job(
            name,
            batch,
            partial(value_job_loss, self.critics[name], cfg, inputs.at_completion),
            epochs=cfg.epochs,
            minibatches=cfg.minibatches,
        )

    @staticmethod
    def _value_stats(name: str, old: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        var = float(targets.var(unbiased=False)) if targets.numel() > 1 else 0.0
        explained = 1.0 - float((targets - old).var(unbiased=False)) / var if var > 0 else 0.0
        return {
            f"agent/{name}/value": float(old.mean()),
            f"agent/{name}/return": float(targets.mean()),
            f"agent/{name}/explained_variance": explained,
        }


class IACFamily(ActorCriticFamily):
    """IAC / IPPO: a critic per trainable actor, reading that actor's prompt (V) or its sample too (Q)."""

    name = "iac"

    def __init__(self, config: ActorCriticConfig, actors: list[Actor], critics: dict[str, Critic], **kwargs: Any):
        super().__init__(config, actors, critics, **kwargs)
        # a critic reads its actor's token ids when their vocabularies match (checked once)
        self.reads_ids = {
            critic_name(a.id): _same_vocab(critics[critic_name(a.id)].tokenizer, a.policy.tokenizer)
            for a in actors
            if a.trainable
        }

    def expected_critics(self, actors: list[Actor]) -> list[str]:
        return [critic_name(a.id) for a in actors if a.trainable]

    def critic_jobs(self, rollout: Rollout, rewards: torch.Tensor, samples: dict[str, ActorSamples]) -> CriticJobs:
        E, A, T = rewards.shape
        adv, critic_jobs, stats = torch.zeros(E, A, T), [], {}
        for ai, actor_id in enumerate(rollout.actors):
            name = critic_name(actor_id)
            if name not in self.critics or actor_id not in samples:
                continue
            gen, env_ids, turns = samples[actor_id].gen, samples[actor_id].env_ids, samples[actor_id].turns
            inputs = self._own_inputs(name, self.actors[actor_id].policy, gen)
            old, features = self._values(self.critics[name], inputs)  # [S], [S, d] or None
            values = torch.zeros(E, T)
            values[env_ids, turns] = old.cpu()
            a_adv, targets = gae(rewards[:, ai], values, rollout.active[:, ai], self.gamma, self.config.gae_lambda)
            adv[:, ai] = a_adv
            critic_jobs.append(
                self._critic_job(name, inputs, old, targets[env_ids, turns], a_adv[env_ids, turns], features)
            )
            stats.update(self._value_stats(name, old, targets[env_ids, turns]))
        return adv, critic_jobs, stats


class MAACFamily(ActorCriticFamily):
    """MAAC / MAPPO: one centralized critic over the whole state (every role's prompt; Q: and samples)."""

    name = "maac"
    centralized = True

    def expected_critics(self, actors: list[Actor]) -> list[str]:
        return ["critic"]

    def critic_jobs(self, rollout: Rollout, rewards: torch.Tensor, samples: dict[str, ActorSamples]) -> CriticJobs:
        E, A, T = rewards.shape
        decided = rollout.active.any(1)  # [E, T] some actor acted
        where = decided.nonzero()  # [N, 2] (env, turn)
        inputs = self._central_inputs(rollout, where)
        old, _ = self._values(self.critics["critic"], inputs)  # [N]
        values = torch.zeros(E, T)
        values[where[:, 0], where[:, 1]] = old.cpu()
        team_adv, targets = gae(rollout.team_rewards, values, decided, self.gamma, self.config.gae_lambda)  # [E, T]
        adv = team_adv.unsqueeze(1).expand(E, A, T)  # [E, A, T]
        targets, team_adv = targets[where[:, 0], where[:, 1]], team_adv[where[:, 0], where[:, 1]]  # [N]
        return (
            adv,
            [self._critic_job("critic", inputs, old, targets, team_adv)],
            self._value_stats("critic", old, targets),
        )


def critic_name(actor_id: str) -> str:
    """Learner name of an IAC actor's critic (stable: checkpoints key critics by it)."""
    return f"{actor_id}.critic"


def _same_vocab(a: Any, b: Any) -> bool:
    return a is b or (a is not None and b is not None and a.get_vocab() == b.get_vocab())


def _text_generation(critic: Critic, texts: list[str]) -> Generation:
    """Texts encoded by the critic's tokenizer, as prompts of a `Generation` with empty completions."""
    ids, mask = critic.encode(texts)  # [N, L]
    empty = torch.zeros((len(texts), 0), dtype=torch.long)  # [N, 0]
    return Generation(ids, mask, empty, empty.clone(), empty.float(), texts=list(texts))
