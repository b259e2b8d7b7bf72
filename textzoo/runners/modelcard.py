"""What an export says about its models: base models (hub id, license), the facts of the run, the model
cards and team.json.

The cards are rendered from the Jinja templates in `textzoo/runners/templates/` (`model_card.md`,
`critic_card.md`, `team_card.md`) over one context, built once per export by `team_context`; team.json
(`team_manifest`) is the machine-readable part of the same context. Each model's context holds a held-out
prompt of the task (item 0 of the evaluation split, as the run's evaluation resets it) and the greedy
completion textzoo makes of it with the exported weights, which the card's loading snippets reproduce.
"""

from __future__ import annotations

import importlib.resources
import json
import logging
import re
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jinja2
import torch

import textzoo
from textzoo.config import TrainConfig
from textzoo.models.joint import JointActor
from textzoo.models.loading import gguf_metadata, is_gguf
from textzoo.models.lora import AdapterView
from textzoo.models.settings import TINY_MODELS
from textzoo.runners.build import env_factory
from textzoo.runners.exported import TRAINING_CONFIG
from textzoo.runners.provenance import source_commit
from textzoo.runners.rollout import prompt_seed

logger = logging.getLogger(__name__)

TINY_ARCH = {"tiny": "gpt2", "tiny-gpt2": "gpt2", "tiny-llama": "llama"}
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts as `max_lora_rank` (a card's vLLM snippet names the smallest that holds the rank)."""
_QUANT_SUFFIX = re.compile(r"[.-](?:I?Q\d[\w]*|F16|F32|BF16)$", re.IGNORECASE)


@dataclass(frozen=True)
class BaseModel:
    """Where a model's base weights come from, as a card, an adapter and team.json name it."""

    setting: str
    """The run's model setting: a tiny model's name, a hub id, a folder or a .gguf file."""
    kind: str
    """tiny | gguf | folder | hub."""
    hub_id: str | None
    """The hub id a card names as `base_model` (None: the base is on no hub, or not known to be)."""
    license: str | None
    slug: str
    """A folder name for it under `bases/`."""
    folder: str | None = None
    """`bases/<name>` when the export holds a copy of it."""
    load_path: str | None = None
    """What loads it: a hub id, a folder (absolute), or its copy in the export; None: nothing outside the run."""

    @property
    def only_in_run(self) -> bool:
        """Nothing outside the run loads these weights (a model built from a config, a dequantized .gguf)."""
        return self.kind in ("tiny", "gguf")


def describe_base(setting: str, hub_id: str = "") -> BaseModel:
    """The `BaseModel` of a run's model setting; ``hub_id`` overrides the hub id it would name."""
    if setting in TINY_MODELS:
        return BaseModel(setting, "tiny", hub_id or None, None, f"tiny-{TINY_ARCH[setting]}")
    if is_gguf(setting):
        meta = gguf_metadata(setting)
        guess = hub_id or _gguf_hub_id(setting, meta)
        stem = _QUANT_SUFFIX.sub("", Path(setting).stem)
        return BaseModel(setting, "gguf", guess, meta.get("general.license"), _slug(stem))
    folder = Path(setting).expanduser()
    if folder.is_dir():
        front = _front_matter(folder / "README.md")
        license = front.get("license")
        return BaseModel(
            setting, "folder", hub_id or None, license, _slug(folder.name), load_path=str(folder.resolve())
        )
    return BaseModel(setting, "hub", hub_id or setting, _hub_license(setting), _slug(setting), load_path=setting)


def _gguf_hub_id(path: str, meta: dict[str, str]) -> str | None:
    """The hub repository a .gguf file was converted from: its source repository field when it has one, else
    `general.organization` / the file name without its quantization suffix (a guess the log names)."""
    repo = meta.get("general.source.huggingface.repository")
    if repo:
        return repo
    url = meta.get("general.source.url", "")
    if url.startswith("https://huggingface.co/"):
        return "/".join(url.removeprefix("https://huggingface.co/").split("/")[:2])
    org = meta.get("general.organization")
    if not org:
        return None
    guess = f"{org}/{_QUANT_SUFFIX.sub('', Path(path).stem)}"
    logger.warning(
        "%s names no source repository; its cards name %s as base_model (its organization and file name): pass "
        "base_model_ids (--base-model-ids) to name another",
        Path(path).name,
        guess,
    )
    return guess


def _slug(name: str) -> str:
    return re.sub(r"[^\w.-]+", "-", name.split("/")[-1]).strip("-.").lower() or "base"


def _front_matter(readme: Path) -> dict[str, str]:
    """The top-level `key: value` scalars of a README's YAML front matter ({} without one)."""
    if not readme.is_file():
        return {}
    match = re.match(r"---\n(.*?)\n---", readme.read_text(errors="replace"), re.DOTALL)
    if not match:
        return {}
    out = {}
    for line in match.group(1).splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip() and not line.startswith((" ", "-")):
            out[key.strip()] = value.strip().strip("'\"")
    return out


def _hub_license(repo: str) -> str | None:
    """The license in a hub model's card, when the local hub cache holds the card (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(repo, "README.md")
    except Exception:  # not a valid repo id, or no cache: the license stays unknown
        return None
    return _front_matter(Path(path)).get("license") if isinstance(path, str) else None


# ---- the context of one export ------------------------------------------------------------------
def team_context(
    plan: Any, entries: dict[str, dict[str, Any]], out: Path, provenance: list[dict[str, Any]]
) -> dict[str, Any]:
    """Everything the cards and team.json say about an export (module docstring): `plan` is the
    `textzoo.runners.export.ExportPlan`, `entries` each model's plan, actor and `BaseModel` by its id."""
    cfg = plan.cfg
    metrics = held_out_metrics(plan.run_dir, plan.step)
    observations = example_observations(cfg)
    models = {
        model_id: model_facts(e["model"], e["actor"], e["base"], out, observations) for model_id, e in entries.items()
    }
    last = provenance[-1] if provenance else {}
    return {
        "out": str(out),
        "task": {"id": cfg.env, "kwargs": cfg.env_kwargs, "eval_kwargs": cfg.eval_env_kwargs},
        "algo": cfg.algo,
        "mode": cfg.collaboration,
        "roles": plan.roles,
        "models": models,
        "run": {
            "dir": str(plan.run_dir.resolve()),
            "step": plan.step,
            "steps": cfg.steps,
            "episodes": plan.step * cfg.batch_prompts * cfg.group_size,
            "batch_prompts": cfg.batch_prompts,
            "group_size": cfg.group_size,
            "seed": cfg.seed,
            "eval_prompts": cfg.eval_prompts,
            "metrics": metrics,
            "commands": [row["command"] for row in provenance],
            "textzoo_version": last.get("textzoo_version"),
            "source_commit": last.get("source_commit"),
        },
        "exported_by": {"textzoo_version": textzoo.__version__, "source_commit": source_commit()},
        "training_config": TRAINING_CONFIG,
    }


def held_out_metrics(run_dir: Path, step: int) -> dict[str, float]:
    """The run's held-out metrics (`eval/...`) logged at `step` ({} when it did not evaluate then)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("step") == step and any(k.startswith("eval/") for k in row):
            return {k: v for k, v in sorted(row.items()) if k.startswith("eval/")}
    return {}


def example_observations(cfg: TrainConfig) -> dict[str, str]:
    """The observations of held-out item 0 at the first turn, as the run's evaluation (of `cfg`) resets it."""
    env = env_factory(cfg, eval=True)()
    try:
        observations, _ = env.reset(seed=prompt_seed(cfg.seed, -1, 0), options={"index": 0})
    finally:
        env.close()
    return dict(observations)


def model_facts(m: Any, actor: Any, base: BaseModel, out: Path, observations: dict[str, str]) -> dict[str, Any]:
    """What the card and team.json say about one actor's model (`m`: its `ModelPlan`)."""
    policy = actor.policy
    fmt = actor.prompt_format
    tokenizer = policy.tokenizer
    lora = None
    if isinstance(policy.model, AdapterView):
        peft_config = policy.model.shared.model.peft_config[policy.model.adapter]
        lora = {
            "rank": peft_config.r,
            "alpha": peft_config.lora_alpha,
            "target_modules": sorted(peft_config.target_modules),
            "vllm_max_lora_rank": next((r for r in VLLM_LORA_RANKS if r >= peft_config.r), peft_config.r),
        }
    g = policy.generation
    facts: dict[str, Any] = {
        "id": m.id,
        "roles": list(m.roles),
        "kind": m.kind,
        "folder": None if m.kind == "frozen" else m.id,
        "path": None if m.kind == "frozen" else str(out / m.id),
        "base": asdict(base),
        "lora": lora,
        "precision": policy.precision,
        "trainable_parameters": _parameters(policy.model),
        "prompt_format": {
            "style": fmt.style,
            "system_prompt": fmt.system_prompt,
            "chat_template_kwargs": dict(fmt.chat_template_kwargs),
        },
        "chat_template": getattr(tokenizer, "chat_template", None) if fmt.chat else None,
        "generation": {
            "max_new_tokens": g.max_new_tokens,
            "temperature": g.temperature,
            "top_p": g.top_p,
            "top_k": g.top_k,
            "stop_strings": list(g.stop_strings),
            "max_prompt_tokens": g.max_prompt_tokens,
            "eos_token_ids": list(policy.eos_ids),
            "allowed_token_ids": None if g.allowed_tokens is None else sorted({*g.allowed_tokens, *policy.eos_ids}),
        },
        "joint": joint_facts(actor) if isinstance(actor, JointActor) else None,
    }
    if m.kind != "frozen":
        facts["example"] = greedy_example(actor, observations)
    return facts


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def greedy_example(actor: Any, observations: dict[str, str]) -> dict[str, Any]:
    """One held-out prompt of the actor's roles and the greedy completion textzoo makes of it: the prompt
    text (before formatting), its token ids as formatted, the completion's token ids (forced ones of a
    structured joint completion included) and its text."""
    prompt = actor.build_prompt({r: observations[r] for r in actor.roles if r in observations})
    gen = actor.generate([prompt], greedy=True)
    prompt_ids = gen.prompt_ids[0][gen.prompt_mask[0].bool()].tolist()
    written = gen.completion_mask[0].nonzero()
    end = int(written[-1]) + 1 if len(written) else 0
    return {
        "observations": {r: observations[r] for r in actor.roles if r in observations},
        "prompt": str(prompt),
        "prompt_ids": prompt_ids,
        "completion_ids": gen.completion_ids[0, :end].tolist(),
        "completion": gen.texts[0],
    }


def joint_facts(actor: JointActor) -> dict[str, Any]:
    """The joint actor's prompt format: its settings and the layout of one joint prompt and completion."""
    placeholders = {r: f"{{task of {r}}}" for r in actor.roles}
    prompt = actor.build_prompt(placeholders)
    layout: list[dict[str, Any]] = [{"prompt": str(prompt)}]
    if actor.structured:
        tokenizer = actor.policy.tokenizer
        roles = list(actor.roles)
        sampled = iter(roles)
        for segment in actor.script(dict(prompt.observations)):
            if segment.forced:
                layout.append({"forced": tokenizer.decode(list(segment.forced))})
            else:
                layout.append({"sampled": next(sampled), "budget": segment.budget})
    else:
        layout.append({"sampled": "every role", "budget": actor.policy.generation.max_new_tokens})
    return {
        "format": actor.joint_format,
        "roles": list(actor.roles),
        "section_tokens": actor.section_tokens or max(actor.policy.generation.max_new_tokens // len(actor.roles), 1),
        "task_tokens": actor.task_tokens,
        "max_new_tokens": actor.policy.generation.max_new_tokens,
        "layout": layout,
    }


# ---- rendering ---------------------------------------------------------------------------------------
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_template_source),
        undefined=jinja2.StrictUndefined,  # a missing fact is an error, never a blank in a card
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["json"] = lambda v: json.dumps(v, ensure_ascii=False)
    env.filters["py"] = _python_literal
    env.filters["indent_block"] = lambda text, n=4: textwrap.indent(text, " " * n)
    return env


def _template_source(name: str) -> str:
    return (importlib.resources.files("textzoo.runners") / "templates" / name).read_text()


def _python_literal(value: Any) -> str:
    """`value` as Python source (strings as JSON strings, which Python reads the same)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)


def model_card(context: dict[str, Any], model_id: str) -> str:
    """The README.md of an exported model (`templates/model_card.md`)."""
    return _environment().get_template("model_card.md").render(**context, model=context["models"][model_id])


def team_card(context: dict[str, Any]) -> str:
    """The README.md at the top of an export (`templates/team_card.md`)."""
    return _environment().get_template("team_card.md").render(**context)


def critic_card(context: dict[str, Any], name: str, module: torch.nn.Module) -> str:
    """The README.md of an exported critic (`templates/critic_card.md`)."""
    return _environment().get_template("critic_card.md").render(**context, name=name, critic=critic_facts(module))


def critic_facts(module: torch.nn.Module) -> dict[str, Any]:
    """What critic.json says: the trunk, the head's layout and the weights the file holds."""
    head = getattr(module, "head", None)
    trunk = getattr(module, "trunk", None)
    config = getattr(trunk, "config", None)
    return {
        "class": f"{type(module).__module__}.{type(module).__qualname__}",
        "shared_trunk": bool(getattr(module, "shared_trunk", False)),
        "trunk_model_type": getattr(config, "model_type", None),
        "head": repr(head) if head is not None else None,
        "max_tokens": getattr(module, "max_tokens", None),
        "parameters": _parameters(module),
    }


def team_manifest(context: dict[str, Any], format: int) -> dict[str, Any]:
    """team.json: the task, the roles and who answers for each, the models, the run (module docstring)."""
    models = context["models"]
    roles = {}
    for model in models.values():
        for role in model["roles"]:
            base = model["base"]
            roles[role] = {
                "model": model["id"],
                "folder": model["folder"],
                "kind": model["kind"],
                "base": base["folder"] or base["load_path"] or base["setting"],
            }
    return {
        "format": format,
        "task": context["task"],
        "mode": context["mode"],
        "algo": context["algo"],
        "roles": {r: roles[r] for r in context["roles"]},
        "models": {k: {f: v for f, v in m.items() if f != "path"} for k, m in models.items()},
        "textzoo_version": context["run"]["textzoo_version"],
        "source_commit": context["run"]["source_commit"],
        "run": {k: v for k, v in context["run"].items() if k not in ("textzoo_version", "source_commit")},
        "exported_by": context["exported_by"],
        "training_config": context["training_config"],
    }
