"""`textzoo export`: a run's trained models out of textzoo's checkpoint layout, as transformers folders or
PEFT adapters with model cards and a team manifest.

`export_run` reads one verified checkpoint of a run (the newest, or step N) and writes::

    OUT/
      team.json              the task and its kwargs, each role and the folder that answers for it, the mode, the
                             prompt formats and chat templates, the step, held-out metrics, textzoo version and commit
      training_config.json   the run's config (`textzoo train --config training_config.json` trains it again)
      README.md              the team's card: who answers for which role, and how to evaluate the team
      <model>/               one per trained model (an agent's role, or `joint`), with its card (README.md):
                               merged: a `transformers` folder (config.json, model.safetensors, tokenizer with its
                                       chat template, generation_config.json with the agent's sampling settings)
                               adapter: a PEFT folder (adapter_config.json, adapter_model.safetensors, whose
                                       base_model_name_or_path names the base; tokenizer; generation_config.json)
      bases/<name>/          a base that exists only inside the run (a tiny model built from its config, a .gguf
                             file dequantized): the exact weights the adapters were trained on and frozen agents run
      critics/<name>/        with `with_critics`: each critic's weights, critic.json and its card

A LoRA agent is exported as its adapter (`lora="auto"`, `"adapters"`) or merged into its base (`"merge"`); a
fully fine-tuned agent as its whole model. Frozen agents are not copied: team.json names their base (a hub id
or a folder; a `bases/` folder only when the base exists nowhere else).

Everything a user can get wrong (no verified checkpoint, a step that does not exist, `--merge-lora` on a run
without adapters, an existing OUT) fails before anything is written. The export is written into a hidden
folder beside OUT and renamed into place, so an interrupted export leaves OUT absent or whole.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import save_file
from transformers import GenerationConfig

from textzoo.algorithms import registry
from textzoo.config import AgentConfig, TrainConfig
from textzoo.config_files import load_config, save_config
from textzoo.errors import CheckpointError, ConfigError
from textzoo.models.lora import AdapterView
from textzoo.models.policy import Policy
from textzoo.models.team import Actor
from textzoo.runners import modelcard
from textzoo.runners.build import build_actors, env_factory
from textzoo.runners.checkpoint import (
    PREFIX,
    apply_weights,
    check_weights,
    checkpoints_dir,
    latest_intact,
    list_checkpoints,
    read_checkpoint,
    step_name,
    verify,
)
from textzoo.runners.exported import TEAM_FILE, TRAINING_CONFIG, with_agents
from textzoo.runners.provenance import rows_until

logger = logging.getLogger(__name__)

LoraExport = Literal["auto", "merge", "adapters"]
"""How LoRA agents are exported: auto and adapters (the adapter, on its base), merge (merged into the base)."""
FORMAT = 1
"""The team.json format this textzoo writes and reads."""
STAGING = ".export-"
"""Infix of the hidden folder an export is written into, beside OUT (`.OUT.export-<pid>`)."""
OLD = ".old-"
"""Infix of the hidden folder an --overwrite moves the previous export to, just before its rename."""


@dataclass
class ModelPlan:
    """What the export writes for one actor of the team."""

    id: str
    """The actor's id: its role (decentralized) or "joint" (centralized)."""
    roles: tuple[str, ...]
    agent: AgentConfig
    kind: Literal["merged", "adapter", "frozen"]
    """merged: a transformers folder; adapter: a PEFT folder; frozen: not copied (team.json names its base)."""


@dataclass
class ExportPlan:
    """Everything `export_run` checked before building a model: the checkpoint, the config, what goes where."""

    run_dir: Path
    out: Path
    checkpoint: Path
    step: int
    cfg: TrainConfig
    roles: list[str]
    models: list[ModelPlan]
    critics: list[str]
    """Learners of the checkpoint that are not actors (critics, value heads) to export; [] unless asked."""


# ---- checks: everything before anything is built or written ------------------------------------------
def checkpoint_step(path: Path) -> int:
    return int(path.name[len(PREFIX) :])


