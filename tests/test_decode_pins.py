"""Pinned samples: fixed seeds give these exact tokens, masks, texts and log-probs (plain and scripted).

How the pins were derived: ``tests/data/decode_pins.json`` is the output of `_record` below (this file's
``__main__``) as the decode loop stood before plain and scripted decoding became one loop, on tiny
randomly initialised models (fixed seeds) in float32 on CPU, log-probs rounded to 5 decimals. They are
regression pins, not values from a paper: a change to the loop that alters what a seed samples fails
here. One case is also re-derived independently of the decode loop
(`test_the_greedy_pins_are_the_float64_forwards_argmax_and_log_probs`): the transformers module in
float64 on each whole sequence, without cache, padding or sampling code. Regenerate the pins
(``python tests/test_decode_pins.py``) only for a change that is meant to alter samples, and say so in
its commit.
"""

import json
import sys
from pathlib import Path

import pytest
import torch

from textzoo.decoding.generation import GenerationConfig
from textzoo.decoding.sampling import Segment
from textzoo.models.joint import JointActor
from textzoo.models.policy import Policy
from textzoo.models.tokenizer import BYTE_OFFSET

torch.set_num_threads(1)

PINS = Path(__file__).parent / "data" / "decode_pins.json"
PROMPTS = ["hi", "a longer prompt, with words", "", "x" * 9, "hi", "ab"]


def ids(text: str) -> tuple[int, ...]:
    return tuple(b + BYTE_OFFSET for b in text.encode())


def _plain(arch: str, greedy: bool = False, **generation):
    policy = Policy.tiny(arch, seed=5, generation=GenerationConfig(**{"max_new_tokens": 20, **generation}))
    gen = policy.generate(PROMPTS, greedy=greedy, generator=torch.Generator().manual_seed(7))
    return gen, None


def _scripted():
    # "a"/"b"/" " and EOS only: sections often end on the stop string "ab" or at EOS
    policy = Policy.tiny("llama", seed=3, generation=GenerationConfig(max_new_tokens=16, allowed_tokens=ids("ab ")))
    long = [Segment(forced=ids("<a>")), Segment(budget=6), Segment(forced=ids("</a><b>")), Segment(budget=5)]
    stops = [
        Segment(budget=7, stop_strings=("ab",)),
        Segment(forced=ids("|full|"), after_stop=ids("|")),
        Segment(budget=6, stop_strings=("ab", "ba")),
        Segment(forced=ids("!"), after_stop=()),
        Segment(budget=3),
    ]
    scripts = [long, stops, stops, long, stops, [Segment(budget=4)]]
    prompt_ids, prompt_mask = policy.encode(PROMPTS)
    return policy.generate_script(prompt_ids, prompt_mask, scripts, generator=torch.Generator().manual_seed(11))


def _joint():
    from textzoo.envs import make

    policy = Policy.tiny(seed=0, generation=GenerationConfig(max_new_tokens=16, max_prompt_tokens=400))
    joint = JointActor(["summary", "elaboration"], policy, section_tokens=6)
    env = make("textzoo/Writing-v0")
    observations, _ = env.reset(seed=0)
    prompts = [joint.build_prompt(observations)] * 3
    torch.manual_seed(0)
    return joint.generate(prompts), None


CASES = {
    "gpt2_sampled": lambda: _plain("gpt2", allowed_tokens=tuple(range(60, 70)), temperature=0.9),
    "llama_restricted_stops_top_p": lambda: _plain(
        "llama", allowed_tokens=ids("ab c"), stop_strings=("ab", "c c"), top_p=0.9, temperature=0.8
    ),
    "qwen2_top_k_greedy": lambda: _plain("qwen2", greedy=True, top_k=3),
    "scripted": _scripted,
    "joint_structured": _joint,
}


def _record(case: str) -> dict:
    gen, sections = CASES[case]()
    return {
        "completion_ids": gen.completion_ids.tolist(),
        "completion_mask": gen.completion_mask.tolist(),
        "logprobs": [[round(x, 5) for x in row] for row in gen.logprobs.tolist()],
        "texts": gen.texts,
        "sections": sections,
    }


