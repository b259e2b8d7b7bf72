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
Engine = Literal["local", "vllm"]
ENGINES: tuple[str, ...] = get_args(Engine)
"""`AgentConfig.engine` values: where rollouts are sampled (`textzoo.decoding.engine`)."""
EngineDtype = Literal["bfloat16", "float16", "float32", "auto"]
ENGINE_DTYPES: tuple[str, ...] = get_args(EngineDtype)
"""`AgentConfig.engine_dtype` values (the vLLM engine's weights)."""


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