def find_checkpoint(run_dir: Path, step: int | None) -> Path:
    """The verified checkpoint of `step` (None: the newest verified one), or a `CheckpointError` saying why not."""
    if not run_dir.is_dir():
        raise CheckpointError(f"run dir {str(run_dir)!r} does not exist: pass a folder written by textzoo train")
    found = list_checkpoints(run_dir)
    steps = [checkpoint_step(p) for p in found]
    if step is None:
        path, damage = latest_intact(run_dir)
        if path is None:
            detail = "; ".join(damage) if damage else "it has no checkpoints (a run writes one at its end)"
            raise CheckpointError(f"no verified checkpoint in {run_dir}: {detail}")
        for problem in damage:
            logger.warning("skipping damaged checkpoint %s", problem)
        return path
    path = checkpoints_dir(run_dir) / step_name(step)
    if step not in steps:
        raise CheckpointError(
            f"{run_dir} has no checkpoint of step {step}; it has steps {steps or 'none'} (keep_last keeps the newest "
            "checkpoints only): pass one of those to --step, or leave --step out for the newest"
        )
    problem = verify(path)
    if problem is not None:
        raise CheckpointError(f"the checkpoint of step {step} in {run_dir} is damaged: {problem}; export another step")
    return path


def plan_export(
    run_dir: str | Path,
    out: str | Path,
    step: int | None = None,
    lora: LoraExport = "auto",
    with_critics: bool = False,
    overwrite: bool = False,
) -> ExportPlan:
    """Check an export and say what it writes; raises a `TextzooError` (nothing built, nothing written)."""
    run_dir, out = Path(run_dir), Path(out)
    if lora not in ("auto", "merge", "adapters"):
        raise ConfigError(f"lora export must be auto, merge or adapters, got {lora!r}")
    checkpoint = find_checkpoint(run_dir, step)
    _check_out(run_dir, out, overwrite)
    try:
        cfg = load_config(checkpoint / "config.json")
    except ConfigError as e:
        raise CheckpointError(f"the config stored in {checkpoint} no longer loads: {e}") from e
    registry.configure(cfg)
    trained = set(json.loads((checkpoint / "manifest.json").read_text())["models"])
    probe = env_factory(cfg)()
    roles = list(probe.possible_agents)
    probe.close()
    if cfg.collaboration == "centralized":
        budget = cfg.joint_max_new_tokens or len(roles) * cfg.agent.max_new_tokens
        actors = [("joint", tuple(roles), dataclasses.replace(cfg.agent, max_new_tokens=budget))]
    else:
        actors = [(role, (role,), cfg.agent_config(role)) for role in roles]
    models = []
    for actor_id, actor_roles, agent in actors:
        kind = "frozen"
        if actor_id in trained:
            kind = "adapter" if agent.lora.rank and lora != "merge" else "merged"
        models.append(ModelPlan(actor_id, actor_roles, agent, kind))
    learned = [m for m in models if m.kind != "frozen"]
    if lora == "merge" and not any(m.agent.lora.rank for m in learned):
        raise ConfigError(
            f"--merge-lora merges LoRA adapters, and the models this run trained ({', '.join(m.id for m in learned)}) "
            "have none (lora.rank 0: fully fine-tuned, exported whole anyway): drop --merge-lora"
        )
    if lora == "adapters" and any(not m.agent.lora.rank for m in learned):
        full = ", ".join(m.id for m in learned if not m.agent.lora.rank)
        raise ConfigError(
            f"--adapters exports LoRA adapters, and {full} has none (lora.rank 0: fully fine-tuned, exported as a "
            "whole model): drop --adapters (LoRA models are exported as adapters by default)"
        )
    for m in models:
        _check_folder_name(m.id)
    critics = sorted(trained - {m.id for m in models}) if with_critics else []
    return ExportPlan(run_dir, out, checkpoint, checkpoint_step(checkpoint), cfg, roles, models, critics)


def _check_out(run_dir: Path, out: Path, overwrite: bool) -> None:
    run, target = run_dir.resolve(), out.resolve()
    if target == run or run.is_relative_to(target) or target.is_relative_to(run / "checkpoints"):
        raise ConfigError(
            f"--out {out} would hold or replace the run dir {run_dir} or its checkpoints: pick a folder outside it"
        )
    if out.exists() and not overwrite:
        raise ConfigError(f"--out {out} already exists: pass --overwrite to replace it, or pick another folder")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder: pick another path")
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError(f"--out {out} lies under {above}, which is a file, not a folder: pick another path")


