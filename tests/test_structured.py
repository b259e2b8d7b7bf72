"""Scripted decoding (forced tokens in the decode loop) and the joint actor's structured mode."""

import pytest
import torch
from toy import CategoricalPolicy

from textzoo.decoding.generation import GenerationConfig
from textzoo.decoding.sampling import Segment
from textzoo.envs import make
from textzoo.errors import ConfigError
from textzoo.models.joint import JointActor, structured_text
from textzoo.models.policy import Policy
from textzoo.models.prompting import PromptFormat
from textzoo.models.tokenizer import BYTE_OFFSET, EOS_ID, byte_tokenizer
from textzoo.runners.rollout import Collector
from textzoo.runners.trainer import rollout_metrics

STAND_IN = CategoricalPolicy(["-"])  # a policy these prompt-building tests never ask to act

torch.set_num_threads(1)


def ids(text: str) -> tuple[int, ...]:
    return tuple(b + BYTE_OFFSET for b in text.encode())


def policy(**generation) -> Policy:
    return Policy.tiny(seed=3, generation=GenerationConfig(**{"max_new_tokens": 16, **generation}))


def test_forced_tokens_are_context_never_sampled_or_scored():
    pol = policy()
    script = [Segment(forced=ids("<a>")), Segment(budget=4), Segment(forced=ids("</a><b>")), Segment(budget=3)]
    prompt_ids, prompt_mask = pol.encode(["first prompt", "second, longer prompt"] * 2)
    torch.manual_seed(0)
    gen, sections = pol.generate_script(prompt_ids, prompt_mask, [script] * 4)
    for row in range(4):
        (a0, a1), (b0, b1) = [(s, e) for s, e, _ in _spans(gen, row)]
        row_ids = gen.completion_ids[row].tolist()
        assert row_ids[:3] == list(ids("<a>")) and row_ids[a1 : a1 + 7] == list(ids("</a><b>"))
        assert a0 == 3 and b0 == a1 + 7 and a1 - a0 <= 4 and b1 - b0 <= 3
        mask = gen.completion_mask[row].tolist()
        assert mask[:3] == [0] * 3 and mask[a1 : a1 + 7] == [0] * 7 and all(mask[a0:a1]) and all(mask[b0:b1])
        assert gen.logprobs[row][gen.completion_mask[row] == 0].abs().sum() == 0
        assert sections[row] == [
            pol.tokenizer.decode(_drop_eos(row_ids[a0:a1]), skip_special_tokens=True),
            pol.tokenizer.decode(_drop_eos(row_ids[b0:b1]), skip_special_tokens=True),
        ]
    # scoring the whole completion gives the sampled log-probs of the sampled tokens (forced ones: context)
    scored = pol.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    torch.testing.assert_close(scored, gen.logprobs, atol=1e-5, rtol=0)
    # ... and the second section scored with everything before it as its prompt gives the same log-probs
    row = 1
    (_, a1), (b0, b1) = [(s, e) for s, e, _ in _spans(gen, row)]
    prefix = torch.cat([gen.prompt_ids[row][gen.prompt_mask[row].bool()], gen.completion_ids[row, :b0]])[None]
    second = gen.completion_ids[row : row + 1, b0:b1]
    alone = pol.score(prefix, torch.ones_like(prefix), second, torch.ones_like(second))
    torch.testing.assert_close(alone, gen.logprobs[row : row + 1, b0:b1], atol=1e-5, rtol=0)


def _drop_eos(tokens):
    return tokens[:-1] if tokens and tokens[-1] == EOS_ID else tokens


def _spans(gen, row):
    """Runs of mask 1 in a row: the sampled sections (forced tokens separate them)."""
    mask = gen.completion_mask[row].tolist() + [0]
    spans, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        if not m and start is not None:
            spans.append((start, i, False))
            start = None
    return spans