@pytest.mark.parametrize("case", list(CASES))
def test_fixed_seeds_give_the_pinned_samples(case):
    pinned, now = json.loads(PINS.read_text())[case], _record(case)
    assert now["completion_ids"] == pinned["completion_ids"]
    assert now["completion_mask"] == pinned["completion_mask"]
    assert now["texts"] == pinned["texts"] and now["sections"] == pinned["sections"]
    torch.testing.assert_close(torch.tensor(now["logprobs"]), torch.tensor(pinned["logprobs"]), atol=2e-5, rtol=0)
    if case != "qwen2_top_k_greedy":  # the sampled cases have rows that end early or forced tokens
        assert any(0 in row for row in now["completion_mask"])


def test_the_greedy_pins_are_the_float64_forwards_argmax_and_log_probs():
    """The greedy case's pinned tokens and log-probs, derived again without the decode loop: each row's
    prompt (an empty one conditioned on BOS, as `Policy.prepare_prompts` does) and pinned completion
    through the transformers module in float64 at once; each pinned token is the argmax of the logits
    before it (top_k=3 keeps the argmax) and its pinned log-prob is the full softmax's, to the pins' 5
    decimals."""
    pinned = json.loads(PINS.read_text())["qwen2_top_k_greedy"]
    policy = Policy.tiny("qwen2", seed=5, generation=GenerationConfig(max_new_tokens=20, top_k=3))
    model = policy.model.double().eval()
    prompt_ids, prompt_mask = policy.encode(PROMPTS)
    for row, text in enumerate(PROMPTS):
        prompt = prompt_ids[row][prompt_mask[row].bool()].tolist() or [policy.tokenizer.bos_token_id]
        n = sum(pinned["completion_mask"][row])
        completion = pinned["completion_ids"][row][:n]
        assert n > 0 and pinned["completion_mask"][row][:n] == [1] * n
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]  # [n, V]
        logp = torch.log_softmax(logits, -1)
        assert logits.argmax(-1).tolist() == completion, text
        want = logp.gather(1, torch.tensor(completion)[:, None])[:, 0]
        torch.testing.assert_close(
            torch.tensor(pinned["logprobs"][row][:n], dtype=torch.float64), want, atol=6e-6, rtol=0
        )


@pytest.mark.parametrize("case", ["scripted", "joint_structured"])
def test_runs_of_forced_columns_fed_in_one_pass_sample_what_token_by_token_feeding_does(case, monkeypatch):
    """The plain backend feeds a run of columns in which no row samples (forced text, padding) in one pass
    (`PlainDecoding.decode_many`); fed one token at a time instead, every seed samples the same tokens with
    the same log-probs. Both cases have such runs (the joint case: the next role's turn after a section;
    the scripted one: forced text while the other rows are done), fed in passes of several tokens."""
    from textzoo.decoding.backends.plain import PlainDecoding

    widths = []
    many = PlainDecoding.decode_many
    monkeypatch.setattr(
        PlainDecoding, "decode_many", lambda self, tokens: widths.append(tokens.shape[1]) or many(self, tokens)
    )
    chunked = _record(case)
    monkeypatch.delattr(PlainDecoding, "decode_many")
    one_by_one = _record(case)
    assert chunked["completion_ids"] == one_by_one["completion_ids"] and chunked["texts"] == one_by_one["texts"]
    assert chunked["completion_mask"] == one_by_one["completion_mask"]
    torch.testing.assert_close(
        torch.tensor(chunked["logprobs"]), torch.tensor(one_by_one["logprobs"]), atol=2e-5, rtol=0
    )
    assert widths and max(widths) > 3, widths  # both cases have such runs: the one-pass path ran


if __name__ == "__main__":  # regenerate the pins (see the module docstring)
    PINS.parent.mkdir(exist_ok=True)
    PINS.write_text(json.dumps({case: _record(case) for case in CASES}) + "\n")
    print(f"wrote {PINS}", file=sys.stderr)