def _check_folder_name(name: str) -> None:
    if not re.fullmatch(r"[\w.-]+", name) or name in (".", "..", "bases", "critics"):
        raise ConfigError(f"the model {name!r} cannot be a folder name of an export: rename the role")


# ---- the export ----------------------------------------------------------------------------------
def export_run(
    run_dir: str | Path,
    out: str | Path,
    step: int | None = None,
    lora: LoraExport = "auto",
    with_critics: bool = False,
    overwrite: bool = False,
    base_model_ids: dict[str, str] | None = None,
) -> Path:
    """Export a run's checkpoint (module docstring); returns OUT. ``base_model_ids``: the hub id to name as
    ``base_model`` in the cards for a base given by the run as a .gguf file or a folder (by that setting)."""
    plan = plan_export(run_dir, out, step, lora, with_critics, overwrite)
    ck = read_checkpoint(plan.checkpoint)
    cfg = with_agents(plan.cfg, {"engine": {"kind": "local"}})  # an export samples with no engine
    actors = build_actors(cfg, plan.roles)
    critics = _critics(cfg, actors, plan.critics)
    by_id = {a.id: a for a in actors}
    for m in plan.models:  # every weight checked before any is applied
        if m.kind != "frozen":
            check_weights(by_id[m.id].policy.model, ck.weights[m.id], m.id)
    for name, module in critics.items():
        check_weights(module, ck.weights[name], name)
    for m in plan.models:
        if m.kind != "frozen":
            apply_weights(by_id[m.id].policy.model, ck.weights[m.id])
    for name, module in critics.items():
        apply_weights(module, ck.weights[name])
    out = plan.out
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(out)
    staging = out.parent / f".{out.name}{STAGING}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        _write(staging, plan, by_id, critics, base_model_ids or {})
        _fsync_tree(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _replace(staging, out)
    logger.info("exported step %d of %s to %s", plan.step, plan.run_dir, out)
    return out


def _critics(cfg: TrainConfig, actors: list[Actor], names: list[str]) -> dict[str, torch.nn.Module]:
    """The modules of the learners `names` (critics, value heads) of the run's family."""
    if not names:
        return {}
    trainable = registry.build_family(cfg, actors).trainable_models()
    return {name: trainable[name][0] for name in names}


def _write(
    root: Path, plan: ExportPlan, actors: dict[str, Actor], critics: dict[str, torch.nn.Module], ids: dict[str, str]
) -> None:
    """Every file of the export, into `root`."""
    final = plan.out.resolve()
    bases = _Bases(root, final, ids)
    entries = {}
    for m in plan.models:
        actor = actors[m.id]
        base = bases.of(m, actor.policy)
        folder = root / m.id
        if m.kind == "merged":
            save_merged(actor.policy, folder)
        elif m.kind == "adapter":
            save_adapter(actor.policy, folder, base.load_path)
        entries[m.id] = {"model": m, "actor": actor, "base": base}
    save_config(plan.cfg, root / TRAINING_CONFIG)
    context = modelcard.team_context(plan, entries, final, rows_until(plan.run_dir, plan.step))
    for m in plan.models:
        if m.kind != "frozen":
            (root / m.id / "README.md").write_text(modelcard.model_card(context, m.id))
    for name, module in critics.items():
        save_critic(module, root / "critics" / name)
        (root / "critics" / name / "README.md").write_text(modelcard.critic_card(context, name, module))
    (root / "README.md").write_text(modelcard.team_card(context))
    (root / TEAM_FILE).write_text(json.dumps(modelcard.team_manifest(context, FORMAT), indent=2) + "\n")


class _Bases:
    """The base model of each actor: described once per distinct base (a LoRA team's shared base, a frozen
    agent's own model), and written under `bases/` when it exists only inside the run."""

    def __init__(self, root: Path, final: Path, ids: dict[str, str]):
        self.root, self.final, self.ids = root, final, ids
        self.seen: dict[int, modelcard.BaseModel] = {}

    def of(self, m: ModelPlan, policy: Policy) -> modelcard.BaseModel:
        view = policy.model if isinstance(policy.model, AdapterView) else None
        key = id(view.shared) if view is not None else id(policy.model)
        base = self.seen.get(key) or modelcard.describe_base(m.agent.model, self.ids.get(m.agent.model, ""))
        if base.only_in_run and base.folder is None and m.kind in ("adapter", "frozen"):  # it must load without the run
            taken = {b.folder for b in self.seen.values()}
            name = base.slug if f"bases/{base.slug}" not in taken else f"{base.slug}-{m.id}"
            save_base(policy, self.root / "bases" / name)
            base = dataclasses.replace(base, folder=f"bases/{name}", load_path=str(self.final / "bases" / name))
        self.seen[key] = base
        return base


# ---- writers ---------------------------------------------------------------------------------------
def generation_config(policy: Policy) -> GenerationConfig:
    """The agent's sampling settings as transformers reads them: do_sample with its temperature, top-p and
    top-k, its token budget, every id that ends a sample, its stop strings, and (allowed outputs) every
    other token suppressed."""
    g = policy.generation
    tokenizer = policy.tokenizer
    kwargs: dict[str, Any] = dict(
        do_sample=True,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        max_new_tokens=g.max_new_tokens,
        eos_token_id=list(policy.eos_ids),
        pad_token_id=policy.pad_id,
    )
    if tokenizer.bos_token_id is not None:
        kwargs["bos_token_id"] = tokenizer.bos_token_id
    if g.stop_strings:
        kwargs["stop_strings"] = list(g.stop_strings)
    if g.allowed_tokens is not None:
        allowed = {*g.allowed_tokens, *policy.eos_ids}
        kwargs["suppress_tokens"] = [i for i in range(policy.model.config.vocab_size) if i not in allowed]
    return GenerationConfig(**kwargs)


def save_merged(policy: Policy, folder: Path) -> None:
    """`policy` as a transformers folder: a LoRA agent's adapter merged into a copy of its base, or the
    whole fine-tuned model; its tokenizer and its sampling settings."""
    model = policy.model
    if isinstance(model, AdapterView):
        model = copy.deepcopy(model.shared.model).merge_and_unload(adapter_names=[model.adapter])
    model.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)
    generation_config(policy).save_pretrained(folder)


