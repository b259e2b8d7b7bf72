"""Models from agent configs: a model in its precision (`load_model`), a policy (`build_policy`), a LoRA
adapter on a shared base, the sampling settings, the prompt format, the device a model is built on."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from textzoo.decoding.generation import GenerationConfig
from textzoo.decoding.precision import PRECISIONS, resolve
from textzoo.errors import ConfigError
from textzoo.models.loading import build_tiny, load_pretrained
from textzoo.models.lora import SharedBase
from textzoo.models.policy import Policy
from textzoo.models.prompting import PromptFormat
from textzoo.models.settings import TINY_MODELS
from textzoo.models.tokenizer import llama_byte_tokenizer

if TYPE_CHECKING:
    from textzoo.config import AgentConfig

logger = logging.getLogger(__name__)


def resolve_device(spec: str) -> torch.device:
    """ "auto" -> the first GPU when there is one, else CPU; anything else is passed to torch."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(spec)
    except RuntimeError as e:
        raise ConfigError(f"bad device {spec!r}: {e}") from e


def build_device(spec: str) -> torch.device:
    """Where a model is built: CPU for "auto" (the runner's placement moves it), else `spec`."""
    return torch.device("cpu") if spec == "auto" else resolve_device(spec)


class Loaded(NamedTuple):
    """An agent's model and tokenizer, loaded and in their precision: what its `Policy` will hold."""

    model: torch.nn.Module
    tokenizer: Any
    name: str
    precision: str
    """The resolved precision name (`textzoo.decoding.precision.PRECISIONS`)."""


def load_model(agent: AgentConfig, seed: int, device: torch.device) -> Loaded:
    """The agent's model: a tiny model built locally, or a pretrained one, in its precision.

    "tiny-llama" gets `llama_byte_tokenizer` (BOS-prefixed prompts, other special ids), so a team of
    "tiny" and "tiny-llama" agents has two different tokenizers, as real heterogeneous teams do.
    Precision "auto" is resolved here, for the loaded model and the device it runs on.
    """
    # "auto" resolves to fp32 or bf16-mixed, whose weights are both float32
    loaded = PRECISIONS.get(agent.precision, PRECISIONS["fp32"])
    if agent.model in TINY_MODELS:
        logger.info("building a %s model (%d layers, width %d) on %s", agent.model, agent.n_layer, agent.n_embd, device)
        llama = agent.model == "tiny-llama"
        arch = "llama" if llama else "gpt2"
        tokenizer = llama_byte_tokenizer() if llama else None
        shape = dict(n_layer=agent.n_layer, n_embd=agent.n_embd, n_head=agent.n_head, seed=seed, tokenizer=tokenizer)
        model, tokenizer = build_tiny(arch, **shape)
        name = f"tiny-{arch}"
    else:
        logger.info("loading model %s (precision %s) on %s", agent.model, agent.precision, device)
        model, tokenizer = load_pretrained(agent.model, dtype=loaded.weights)
        name = str(agent.model)
    model.to(device)
    precision = resolve(agent.precision, model, resolve_device(agent.device))
    model.to(PRECISIONS[precision].weights)
    if agent.gradient_checkpointing:
        # non-reentrant: gradients reach the weights even though the input ids need no gradient
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5.x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return Loaded(model, tokenizer, name, precision)


def build_policy(agent: AgentConfig, seed: int, device: torch.device) -> Policy:
    """A policy from an agent config (`load_model`), sampling with the agent's settings on its own decoder."""
    m = load_model(agent, seed, device)
    generation = generation_config(agent, m.tokenizer, m.model)
    return Policy(m.model, m.tokenizer, generation, name=m.name, precision=m.precision)


def generation_config(agent: AgentConfig, tokenizer: Any, model: torch.nn.Module) -> GenerationConfig:
    """The agent's sampling settings; its allowed outputs become token ids of `tokenizer`, and its prompt
    budget shrinks so that prompt + completion fit `model`'s positions."""
    allowed = token_ids(tokenizer, agent.allowed_outputs) if agent.allowed_outputs else None
    prompt_budget = agent.max_prompt_tokens
    positions = position_limit(model)
    if positions:
        if agent.max_new_tokens >= positions:
            raise ConfigError(
                f"agent.max_new_tokens={agent.max_new_tokens} leaves no room for a prompt in model "
                f"{agent.model!r}, which has {positions} positions; lower max_new_tokens"
            )
        prompt_budget = min(prompt_budget, positions - agent.max_new_tokens)
    return GenerationConfig(**{**agent.sampling(), "max_prompt_tokens": prompt_budget}, allowed_tokens=allowed)


def position_limit(model: torch.nn.Module) -> int:
    """How many positions a model with learned or bounded positions handles (0 = unknown)."""
    config = getattr(model, "config", None)
    if config is None:
        return 0
    if getattr(config, "model_type", None) == "gpt2":  # learned absolute positions: a hard limit
        return int(config.n_positions)
    return int(getattr(config, "max_position_embeddings", 0) or 0)


def shared_base(agent: AgentConfig, seed: int, bases: dict[tuple, SharedBase]) -> SharedBase:
    """The frozen base that every LoRA agent with the same model settings shares, built once (from the seed
    of its first agent) and kept in `bases`, a team's shared bases."""
    key = (
        agent.model,
        agent.n_layer,
        agent.n_embd,
        agent.n_head,
        agent.precision,
        agent.device,
        agent.gradient_checkpointing,
    )
    if key not in bases:
        bases[key] = SharedBase(build_policy(agent, seed, build_device(agent.device)))
    return bases[key]


def lora_policy(
    agent: AgentConfig,
    agent_id: str,
    seed: int,
    base: SharedBase,
    generation: GenerationConfig | None = None,
    engine: Any = None,
) -> Policy:
    """The agent's LoRA adapter on `base` (`shared_base`), in the base's precision; its sampling settings
    are `generation` (default: the agent's) and it samples on `engine` when one is given."""
    return base.add(
        agent_id,
        agent.lora.rank,
        agent.lora.alpha,
        agent.lora.dropout,
        agent.lora.target_modules,
        trainable=agent.trainable,
        generation=generation or generation_config(agent, base.tokenizer, base.base),
        seed=seed,
        engine=engine,
    )


def prompt_format(agent: AgentConfig, policy: Policy) -> PromptFormat:
    """The agent's prompt format resolved for its tokenizer, checked by rendering one prompt."""
    fmt = PromptFormat.resolve(policy.tokenizer, agent.prompt_format, agent.system_prompt, agent.chat_template_kwargs)
    fmt.check(policy)
    return fmt


def allowed_token_ids(policy: Policy, outputs: tuple[str, ...]) -> tuple[int, ...]:
    """Every token id of `policy`'s tokenizer used to spell any of `outputs` (EOS is added by the policy)."""
    return token_ids(policy.tokenizer, outputs)


def token_ids(tokenizer: Any, outputs: tuple[str, ...]) -> tuple[int, ...]:
    """Every token id used to spell any of `outputs`."""
    ids: set[int] = set()
    for text in outputs:
        ids.update(tokenizer.encode(text, add_special_tokens=False))
    if not ids:
        raise ConfigError(f"allowed_outputs {outputs!r} produce no tokens")
    return tuple(sorted(ids))
