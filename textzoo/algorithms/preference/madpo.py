"""Family `preference`: multi-agent DPO (MADPO) over pairs of joint samples, with a frozen reference.

Candidates are the K joint samples of each prompt (the runner's G samples, plus a comparator's when
the iterative pipeline adds them). Pairs (w, l) with r_w > r_l (team episode reward; ties dropped),
chosen per prompt by reward gap, at random, or all, at most `pairs_per_prompt` each.
The team's joint policy is the product of the agents' policies, so the implicit joint reward is
Σ_i β(ℓ_i(y_i) − ℓ_ref,i(y_i)) (DPO, Rafailov et al. 2023, eq. 7, with a factorised policy). Agent i's
loss on a pair:
    L_i = −log σ(β [Δ_i + Σ_{j≠i} sg(Δ_j)]),
    Δ_i = [ℓ_i(y_i^w) − ℓ_ref,i(y_i^w)] − [ℓ_i(y_i^l) − ℓ_ref,i(y_i^l)],
ℓ = the sequence log-prob (sum over completion tokens), sg = stop-gradient: the partners' Δ_j are
computed once per batch under no_grad. `reference="none"` drops the ℓ_ref terms (CoMLRL's only
variant); `reference="initial"` keeps a frozen copy of each trainable agent's initial weights (a frozen
agent is its own reference, so its Δ_j is 0). A centralized team is one joint actor: N = 1.
Pairs are kept as token ids in a replay store, so a replayed pair is scored on exactly the tokens
that were sampled.

A "sample" of the update is a pair: `textzoo.algorithms.rlmath.dpo_loss` returns one contribution per pair.
Pairs sampled by a rollout engine (`agent.engine.kind="vllm"`) are not importance-weighted: DPO is not a
policy gradient on the sampled tokens, so `agent.engine.tis` (truncated importance sampling, applied by
the policy-gradient families) has no effect here and no `agent/<id>/tis_weight` is logged.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from textzoo.algorithms.batch import ActorStep, Job, PairBatch, Rollout
from textzoo.algorithms.family import RolloutNeeds
from textzoo.algorithms.preference.config import SELECTIONS, PreferenceConfig
from textzoo.algorithms.rlmath import BatchNorm, dpo_loss
from textzoo.decoding.generation import Generation
from textzoo.decoding.inference import score_no_grad
from textzoo.errors import ConfigError
from textzoo.models.policy import Policy
from textzoo.models.team import Actor, frozen_references, reference_models


# ---- pairs -------------------------------------------------------------------------------------
def select_pairs(
    rewards: torch.Tensor, mode: str = "gap", cap: int = 0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Pairs (b, w, l) with rewards[b, w] > rewards[b, l] (ties dropped), at most `cap` per prompt.

    `rewards` [B, K]. "gap" keeps the largest gaps (ties in gap by sample order), "random" a random
    subset, "all" every pair in (w, l) order. Returns [S, 3] long.
    """
    if mode not in SELECTIONS:
        raise ConfigError(f"pair selection must be one of {SELECTIONS}, got {mode!r}")
    B, K = rewards.shape
    w, l = torch.meshgrid(torch.arange(K), torch.arange(K), indexing="ij")
    w, l = w.reshape(-1), l.reshape(-1)  # [K*K] every ordered pair
    out = []
    for b in range(B):
        r = rewards[b]
        keep = r[w] > r[l]
        pw, pl = w[keep], l[keep]  # [P]
        if mode == "gap":
            order = torch.sort(r[pw] - r[pl], descending=True, stable=True).indices
        elif mode == "random":
            order = torch.randperm(len(pw), generator=generator)
        else:
            order = torch.arange(len(pw))
        if cap:
            order = order[:cap]
        out.append(torch.stack([torch.full_like(pw[order], b), pw[order], pl[order]], 1))
    return torch.cat(out) if out else torch.zeros(0, 3, dtype=torch.long)


def episode_samples(rollout: Rollout, actor: str, pad_id: int) -> Generation:
    """The actor's sample in every env copy, row e = env copy e ([E] rows).

    MADPO pairs whole episodes, so each actor must act exactly once per episode (single-turn tasks,
    or turn-taking ones such as Relay-v0).
    """
    samples = rollout.samples(actor, pad_id)
    env_ids = samples.env_ids if samples is not None else torch.zeros(0, dtype=torch.long)
    if len(env_ids) != rollout.num_envs or len(set(env_ids.tolist())) != rollout.num_envs:
        raise ConfigError(
            f"madpo pairs whole episodes and needs every actor to act exactly once per episode; {actor!r} made "
            f"{len(env_ids)} samples in {rollout.num_envs} episodes. Use algo=marlhf (reward model + online RL) "
            "for tasks where an actor acts in several turns"
        )
    return samples.gen.select(torch.argsort(env_ids))


def _shift(steps: list[ActorStep], old_G: int, new_G: int, offset: int) -> list[ActorStep]:
    """Renumber env copies b*old_G + g to b*new_G + offset + g."""
    out = []
    for s in steps:
        b, g = s.env_ids // old_G, s.env_ids % old_G
        out.append(ActorStep(s.actor, s.turn, b * new_G + offset + g, s.gen, s.greedy))
    return out