def test_a_section_ends_at_eos_or_on_a_stop_string_and_the_next_forced_tokens_follow():
    # every sampled token is "x" (a stop string) or EOS: each section is one token, ended either way
    pol = policy(allowed_tokens=ids("x"))
    script = [
        Segment(budget=5, stop_strings=("x",)),
        Segment(forced=ids("|full|"), after_stop=ids("|")),
        Segment(budget=5, stop_strings=("x",)),
        Segment(forced=ids("!"), after_stop=()),
    ]
    prompt_ids, prompt_mask = pol.encode([f"p{i}" for i in range(12)])
    torch.manual_seed(1)
    gen, sections = pol.generate_script(prompt_ids, prompt_mask, [script] * 12)
    seen = set()
    for row in range(12):
        tokens = gen.completion_ids[row].tolist()
        first = tokens[0]
        forced = ids("|") if first == ids("x")[0] else ids("|full|")
        assert tokens[1 : 1 + len(forced)] == list(forced)
        second = tokens[1 + len(forced)]
        tail = tokens[2 + len(forced) :]
        if second == ids("x")[0]:  # ended on the stop string: the empty after_stop writes nothing, the row ends
            assert gen.completion_mask[row, 2 + len(forced) :].sum() == 0 and set(tail) <= {pol.pad_id}
        else:
            assert second == EOS_ID and tail[:1] == list(ids("!"))
        assert sections[row] == ["", ""]  # "x" is cut with its stop string, EOS is dropped
        seen.add((first == EOS_ID, second == EOS_ID))
    assert len(seen) > 1  # both endings happened


@pytest.mark.parametrize("engine", [False, True])
def test_an_eos_is_stop_section_that_ends_at_eos_picks_the_after_stop_tokens(engine):
    # every sampled token is "x" or EOS: a section ends at EOS (after_stop follows) or at its budget of 3
    pol = policy(allowed_tokens=ids("x"))
    script = [
        Segment(budget=3, eos_is_stop=True),
        Segment(forced=ids("|full|"), after_stop=ids("|")),
        Segment(budget=3),
        Segment(forced=ids("!"), after_stop=ids("?")),
    ]
    prompt_ids, prompt_mask = pol.encode([f"p{i}" for i in range(16)])
    if engine:  # the engine path (`run_scripts`) follows the same rule
        from textzoo.decoding.engine import EngineClient, LocalEngine

        pol.engine = EngineClient(LocalEngine(pol, torch.Generator().manual_seed(4)))
    torch.manual_seed(4)
    gen, _ = pol.generate_script(prompt_ids, prompt_mask, [script] * 16)
    seen = set()
    for row in range(16):
        tokens = [t for t in gen.completion_ids[row].tolist() if t != pol.pad_id]
        first = tokens[: tokens.index(EOS_ID) + 1] if EOS_ID in tokens[:3] else tokens[:3]
        at_eos = first[-1] == EOS_ID
        forced = ids("|") if at_eos else ids("|full|")
        assert tokens[len(first) : len(first) + len(forced)] == list(forced)
        assert tokens[-1:] == list(ids("!"))  # the last section never counts an EOS as a stop
        seen.add(at_eos)
    assert seen == {True, False}  # both endings happened


def test_bad_segments_are_rejected():
    with pytest.raises(ValueError, match="either forced tokens or a sampling budget"):
        Segment()
    with pytest.raises(ValueError, match="either forced tokens or a sampling budget"):
        Segment(forced=(1,), budget=2)


def _writing_collect(joint_format: str, n: int = 2, **kwargs):
    pol = Policy.tiny(seed=0, generation=GenerationConfig(max_new_tokens=16, max_prompt_tokens=400))
    joint = JointActor(["summary", "elaboration"], pol, joint_format=joint_format, section_tokens=6, **kwargs)
    collector = Collector(lambda: make("textzoo/Writing-v0"), [joint])
    torch.manual_seed(0)
    return joint, collector.collect(list(range(n)), [0] * n, 2)


def test_structured_joint_answers_never_fail_to_parse_and_their_sections_are_the_actions():
    joint, rollout = _writing_collect("structured")
    assert rollout_metrics(rollout)["parse_failure_rate"] == 0.0
    (step,) = rollout.steps
    gen = step.gen
    opening = list(ids("\n<summary>"))
    for row, text in enumerate(gen.texts):
        assert text.startswith("<summary>") and "</summary>\n<elaboration>" in text and text.endswith("</elaboration>")
        actions, failed = joint.parse(text, ("summary", "elaboration"))
        assert not failed and structured_text(actions) == text
        assert actions == {r: rollout.infos["actions"][0][row][r] for r in actions}  # what the env got
        assert gen.completion_ids[row, : len(opening)].tolist() == opening  # forced, after the prompt
        assert gen.completion_mask[row, : len(opening)].sum() == 0
        assert gen.completion_mask[row].sum() <= 12  # two sections of 6
    # the prompt is the first role's task; the opening tags and the elaboration task are forced
    prompt = joint.policy.tokenizer.decode(gen.prompt_ids[0][gen.prompt_mask[0].bool()])
    assert prompt.startswith('<task role="summary">\nSummarize') and prompt.endswith("Summary:\n</task>")
    completion = joint.policy.tokenizer.decode(gen.completion_ids[0])
    assert '</summary>\n<task role="elaboration">\nElaborate on the text' in completion