def save_adapter(policy: Policy, folder: Path, base: str) -> None:
    """A LoRA agent's adapter as a PEFT folder whose `base_model_name_or_path` is `base`, with the tokenizer
    and the agent's sampling settings."""
    view: AdapterView = policy.model
    scratch = folder.with_name(f".{folder.name}.peft")
    view.shared.model.save_pretrained(scratch, selected_adapters=[view.adapter])
    saved = scratch / view.adapter if (scratch / view.adapter).is_dir() else scratch
    folder.mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        os.replace(saved / name, folder / name)
    shutil.rmtree(scratch)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = base
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    policy.tokenizer.save_pretrained(folder)
    generation_config(policy).save_pretrained(folder)


def save_base(policy: Policy, folder: Path) -> None:
    """The base model under `policy` (without any adapter) as a transformers folder with its tokenizer."""
    model = policy.model
    if isinstance(model, AdapterView):
        model = copy.deepcopy(model.shared.model).unload()
    model.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)


def save_critic(module: torch.nn.Module, folder: Path) -> None:
    """A critic's trained weights (as its checkpoint holds them) and what it is (critic.json)."""
    from textzoo.runners.checkpoint import model_weights

    folder.mkdir(parents=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in model_weights(module).items()}
    save_file(tensors, folder / "critic.safetensors")
    (folder / "critic.json").write_text(json.dumps(modelcard.critic_facts(module), indent=2, sort_keys=True) + "\n")


# ---- atomic placement ------------------------------------------------------------------------------
def _remove_stale_staging(out: Path) -> None:
    """Delete what exports to `out` that were killed left beside it (their process is gone): a staging folder,
    or the previous export an --overwrite had moved aside just before its rename."""
    for stale in [*out.parent.glob(f".{out.name}{STAGING}*"), *out.parent.glob(f".{out.name}{OLD}*")]:
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            continue  # another export to the same folder is under way
        shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_tree(root: Path) -> None:
    for path in [*root.rglob("*"), root]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _replace(staging: Path, out: Path) -> None:
    """Rename `staging` to `out`; an existing `out` (overwrite) is moved aside first and deleted after."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}{OLD}{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    staging.rename(out)
    _fsync_tree_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _fsync_tree_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
