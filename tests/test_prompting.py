"""Prompt formatting per agent: raw prompts unchanged, chat prompts exactly the tokenizer's template,
what is sampled is what is scored, and bad settings fail before training (the real model's template is
checked in test_real_model.py)."""

import pytest
import torch

from textzoo.config import AgentConfig, TrainConfig
from textzoo.decoding.generation import GenerationConfig
from textzoo.errors import ConfigError
from textzoo.models.policy import Policy
from textzoo.models.prompting import PromptFormat
from textzoo.models.team import AgentActor
from textzoo.models.tokenizer import byte_tokenizer
from textzoo.runners.build import build_actors

torch.set_num_threads(1)

# A ChatML-like template in plain text (the byte tokenizer has no special tokens for it).
TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}[end]\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% if shout %}!{% endif %}{% endif %}"
)


def chat_policy(max_prompt_tokens: int = 384) -> Policy:
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = TEMPLATE
    generation = GenerationConfig(max_new_tokens=6, max_prompt_tokens=max_prompt_tokens)
    return Policy.tiny(seed=0, tokenizer=tokenizer, generation=generation)


def test_auto_keeps_tiny_byte_models_raw_and_their_prompts_unchanged():
    policy = Policy.tiny(seed=0, generation=GenerationConfig(max_new_tokens=6))
    actor = AgentActor("a", policy)
    assert actor.prompt_format == PromptFormat("raw")
    prompts = ["Summarize: the cat sat.", "x"]
    torch.manual_seed(0)
    got = actor.generate(prompts)
    torch.manual_seed(0)
    want = policy.generate(prompts)
    assert torch.equal(got.prompt_ids, want.prompt_ids) and torch.equal(got.completion_ids, want.completion_ids)
    assert got.texts == want.texts


def test_a_raw_system_prompt_is_a_first_paragraph():
    fmt = PromptFormat.resolve(byte_tokenizer(), "raw", system_prompt="Be brief.")
    assert fmt.raw_text("Summary:") == "Be brief.\n\nSummary:"
    gen = fmt.generate(Policy.tiny(seed=0, generation=GenerationConfig(max_new_tokens=2)), ["Summary:"])
    assert bytes(t - 3 for t in gen.prompt_ids[0].tolist()).decode() == "Be brief.\n\nSummary:"


def test_chat_prompts_are_the_template_token_for_token_and_are_what_is_scored():
    policy = chat_policy()
    fmt = PromptFormat.resolve(policy.tokenizer, system_prompt="sys", chat_template_kwargs={"shout": True})
    assert fmt.chat  # auto: the tokenizer has a template
    prompts = ["short", "a longer prompt", "short"]
    gen = AgentActor("a", policy, prompt_format=fmt).generate(prompts)
    for row, text in enumerate(prompts):
        messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": text}]
        want = policy.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False, shout=True)
        assert gen.prompt_ids[row][gen.prompt_mask[row].bool()].tolist() == list(want)
    assert policy.tokenizer.decode(gen.prompt_ids[0][gen.prompt_mask[0].bool()]) == (
        "[system]sys[end]\n[user]short[end]\n[assistant]!"
    )
    scored = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    assert torch.allclose(scored, gen.logprobs, atol=1e-5)


def test_a_long_chat_prompt_keeps_the_end_of_its_message_and_the_whole_template():
    policy = chat_policy(max_prompt_tokens=40)
    fmt = PromptFormat.resolve(policy.tokenizer)
    text = "".join(f"w{i} " for i in range(30)) + "END"
    ids = fmt.chat_ids(policy.tokenizer, text, 40)
    rendered = policy.tokenizer.decode(ids)
    assert len(ids) == 40 and rendered.startswith("[user]") and rendered.endswith("END[end]\n[assistant]")
    with pytest.raises(ConfigError, match="max_prompt_tokens"):
        fmt.chat_ids(policy.tokenizer, text, 12)  # the template alone is 24 bytes


def test_bad_formats_fail_with_the_fix():
    with pytest.raises(ConfigError, match="prompt_format"):
        AgentConfig(prompt_format="chatml")
    with pytest.raises(ConfigError, match="chat template"):
        AgentConfig(prompt_format="chat")  # the tiny model's byte tokenizer has none
    with pytest.raises(ConfigError, match="has none"):
        PromptFormat.resolve(byte_tokenizer(), "chat")
    broken = chat_policy()
    broken.tokenizer.chat_template = "{{ raise_exception('no system messages') if messages[0]['role'] == 'system' }}"
    with pytest.raises(ConfigError, match="system_prompt"):
        PromptFormat.resolve(broken.tokenizer, "chat", system_prompt="sys").check(broken)


def test_build_actors_gives_each_agent_its_format_and_system_prompt():
    cfg = TrainConfig(
        env="textzoo/Writing-v0",
        agent=AgentConfig(system_prompt="team"),
        agent_overrides={"summary": {"system_prompt": "be short", "prompt_format": "raw"}},
    )
    actors = {a.id: a for a in build_actors(cfg, ["summary", "elaboration"])}
    assert actors["summary"].prompt_format == PromptFormat("raw", "be short")
    assert actors["elaboration"].prompt_format == PromptFormat("raw", "team")
    joint = build_actors(TrainConfig(env="textzoo/Writing-v0", collaboration="centralized"), ["summary", "elaboration"])
    assert joint[0].prompt_format == PromptFormat("raw")
