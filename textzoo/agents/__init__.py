"""LLM policies and the algorithm families."""

from textzoo.agents.policy import Generation, GenerationConfig, Policy
from textzoo.agents.tokenizer import byte_tokenizer

__all__ = ["Generation", "GenerationConfig", "Policy", "byte_tokenizer"]
