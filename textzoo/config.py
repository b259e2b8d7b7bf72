"""Run configuration: dataclasses shared by the Python API and the CLI (tyro maps them 1:1), plain data.

`textzoo.config_files` writes them to and reads them from JSON or TOML.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

import tyro

from textzoo.algorithms.actor_critic.config import ActorCriticConfig
from textzoo.algorithms.preference.config import PreferenceConfig
from textzoo.algorithms.reinforce.config import ReinforceConfig
from textzoo.algorithms.settings import Credit
from textzoo.decoding.settings import AUTO, LEGACY_DTYPES, PRECISION_NAMES, EngineConfig, PrecisionName, SamplingConfig
from textzoo.errors import ConfigError
from textzoo.models.settings import TINY_MODELS, JointFormat, LoRAConfig, PromptStyle
from textzoo.typecheck import check_fields, check_mapping

logger = logging.getLogger(__name__)

EVAL_MODES = ("greedy", "sampled")
"""`TrainConfig.eval_modes` values."""

JsonDict = Annotated[
    dict[str, Any],
    tyro.constructors.PrimitiveConstructorSpec(
        nargs=1,
        metavar="JSON",
        instance_from_str=lambda args: _parse_json(args[0]),
        is_instance=lambda x: isinstance(x, dict),
        str_from_instance=lambda x: [json.dumps(x)],
    ),
]


def _parse_json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"expected a JSON object, got {text!r} ({e})") from e
    if not isinstance(value, dict):
        raise ConfigError(f"expected a JSON object, got {text!r}")
    return value


@dataclass
class UpdateConfig:
    """How updates are executed (the same for every family)."""

    micro_batch_size: int = 8
    """Samples per forward/backward; ignored when per_sample_backward is set."""
    per_sample_backward: bool = False
    """Back-propagate one sample at a time: one sample's activations in memory, same gradient."""
    skip_zero_grad_steps: bool = True
    """Skip the optimizer step when every gradient is exactly zero (no signal in the batch)."""
    parallel_jobs: int = 1
    """Learners updated at once in threads (e.g. 2 on 2 cores with threads=1); same results as one at a time."""
    compile_regions: bool = True
    """Compile the elementwise work between the matrix products of bf16 update passes on CPU (real models;
    `textzoo.decoding.compiled`: ~-15% update on SmolLM2, a C++ compiler and a few seconds' compile per
    process); off: run as written."""

    def __post_init__(self) -> None:
        check_fields(self, "update.")
        if self.micro_batch_size < 1:
            raise ConfigError(f"update.micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.parallel_jobs < 1:
            raise ConfigError(
                f"update.parallel_jobs must be >= 1 (1 = one learner at a time), got {self.parallel_jobs}"
            )


@dataclass
class AgentConfig(SamplingConfig):
    """One agent's model, generation and optimisation settings (the sampling fields are `SamplingConfig`'s;
    the policy's `GenerationConfig` is derived from them by `textzoo.runners.build.generation_config`)."""

    _where: ClassVar[str] = "agent"

    model: str = "tiny"
    """"tiny" (GPT-2 shape built locally), "tiny-llama", a hub id, or a local model folder."""
    n_layer: int = 2
    """Layers of a built tiny model."""
    n_embd: int = 64
    """Width of a built tiny model."""
    n_head: int = 2
    """Attention heads of a built tiny model."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """constant | linear | cosine (decay to 0 over the run, after warmup_steps)."""
    warmup_steps: int = 0
    """Linear warm-up optimizer steps."""
    max_grad_norm: float = 1.0
    """Gradient clipping target (0 disables)."""
    allowed_outputs: tuple[str, ...] = ()
    """Restrict generation (and scoring) to the tokens of these strings plus EOS; empty = no restriction."""
    trainable: bool = True
    """False freezes the agent: it acts but never updates."""
    device: str = "auto"
    """"auto" or a torch device string."""
    precision: PrecisionName = "auto"
    """auto (bf16-mixed for a real model on a device with native bf16 matmuls, else fp32; resolved when the
    model is built and recorded in the run's config.json) | fp32 | bf16-mixed (fp32 weights and AdamW
    state, bf16 autocast forwards) | bf16-weights | fp16-weights (the weights, and so the optimizer
    state, in that dtype)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, one more forward)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """A LoRA adapter on a shared frozen base instead of training the whole model (`lora.rank` > 0)."""
    prompt_format: PromptStyle = "auto"
    """auto (chat when the tokenizer has a chat template, so tiny byte-level models stay raw) | raw (the
    prompt as it is) | chat (the prompt as the user message of the tokenizer's chat template, the
    assistant turn generated): the formatted tokens are what is sampled from and scored."""
    system_prompt: str = ""
    """A system message before this agent's prompts (one per role through agent_overrides); empty = none,
    so a template that has a default system message uses it. Raw prompts get it as a first paragraph."""
    chat_template_kwargs: JsonDict = field(default_factory=dict)
    """Extra variables of the chat template (JSON), e.g. {"enable_thinking": false}."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Where rollouts are sampled (`engine.kind`: local | vllm) and the vLLM engine's settings
    (docs/concepts/engines.md)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lr <= 0:
            raise ConfigError(f"agent.lr must be > 0, got {self.lr}")
        if self.prompt_format == "chat" and self.model in TINY_MODELS:
            raise ConfigError(
                f"agent.prompt_format='chat' needs a tokenizer with a chat template; the {self.model!r} model's "
                "byte-level tokenizer has none: use 'auto' or 'raw', or a pretrained instruct model"
            )
        if not isinstance(self.chat_template_kwargs, dict):
            raise ConfigError(f"agent.chat_template_kwargs must be a JSON object, got {self.chat_template_kwargs!r}")
        kind = self.engine.kind
        if kind != "local" and self.model in TINY_MODELS:
            raise ConfigError(
                f"agent.engine.kind={kind!r} serves pretrained models (a hub id, folder or .gguf file); {self.model!r} "
                "is built in memory with a byte-level tokenizer vLLM cannot load: use agent.engine.kind='local'"
            )
        if kind != "local" and self.lora.rank and self.lora.dropout:
            raise ConfigError(
                f"agent.engine.kind={kind!r} samples with the adapter's weights, never with LoRA dropout: set "
                "agent.lora.dropout=0 or use agent.engine.kind='local'"
            )


FLAT_KEYS: dict[str, tuple[str, str]] = {
    "engine": ("engine", "kind"),
    **{f"engine_{f.name}": ("engine", f.name) for f in dataclasses.fields(EngineConfig) if f.name != "kind"},
    **{f"lora_{f.name}": ("lora", f.name) for f in dataclasses.fields(LoRAConfig)},
}
"""The flat `AgentConfig` fields of configs written before the sections (engine_*, lora_*, and `engine`, the
engine's kind) -> (section, field)."""


def migrate_agent(values: Mapping[str, Any], where: str = "agent.") -> dict[str, Any]:
    """An `AgentConfig` dict (a file's `agent` table, an `agent_overrides` entry) in today's layout; the one
    reader of older layouts (the input is not changed; a dict already in today's layout comes back equal).

    - flat `engine_*` and `lora_*` fields (and `engine` as a string: the engine's kind) moved into the
      `engine` and `lora` sections: `engine_memory` is `engine.memory`, `lora_rank` is `lora.rank`;
    - `dtype` (float32 | bfloat16 | float16 weights) became `precision` (fp32 | bf16-weights | fp16-weights).

    Each old key read is logged once per process as a deprecation note that names its new place.
    """
    out = dict(values)
    if "dtype" in out:
        _read_dtype(out, where)
    moved = [k for k in out if k in FLAT_KEYS and not (k == "engine" and isinstance(out[k], Mapping))]
    for key in moved:
        section, name = FLAT_KEYS[key]
        value = out.pop(key)
        table = out.get(section)
        table = dict(table) if isinstance(table, Mapping) else {}
        if name in table and table[name] != value:
            raise ConfigError(
                f"the config sets {where}{section}.{name} twice, as {where}{key} (its old name) and in "
                f"{where}{section}: keep only {where}{section}.{name}"
            )
        out[section] = {**table, name: value}
    if moved:
        _deprecated(where, tuple(moved))
    return out


def _read_dtype(values: dict[str, Any], where: str) -> None:
    """Read the old `dtype` field of ``values`` as the precision it meant (and drop it)."""
    dtype = values.pop("dtype")
    if dtype is None:  # written as null by every config before `precision` replaced it
        return
    if dtype not in LEGACY_DTYPES:
        raise ConfigError(
            f"{where}dtype must be float32, bfloat16 or float16, got {dtype!r}; the field is replaced by "
            f"{where}precision ({', '.join(PRECISION_NAMES)})"
        )
    meant = LEGACY_DTYPES[dtype]
    precision = values.get("precision", AUTO)
    if precision not in (AUTO, "fp32", meant):
        raise ConfigError(
            f"{where}dtype={dtype!r} (precision {meant!r}) contradicts {where}precision={precision!r}; "
            f"drop {where}dtype, which {where}precision replaces"
        )
    values["precision"] = meant
    _deprecated(where, ("dtype",))


@functools.cache
def _deprecated(where: str, keys: tuple[str, ...]) -> None:
    """Log (once per process for each set of keys) where the old keys went: "agent.engine_*" as "agent.engine.*"."""
    old, new = [], []
    for key in keys:
        if key in ("engine", "dtype"):
            pair = (key, "engine.kind" if key == "engine" else "precision")
        else:
            section = FLAT_KEYS[key][0]
            pair = (f"{section}_*", f"{section}.*")
        if pair[0] not in old:
            old.append(pair[0])
            new.append(pair[1])
    logger.warning(
        "config: %s (an older layout) read as %s; write the new names",
        ", ".join(where + k for k in old),
        ", ".join(where + k for k in new),
    )


@dataclass
class TrainConfig:
    """Everything a training run needs. `textzoo train` with no arguments runs these defaults."""

    env: str = "textzoo/WritingRatio-v0"
    """A registered task id (`--help` lists them; MODULE:ID, e.g. my_pkg.tasks:me/Echo-v0, imports MODULE
    first); the default is Writing-v0's length-ratio reward."""
    env_kwargs: JsonDict = field(default_factory=dict)
    """Keyword arguments of the env (JSON on the command line)."""
    eval_env_kwargs: JsonDict = field(default_factory=lambda: {"split": "eval"})
    """Extra env arguments for held-out evaluation (merged over env_kwargs)."""
    algo: str = "magrpo"
    """A registered algorithm (`--help` lists them; MODULE:NAME imports MODULE first). Its defaults and rules
    are applied when the run is built (`textzoo.algorithms.registry.configure`): e.g. ippo/mappo are iac/maac
    with actor_critic.clip_range 0.2 and epochs 2 unless those are set; marlhf trains `preference.rl_algo` on
    a reward model's rewards."""
    collaboration: Literal["decentralized", "centralized"] = "decentralized"
    """decentralized (one model per role) | centralized (one joint actor answers for every role)."""
    joint_max_new_tokens: int = 0
    """Token budget of the joint actor's completion (centralized); 0 = N roles x agent.max_new_tokens. Structured:
    split evenly into the sections' budgets, the forced markers come on top."""
    joint_section_tokens: dict[str, int] = field(default_factory=dict)
    """Role -> the token budget of its section of the joint answer (centralized, structured; a role's turn
    alone too), e.g. a task preset's per-role budgets; a role not named gets the even split."""
    joint_format: JointFormat = "structured"
    """How the joint actor (centralized) answers: structured (the runner writes everything but the answers as
    forced tokens: with a chat model one conversation of the roles' observations, else each role's tags;
    the model writes only the sections: no parse failures) | tags | labels | json (free-form answers the
    runner parses)."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Settings shared by every agent."""
    agent_overrides: JsonDict = field(default_factory=dict)
    """Per-agent overrides of `agent` fields, e.g. {"summary": {"lr": 1e-4, "model": "path"}}."""
    trainable_agents: tuple[str, ...] = ()
    """Agents that train (others act only), or groups joined by "+" ("a+b"); empty = every trainable agent."""
    alternate_every: int = 0
    """> 0: the trainable_agents entries (each agent, when empty) take turns training, this many steps each."""
    steps: int = 80
    """Training steps (one batch of rollouts and its update each)."""
    batch_prompts: int = 8
    """Prompts per step (B)."""
    group_size: int = 4
    """Samples per prompt (G)."""
    gamma: float = 1.0
    """Discount over turns."""
    credit: Credit = "shared"
    """shared (team reward) | per_agent (each agent's own reward) | acting_role (reinforce family: each
    sample gets the return of the role it played, for one policy playing every side in self-play)."""
    normalize_per_agent: bool = False
    """Standardise each agent's advantages over the batch after the baseline or GAE (Dr. MAS)."""
    seed: int = 0
    """Seed of models, data order and sampling."""
    run_dir: str = ""
    """Output folder; empty = runs/<env>-<algo>-<seed>-<timestamp>."""
    overwrite: bool = False
    """Start over in a run dir that already holds a run (its metrics, samples and checkpoints are deleted
    first); without it such a run dir is refused (continue it with --resume auto instead)."""
    eval_every: int = 0
    """Evaluate on held-out items every k steps (0 = only at the start and the end)."""
    eval_at_start: bool = True
    """Evaluate the untrained models before step 1 (off: a grid whose untrained row is measured once,
    apart, skips repeating it in every cell)."""
    eval_prompts: int = 16
    """Held-out prompts per evaluation."""
    eval_modes: tuple[str, ...] = ("greedy", "sampled")
    """How each evaluation decodes: greedy, sampled or both (one rollout each; logged as eval/<mode>/...)."""
    env_workers: int = 1
    """Threads stepping env copies (raise for code tasks whose reward runs programs)."""
    generate_workers: int = 1
    """Actors on one device that generate at once in threads (2 uses both cores with threads=1)."""
    threads: int = 0
    """torch intra-op threads (0 = leave torch's default)."""
    progress: bool = True
    """Show a progress bar on the console (and a table of held-out completions at each evaluation)."""
    no_signal_steps: int = 5
    """Warn (log) when this many consecutive steps had no gradient signal (every advantage 0, or every
    group's rewards equal; `textzoo.runners.diagnostics`); 0 = never."""
    log_completions: int = 2
    """Episodes per step (and per evaluation) whose prompts as sent, completions and rewards go to
    RUN_DIR/samples.jsonl (and TensorBoard / W&B when on); 0 = none."""
    plot: bool = True
    """Draw the learning curve PNG at the end of the run."""
    save_every: int = 0
    """Write a checkpoint every k steps (0 = only at the end of the run)."""
    keep_last: int = 2
    """Newest checkpoints to keep (0 = keep all)."""
    devices: str = "auto"
    """Devices to spread models over: "auto" (the visible GPUs, else CPU), "cpu", or a list "cuda:0,cuda:1"."""
    device_map: JsonDict = field(default_factory=dict)
    """Model -> device overriding `devices`, e.g. {"summary": "cuda:1", "summary-ref": "cuda:0"}."""
    report_to: tuple[str, ...] = ()
    """Metric sinks besides metrics.jsonl: tensorboard, wandb (pip install textzoo[tracking])."""
    num_processes: int = 1
    """Data-parallel replicas `textzoo train` starts, each on batch_prompts / num_processes prompts."""
    sharding: Literal["replicate", "fsdp"] = "replicate"
    """replicate (every process holds whole models, gradients all-reduced) | fsdp (FSDP2: trainable
    models' parameters, gradients and optimizer state split over the processes; full fine-tuning)."""
    reinforce: ReinforceConfig = field(default_factory=ReinforceConfig)
    """REINFORCE-family settings."""
    actor_critic: ActorCriticConfig = field(default_factory=ActorCriticConfig)
    """Actor-critic-family settings (iac, maac, ippo, mappo)."""
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    """Preference-family settings (madpo, marlhf, iterative rounds)."""
    update: UpdateConfig = field(default_factory=UpdateConfig)
    """Update execution (micro-batches, per-sample backward)."""

    def __post_init__(self) -> None:
        check_fields(self)  # every value of the type its annotation names, before any rule compares them
        for name in ("steps", "batch_prompts", "group_size", "eval_prompts", "env_workers", "generate_workers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.no_signal_steps < 0:
            raise ConfigError(f"no_signal_steps must be >= 0 (0 = never warn), got {self.no_signal_steps}")
        if self.log_completions < 0:
            raise ConfigError(f"log_completions must be >= 0 (0 = none), got {self.log_completions}")
        if self.joint_max_new_tokens < 0:
            raise ConfigError(
                "joint_max_new_tokens must be >= 0 (0 = N roles x agent.max_new_tokens), "
                f"got {self.joint_max_new_tokens}"
            )
        bad = {r: n for r, n in self.joint_section_tokens.items() if not isinstance(n, int) or n < 1}
        if bad:
            raise ConfigError(f"joint_section_tokens must map roles to token budgets >= 1, got {bad}")
        if not 0 <= self.gamma <= 1:
            raise ConfigError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.eval_every < 0:
            raise ConfigError(f"eval_every must be >= 0, got {self.eval_every}")
        modes = list(self.eval_modes)
        if not modes or set(modes) - set(EVAL_MODES) or len(set(modes)) < len(modes):
            raise ConfigError(f"eval_modes must name each of {EVAL_MODES} at most once, and at least one, got {modes}")
        if self.save_every < 0 or self.keep_last < 0:
            raise ConfigError(f"save_every and keep_last must be >= 0, got {self.save_every} and {self.keep_last}")
        unknown_sinks = sorted(set(self.report_to) - {"tensorboard", "wandb"})
        if unknown_sinks:
            raise ConfigError(f"report_to has {unknown_sinks}; choose from tensorboard, wandb")
        if self.num_processes < 1 or self.batch_prompts % self.num_processes:
            raise ConfigError(
                f"num_processes ({self.num_processes}) must be >= 1 and divide batch_prompts ({self.batch_prompts}): "
                "each replica plays an equal share of the prompts"
            )
        if self.sharding == "fsdp":
            self._check_fsdp()
        if isinstance(self.trainable_agents, str):
            raise ConfigError("trainable_agents must be a list of agent names (or 'a+b' groups), not one string")
        self.trainable_agents = tuple(self.trainable_agents)
        if self.alternate_every < 0:
            raise ConfigError(f"alternate_every must be >= 0 (0 = no alternation), got {self.alternate_every}")
        for agent_id, overrides in self.agent_overrides.items():
            if not isinstance(overrides, dict):
                raise ConfigError(f"agent_overrides[{agent_id!r}] must be an object of AgentConfig fields")
        self.agent_overrides = {
            agent_id: migrate_agent(overrides, f"agent_overrides.{agent_id}.")
            for agent_id, overrides in self.agent_overrides.items()
        }
        for agent_id in self.agent_overrides:
            self.agent_config(agent_id)  # validates field names and values
        self._check_engines()

    def _check_engines(self) -> None:
        """What the rollout engines do not cover, rejected before any model is built: LoRA agents share their
        base's engine (one kind, one server). Under data parallelism (num_processes > 1, torchrun) each process
        runs its own in-process engines (colocated); a server serves every process. (That a server holds one
        model's weights is checked once the roles are known, `textzoo.runners.engines.check_servers`.)"""
        agents = [self.agent, *(self.agent_config(role) for role in self.agent_overrides)]
        lora = {(a.engine.kind, a.engine.url if a.engine.kind == "vllm-server" else "") for a in agents if a.lora.rank}
        if len(lora) > 1:
            raise ConfigError(
                "LoRA agents share one base, so they share its engine: give every LoRA agent the same "
                "agent.engine.kind (and agent.engine.url)"
            )

    def _check_fsdp(self) -> None:
        """What FSDP sharding does not cover, rejected before any model is built."""
        agents = [self.agent, *(self.agent_config(role) for role in self.agent_overrides)]
        if any(a.lora.rank for a in agents):
            raise ConfigError(
                "sharding='fsdp' shards fully fine-tuned models; LoRA agents train small adapters on a shared "
                "frozen base: use sharding='replicate' (or agent.lora.rank=0)"
            )
        if self.actor_critic.critic_model == "actor":
            raise ConfigError(
                "sharding='fsdp' cannot put a value head on a sharded actor's trunk "
                "(actor_critic.critic_model='actor'): give the critic its own model, or use sharding='replicate'"
            )

    def agent_config(self, agent_id: str) -> AgentConfig:
        """The `agent` settings with `agent_overrides[agent_id]` applied."""
        overrides = self.agent_overrides.get(agent_id, {})
        check_mapping(AgentConfig, overrides, f"agent_overrides.{agent_id}.")
        return replaced(self.agent, overrides)


@dataclass
class SFTArgs(AgentConfig):
    """Supervised warm-up of one agent on (prompt, completion) pairs; saves a model `textzoo train` loads.

    The agent's settings are `AgentConfig`'s (model, tiny shape, lr, weight decay, clipping, allowed
    outputs, prompt format, system prompt, device): the warm-up formats, scores and updates as training will.
    """

    _where: ClassVar[str] = "sft"

    pairs: str = ""
    """JSONL file, one {"prompt": ..., "completion": ...} object per line (required)."""
    out: str = ""
    """Folder to save the trained model and tokenizer in (then: --agent-overrides '{"ROLE": {"model": "OUT"}}')."""
    steps: int = 100
    """Optimizer steps."""
    batch_size: int = 16
    """Pairs per step."""
    add_eos: bool = True
    """Append EOS to every completion so the policy learns to stop."""
    seed: int = 0
    """Seed of a built tiny model and of the batch order."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.pairs:
            raise ConfigError("pairs must name the JSONL file of (prompt, completion) pairs")
        if not self.out:
            raise ConfigError("out must name the folder to save the model in")


def replaced(config: Any, values: Mapping[str, Any]) -> Any:
    """``config`` (a config dataclass) with ``values`` set, a section's table field by field (lists become
    tuples); the fields and their types were checked (`check_mapping`)."""
    changes = {}
    for name, value in values.items():
        current = getattr(config, name)
        if dataclasses.is_dataclass(current) and isinstance(value, Mapping):
            changes[name] = replaced(current, value)
        else:
            changes[name] = tuple(value) if isinstance(value, list) else value
    return dataclasses.replace(config, **changes)


def precisions_as_in(cfg: TrainConfig, saved: TrainConfig) -> TrainConfig:
    """``cfg`` with each precision "auto" (of `agent` and of `agent_overrides`) replaced by ``saved``'s,
    which a run resolved when it was built: the config a resumed run of ``cfg`` compares with ``saved``."""
    agent = cfg.agent
    if agent.precision == AUTO:
        agent = dataclasses.replace(agent, precision=saved.agent.precision)
    overrides = {role: dict(values) for role, values in cfg.agent_overrides.items()}
    for role, values in saved.agent_overrides.items():
        if "precision" in values and cfg.agent_config(role).precision == AUTO:
            overrides.setdefault(role, {})["precision"] = values["precision"]
    return dataclasses.replace(cfg, agent=agent, agent_overrides=overrides)