def test_free_form_formats_ask_for_their_layout_and_parse_it():
    for joint_format, asked in (("tags", "<summary>...</summary>"), ("labels", "summary: ..."), ("json", '"summary":')):
        joint, rollout = _writing_collect(joint_format, n=1)
        prompt = joint.build_prompt({"summary": "s", "elaboration": "e"})
        assert asked in prompt and prompt.roles == ("summary", "elaboration")
        assert prompt.endswith("\n<summary>") == (joint_format == "tags")  # raw tags prompts open the first answer
        assert rollout_metrics(rollout)["parse_failure_rate"] == 1.0  # a random tiny model writes none of them
    chat = PromptFormat("chat")
    assert (
        not JointActor(["a", "b"], STAND_IN, joint_format="tags", prompt_format=chat)
        .build_prompt({"a": "x", "b": "y"})
        .endswith("<a>")
    )  # a chat prompt lets the assistant turn begin


def test_a_parser_needs_a_free_form_format():
    with pytest.raises(ConfigError, match="free-form"):
        JointActor(["a", "b"], STAND_IN, parser=lambda text, roles: ({}, True))
    with pytest.raises(ConfigError, match="joint_format"):
        JointActor(["a", "b"], STAND_IN, joint_format="xml")


def test_lone_roles_of_a_structured_actor_answer_plainly():
    pol = policy()
    joint = JointActor(["sender", "receiver"], pol)
    prompts = [joint.build_prompt({"sender": "s1"}), joint.build_prompt({"sender": "a", "receiver": "b"})]
    torch.manual_seed(0)
    gen = joint.generate(prompts)
    assert not gen.texts[0].startswith("<sender>") and gen.texts[1].startswith("<sender>")
    torch.manual_seed(5)
    lone = joint.generate(prompts[:1])
    torch.manual_seed(5)
    plain = pol.generate(["s1"])
    assert lone.texts == plain.texts and torch.equal(lone.completion_ids, plain.completion_ids)


def test_a_byte_tokenizer_encodes_the_markers_as_their_bytes():
    tokenizer = byte_tokenizer()
    assert tuple(tokenizer("</a>", add_special_tokens=False)["input_ids"]) == ids("</a>")


@pytest.mark.parametrize("mode", ["static", "module"])
def test_scripts_decode_alike_on_every_backend_and_finished_rows_are_let_go(mode, monkeypatch):
    from textzoo.decoding.backends.module import ModuleDecoding
    from textzoo.decoding.backends.static import StaticDecoding

    pol = Policy.tiny("llama", seed=3, generation=GenerationConfig(max_new_tokens=16, allowed_tokens=ids("ab ")))
    script = [
        Segment(forced=ids("<")),
        Segment(budget=12, stop_strings=("ab",)),
        Segment(forced=ids(">!"), after_stop=()),
        Segment(budget=2),
    ]
    prompt_ids, prompt_mask = pol.encode([f"prompt {i}" for i in range(8)])

    def run(**settings):
        for name, value in settings.items():
            setattr(pol, name, value)
        return pol.generate_script(prompt_ids, prompt_mask, [script] * 8, generator=torch.Generator().manual_seed(2))

    pol.compact_finished = False
    reference, sections = run(decode_mode="dynamic")
    assert len(set(reference.completion_mask.sum(1).tolist())) > 2  # rows end at different steps
    kind = StaticDecoding if mode == "static" else ModuleDecoding
    kept, retain = [], kind.retain
    monkeypatch.setattr(kind, "retain", lambda self, rows: kept.append(len(r := retain(self, rows))) or r)
    settings = {"decode_mode": "static"} if mode == "static" else {"fast_forward": False}
    gen, again = run(compact_finished=True, **settings)
    assert kept and min(kept) < 8  # finished rows were let go
    assert again == sections and gen.texts == reference.texts
    assert torch.equal(gen.completion_ids, reference.completion_ids)
    assert torch.equal(gen.completion_mask, reference.completion_mask)
    torch.testing.assert_close(gen.logprobs, reference.logprobs, atol=1e-5, rtol=0)