def merge_groups(a: Rollout, b: Rollout) -> Rollout:
    """One rollout with the G_a + G_b samples of each prompt (a's first); both played the same prompts."""
    if a.items != b.items or a.roles != b.roles or a.actors != b.actors or a.actor_roles != b.actor_roles:
        raise ConfigError("only rollouts of the same prompts and team can be merged into one candidate pool")
    Ga, Gb, B = a.group_size, b.group_size, a.num_prompts
    G = Ga + Gb
    T = max(a.rewards.shape[-1], b.rewards.shape[-1])

    def cat(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # [E, ..., T] per rollout -> [B*G, ..., T], turns padded with zeros
        x = F.pad(x, (0, T - x.shape[-1])).view(B, Ga, *x.shape[1:-1], T)
        y = F.pad(y, (0, T - y.shape[-1])).view(B, Gb, *y.shape[1:-1], T)
        return torch.cat([x, y], 1).reshape(B * G, *x.shape[2:])

    def cat_states(x: list[list[str]], y: list[list[str]]) -> list[list[str]]:
        out = []
        for t in range(T):
            xs = x[t] if t < len(x) else [""] * len(x[0])
            ys = y[t] if t < len(y) else [""] * len(y[0])
            out.append([s for p in range(B) for s in xs[p * Ga : (p + 1) * Ga] + ys[p * Gb : (p + 1) * Gb]])
        return out

    terms = {}
    for k in set(a.reward_terms) | set(b.reward_terms):
        x = a.reward_terms.get(k, torch.zeros(a.num_envs, len(a.roles)))
        y = b.reward_terms.get(k, torch.zeros(b.num_envs, len(b.roles)))
        terms[k] = cat(x.unsqueeze(-1), y.unsqueeze(-1)).squeeze(-1)
    return Rollout(
        num_prompts=B,
        group_size=G,
        roles=a.roles,
        actors=a.actors,
        actor_roles=a.actor_roles,
        items=a.items,
        steps=_shift(a.steps, Ga, G, 0) + _shift(b.steps, Gb, G, Ga),
        rewards=cat(a.rewards, b.rewards),
        active=cat(a.active.float(), b.active.float()).bool(),
        states=cat_states(a.states, b.states),
        reward_terms=terms,
    )


class PairStore:
    """The newest `capacity` pairs as token ids, per actor (what was sampled, never re-tokenized)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.sides: dict[str, dict[str, Generation]] = {}  # actor -> {"chosen", "rejected"} on CPU

    def __len__(self) -> int:
        return len(next(iter(self.sides.values()))["chosen"]) if self.sides else 0

    def add(self, pairs: dict[str, PairBatch], pad_ids: dict[str, int]) -> None:
        if not self.capacity or not pairs:
            return
        for actor, batch in pairs.items():
            held = self.sides.get(actor)
            new = {"chosen": batch.chosen.to("cpu"), "rejected": batch.rejected.to("cpu")}
            if held is not None:
                new = {k: Generation.cat([held[k], new[k]], pad_ids[actor]) for k in new}
            n = len(new["chosen"])
            keep = torch.arange(max(n - self.capacity, 0), n)
            self.sides[actor] = {k: g.select(keep) for k, g in new.items()}

    def sample(self, n: int) -> dict[str, PairBatch]:
        """`n` stored pairs drawn without replacement (global torch RNG), the same rows for every actor."""
        size = len(self)
        if not n or not size:
            return {}
        rows = torch.randperm(size)[:n]
        return {a: PairBatch(s["chosen"].select(rows), s["rejected"].select(rows)) for a, s in self.sides.items()}

    def state_dict(self) -> dict[str, Any]:
        keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "logprobs")
        return {a: {side: {k: getattr(g, k) for k in keys} for side, g in s.items()} for a, s in self.sides.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # texts are for reading only; a restored pair is scored from its ids
        self.sides = {
            a: {side: Generation(**t, texts=[""] * len(t["prompt_ids"])) for side, t in s.items()}
            for a, s in state.items()
        }


# ---- the loss of one micro-batch: routing to textzoo.algorithms.rlmath.dpo_loss -----------------------
def madpo_loss(policy: Policy, beta: float, batch: PairBatch, norm: BatchNorm):
    """The DPO loss of one micro-batch of pairs: chosen and rejected scored in one forward."""
    m = len(batch)
    both = Generation.cat([batch.chosen, batch.rejected], pad_id=policy.pad_id)
    logp = policy.score(both.prompt_ids, both.prompt_mask, both.completion_ids, both.completion_mask).sum(-1)  # [2m]
    extra = batch.extra
    return dpo_loss(logp[:m], logp[m:], extra.get("ref_chosen"), extra.get("ref_rejected"), extra["others"], beta, norm)


def sequence_logprobs(policy: Policy, gen: Generation) -> torch.Tensor:
    """Sequence log-probs [S] (float, CPU) under `policy`, in eval mode, without gradients."""
    return score_no_grad(policy, gen).sum(-1).float().cpu()


# ---- the family ----------------------------------------------------------------------------------
class MADPOFamily:
    """Turns the K joint samples of each prompt into pairs and one DPO job per trainable actor.

    A comparator's samples of the same prompts, when the runner attaches them as
    `rollout.infos["comparator"]`, join the candidate pool.
    """

    needs = RolloutNeeds()

    def __init__(self, config: PreferenceConfig, actors: list[Actor]):
        self.config = config
        self.actors = {a.id: a for a in actors}
        self.store = PairStore(config.replay_capacity if config.replay_pairs else 0)
        # frozen copies of the initial weights, made before any checkpoint is loaded
        self.references: dict[str, Policy] = frozen_references(actors) if config.reference == "initial" else {}

    def trainable_models(self) -> dict:
        return {}

    def frozen_models(self) -> dict[str, torch.nn.Module]:
        return reference_models(self.references)

    def state_dict(self) -> dict[str, Any]:
        return {"store": self.store.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.store.load_state_dict(state.get("store", {}))

    def pairs(self, rollout: Rollout) -> tuple[dict[str, PairBatch], torch.Tensor]:
        """Selected pairs of this rollout per actor, and their (r_w, r_l) [S, 2]."""
        cfg = self.config
        if "comparator" in rollout.infos:
            rollout = merge_groups(rollout, rollout.infos["comparator"])
        B, K = rollout.num_prompts, rollout.group_size
        episode = rollout.team_rewards.sum(-1).view(B, K)  # [B, K] joint outcome of each sample
        chosen = select_pairs(episode, cfg.pair_selection, cfg.pairs_per_prompt)  # [S, 3]
        e_w = chosen[:, 0] * K + chosen[:, 1]  # [S]
        e_l = chosen[:, 0] * K + chosen[:, 2]  # [S]
        out = {}
        for actor_id, actor in self.actors.items():
            gen = episode_samples(rollout, actor_id, actor.policy.pad_id)
            out[actor_id] = PairBatch(gen.select(e_w), gen.select(e_l))
        rewards = torch.stack([episode.view(-1)[e_w], episode.view(-1)[e_l]], 1)  # [S, 2]
        return out, rewards

    def deltas(self, pairs: dict[str, PairBatch]) -> dict[str, torch.Tensor]:
        """Δ_i [S] of every actor on the pairs, under no_grad (0 for an actor that is its own reference)."""
        out = {}
        for actor_id, batch in pairs.items():
            actor = self.actors[actor_id]
            if self.config.reference == "initial" and actor_id not in self.references:
                out[actor_id] = torch.zeros(len(batch))  # a frozen agent: π = π_ref
                continue
            delta = sequence_logprobs(actor.policy, batch.chosen) - sequence_logprobs(actor.policy, batch.rejected)
            if actor_id in self.references:
                ref = self.references[actor_id]
                batch.extra["ref_chosen"] = sequence_logprobs(ref, batch.chosen)
                batch.extra["ref_rejected"] = sequence_logprobs(ref, batch.rejected)
                delta = delta - (batch.extra["ref_chosen"] - batch.extra["ref_rejected"])
            out[actor_id] = delta
        return out

    def jobs(self, rollout: Rollout) -> tuple[list[Job], dict[str, float]]:
        cfg = self.config
        new, rewards = self.pairs(rollout)
        replay = self.store.sample(cfg.replay_pairs)
        self.store.add(new, {a: act.policy.pad_id for a, act in self.actors.items()})
        pairs = {}
        for actor_id, batch in new.items():
            old, pad = replay.get(actor_id), self.actors[actor_id].policy.pad_id
            pairs[actor_id] = (
                batch
                if old is None
                else PairBatch(
                    Generation.cat([batch.chosen, old.chosen], pad), Generation.cat([batch.rejected, old.rejected], pad)
                )
            )
        stats = {
            "pairs/new": float(len(rewards)),
            "pairs/replayed": float(len(next(iter(replay.values()))) if replay else 0.0),
            "pairs/reward_gap": float((rewards[:, 0] - rewards[:, 1]).mean()) if len(rewards) else 0.0,
        }
        if not len(rewards) and not replay:
            return [], stats  # every sample of every prompt tied: no preference to learn from
        deltas = self.deltas(pairs)
        total = sum(deltas.values())  # [S] Σ_j Δ_j
        jobs = []
        for actor_id, batch in pairs.items():
            actor = self.actors[actor_id]
            if not actor.trainable:
                continue
            batch.extra["others"] = total - deltas[actor_id]  # [S] Σ_{j≠i} Δ_j, fixed for this batch
            stats[f"agent/{actor_id}/implicit_margin"] = float(cfg.beta * deltas[actor_id].mean())
            jobs.append(
                Job(
                    actor_id,
                    batch,
                    partial(madpo_loss, actor.policy, cfg.beta),
                    epochs=cfg.epochs,
                    minibatches=cfg.minibatches,
                    max_new_tokens=actor.policy.generation.max_new_tokens,
                )
            )
        return jobs, stats
