"""Policy: token masks, sampled == scored log-probs, left padding, restrictions, stop strings, save/load."""

import pytest
import torch

from textzoo.decoding.generation import Generation, GenerationConfig
from textzoo.errors import ConfigError, ModelError
from textzoo.models import Policy
from textzoo.models.tokenizer import BYTE_OFFSET, EOS_ID, PAD_ID

torch.set_num_threads(1)

PROMPTS = ["hi", "a somewhat longer prompt, with punctuation!", "", "日本語 ✓", "x" * 17]


def byte_id(ch: str) -> int:
    return ord(ch) + BYTE_OFFSET


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def policy(request):
    return Policy.tiny(request.param, generation=GenerationConfig(max_new_tokens=12))


def assert_well_formed(gen: Generation, policy: Policy, stops: bool = False) -> None:
    """Masks are prefixes; only the final scored token may be EOS; padding carries pad id and 0 log-prob.

    A sample ends with EOS or at the budget (or, with ``stops``, possibly earlier on a stop string).
    """
    lengths = gen.completion_mask.sum(1)
    C = gen.completion_ids.shape[1]
    assert torch.equal(gen.completion_mask, (torch.arange(C) < lengths[:, None]).long())
    assert (lengths >= 1).all()
    for row, n in enumerate(lengths.tolist()):
        ids = gen.completion_ids[row]
        assert EOS_ID not in ids[: n - 1].tolist()
        assert ids[n - 1] == EOS_ID or n == policy.generation.max_new_tokens or stops
        assert (ids[n:] == PAD_ID).all()
        assert (gen.logprobs[row, n:] == 0).all()
        assert (gen.logprobs[row, :n] < 0).all()
    assert torch.equal(gen.prompt_mask[:, -1], torch.ones(len(gen), dtype=torch.long))  # left padding


def test_tiny_is_deterministic_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    a, b = Policy.tiny("gpt2", seed=3), Policy.tiny("gpt2", seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
    c = Policy.tiny("gpt2", seed=4)
    assert not torch.equal(next(a.model.parameters()), next(c.model.parameters()))
    assert 100_000 < sum(p.numel() for p in a.model.parameters()) < 200_000


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_scored_equals_sampled_logprobs(arch):
    policy = Policy.tiny(arch, generation=GenerationConfig(max_new_tokens=16, temperature=0.7))
    policy.model.train()  # generate runs in eval mode and restores the mode
    gen = policy.generate(PROMPTS, generator=torch.Generator().manual_seed(0))
    assert policy.model.training
    assert_well_formed(gen, policy)
    assert len(set(gen.prompt_mask.sum(1).tolist())) > 1  # prompts of different lengths
    policy.model.eval()
    scored, entropy = policy.score(
        gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask, return_entropy=True
    )
    torch.testing.assert_close(scored, gen.logprobs, atol=1e-5, rtol=0)
    assert scored.requires_grad
    assert (entropy[gen.completion_mask == 0] == 0).all()
    assert (entropy[gen.completion_mask == 1] > 0).all()


def test_entropy_matches_definition(policy):
    gen = policy.generate(PROMPTS[:2], generator=torch.Generator().manual_seed(1))
    policy.model.eval()
    with torch.no_grad():
        _, entropy = policy.score(
            gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask, return_entropy=True
        )
        ids = torch.cat([gen.prompt_ids[1], gen.completion_ids[1]])[None]
        logits = policy.model(ids, position_ids=torch.arange(ids.shape[1])[None]).logits[0]
    P = gen.prompt_ids.shape[1]
    logp = torch.log_softmax(logits[P - 1], -1)
    assert entropy[1, 0].item() == pytest.approx(-(logp.exp() * logp).sum().item(), abs=1e-5)


def test_padding_is_never_scored(policy):
    gen = policy.generate(PROMPTS, generator=torch.Generator().manual_seed(2))
    padded = Generation.cat([gen, gen.select([0])], pad_id=PAD_ID)  # widens nothing but checks cat
    policy.model.eval()
    with torch.no_grad():
        base = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
        # Garbage in padded completion positions and extra padding columns change nothing.
        ids = torch.cat([gen.completion_ids, torch.full((len(gen), 3), 7)], 1)
        mask = torch.cat([gen.completion_mask, torch.zeros((len(gen), 3), dtype=torch.long)], 1)
        ids = ids.masked_fill(mask == 0, 99)
        wider = policy.score(gen.prompt_ids, gen.prompt_mask, ids, mask)
    torch.testing.assert_close(wider[:, : base.shape[1]], base, atol=1e-6, rtol=0)
    assert (wider[:, base.shape[1] :] == 0).all()
    assert len(padded) == len(gen) + 1


def test_final_token_is_scored_for_eos_and_budget_ends():
    # Three allowed bytes + EOS: about a quarter of the steps end a sample, so both endings occur.
    cfg = GenerationConfig(max_new_tokens=6, allowed_tokens=(byte_id("a"), byte_id("b"), byte_id("c")))
    policy = Policy.tiny("gpt2", generation=cfg)
    gen = policy.generate(["q"] * 48, generator=torch.Generator().manual_seed(0))
    assert_well_formed(gen, policy)
    lengths = gen.completion_mask.sum(1)
    last = gen.completion_ids.gather(1, (lengths - 1)[:, None]).squeeze(1)
    assert (last == EOS_ID).any() and (last != EOS_ID).any()
    assert set(gen.completion_ids[gen.completion_mask == 1].tolist()) <= {*cfg.allowed_tokens, EOS_ID}
    for text, row, n in zip(gen.texts, gen.completion_ids, lengths.tolist()):
        body = row[: n - 1] if row[n - 1] == EOS_ID else row[:n]
        assert text == "".join(chr(i - BYTE_OFFSET) for i in body.tolist())
    policy.model.eval()
    scored = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    torch.testing.assert_close(scored, gen.logprobs, atol=1e-5, rtol=0)
    # Restricted scoring: the allowed ids (and EOS) hold all probability mass at the first position.
    mass = 0.0
    for t in (*cfg.allowed_tokens, EOS_ID):
        first = gen.completion_ids[:, :1].clone().fill_(t)
        mass = mass + policy.score(gen.prompt_ids, gen.prompt_mask, first, torch.ones_like(first)).exp()
    torch.testing.assert_close(mass, torch.ones_like(mass), atol=1e-5, rtol=0)


def test_greedy_is_deterministic_and_independent_of_padding(policy):
    batch = policy.generate(PROMPTS, greedy=True)
    again = policy.generate(PROMPTS, greedy=True)
    assert torch.equal(batch.completion_ids, again.completion_ids) and batch.texts == again.texts
    for i, prompt in enumerate(PROMPTS):
        alone = policy.generate([prompt], greedy=True)
        n = int(alone.completion_mask.sum())
        assert batch.completion_ids[i, :n].tolist() == alone.completion_ids[0, :n].tolist()
        torch.testing.assert_close(batch.logprobs[i, :n], alone.logprobs[0, :n], atol=1e-5, rtol=0)


def test_top_k_1_and_tiny_top_p_are_greedy(policy):
    greedy = policy.generate(PROMPTS, greedy=True)
    old = policy.generation
    try:
        for cfg in (GenerationConfig(max_new_tokens=12, top_k=1), GenerationConfig(max_new_tokens=12, top_p=1e-6)):
            policy.generation = cfg
            sampled = policy.generate(PROMPTS)
            assert torch.equal(sampled.completion_ids, greedy.completion_ids)
            torch.testing.assert_close(sampled.logprobs, greedy.logprobs, atol=1e-6, rtol=0)
    finally:
        policy.generation = old


def test_generator_makes_sampling_reproducible(policy):
    a = policy.generate(PROMPTS, generator=torch.Generator().manual_seed(5))
    b = policy.generate(PROMPTS, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.manual_seed(9)
    c = policy.generate(PROMPTS)
    torch.manual_seed(9)
    d = policy.generate(PROMPTS)
    assert torch.equal(c.completion_ids, d.completion_ids)


def test_prompts_containing_pad_and_eos_ids(policy):
    """The mask, not the id, says what is padding: pad/EOS ids inside a prompt are real tokens."""
    real = torch.tensor([PAD_ID, EOS_ID, byte_id("a"), PAD_ID, byte_id("b")])
    ids = torch.stack([torch.cat([torch.full((3,), PAD_ID), real]), torch.arange(8) + 40])
    mask = torch.stack([torch.tensor([0, 0, 0, 1, 1, 1, 1, 1]), torch.ones(8, dtype=torch.long)])
    batch = policy.generate_ids(ids, mask, greedy=True)
    alone = policy.generate_ids(real[None], torch.ones(1, 5, dtype=torch.long), greedy=True)
    assert batch.prompt_mask[0].sum() == 5
    n = int(alone.completion_mask.sum())
    assert batch.completion_ids[0, :n].tolist() == alone.completion_ids[0, :n].tolist()
    policy.model.eval()
    scored = policy.score(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    torch.testing.assert_close(scored, batch.logprobs, atol=1e-5, rtol=0)


def test_right_padded_and_empty_prompt_ids_are_left_aligned(policy):
    ids = torch.tensor([[byte_id("a"), byte_id("b"), PAD_ID], [PAD_ID, PAD_ID, PAD_ID]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    before = ids.clone(), mask.clone()
    gen = policy.generate_ids(ids, mask, greedy=True)
    assert torch.equal(ids, before[0]) and torch.equal(mask, before[1])  # inputs are not written to
    assert gen.prompt_ids[0, -2:].tolist() == [byte_id("a"), byte_id("b")]
    assert gen.prompt_mask.tolist() == [[1, 1], [0, 1]]  # the empty prompt is conditioned on BOS
    assert gen.completion_ids[0].tolist() == policy.generate(["ab"], greedy=True).completion_ids[0].tolist()


def test_long_prompts_keep_their_end():
    policy = Policy.tiny("gpt2", generation=GenerationConfig(max_prompt_tokens=5))
    ids, mask = policy.encode(["abcdefgh", "xy"])
    assert ids[0].tolist() == [byte_id(c) for c in "defgh"]
    assert mask.tolist() == [[1] * 5, [0, 0, 0, 1, 1]]


def test_stop_strings_end_samples():
    stop = "b"
    cfg = GenerationConfig(max_new_tokens=20, stop_strings=(stop,), allowed_tokens=(byte_id("a"), byte_id("b")))
    policy = Policy.tiny("gpt2", generation=cfg)
    gen = policy.generate(["go"] * 24, generator=torch.Generator().manual_seed(0))
    assert_well_formed(gen, policy, stops=True)
    ended_by_stop = 0
    for text, row, n in zip(gen.texts, gen.completion_ids, gen.completion_mask.sum(1).tolist()):
        body = "".join(chr(i - BYTE_OFFSET) for i in row[:n].tolist() if i != EOS_ID)
        assert text == body
        assert stop not in text[:-1]  # the sample ended at the first stop string
        ended_by_stop += text.endswith(stop)
    assert ended_by_stop > 0
    policy.model.eval()
    scored = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    torch.testing.assert_close(scored, gen.logprobs, atol=1e-5, rtol=0)


def test_multi_token_stop_string_is_cut_in_text():
    cfg = GenerationConfig(max_new_tokens=30, stop_strings=("ab",), allowed_tokens=(byte_id("a"), byte_id("b")))
    policy = Policy.tiny("gpt2", generation=cfg)
    gen = policy.generate(["go"] * 16, generator=torch.Generator().manual_seed(1))
    assert_well_formed(gen, policy, stops=True)
    lengths = gen.completion_mask.sum(1).tolist()
    for text, row, n in zip(gen.texts, gen.completion_ids, lengths):
        assert "ab" not in text[:-1]
        if row[n - 1] != EOS_ID and n < cfg.max_new_tokens:
            assert text.endswith("ab")
    assert any(text.endswith("ab") for text in gen.texts)


def test_select_and_cat_keep_data(policy):
    a = policy.generate(PROMPTS, generator=torch.Generator().manual_seed(0))
    b = policy.generate(["short", "a much much longer prompt than the others here"], generator=torch.Generator())
    both = Generation.cat([a, b], pad_id=PAD_ID)
    assert len(both) == len(a) + len(b) and both.texts == a.texts + b.texts
    back = both.select(range(len(a)))
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "logprobs"):
        assert torch.equal(getattr(back, name), getattr(a, name)), name
    assert back.texts == a.texts
    # Selecting rows re-trims padding columns that became all-pad.
    shortest = int(a.completion_mask.sum(1).argmin())
    one = a.select(torch.tensor([shortest]))
    assert one.completion_mask.all() and one.prompt_mask.all()
    assert one.completion_ids.shape[1] == int(a.completion_mask[shortest].sum())
    # Scores of the concatenation equal the concatenated scores (cat re-pads correctly).
    policy.model.eval()
    with torch.no_grad():
        cat_scores = policy.score(both.prompt_ids, both.prompt_mask, both.completion_ids, both.completion_mask)
    torch.testing.assert_close(cat_scores, both.logprobs, atol=1e-5, rtol=0)
    assert both.to("cpu").texts == both.texts


def test_save_and_from_pretrained_round_trip(tmp_path):
    policy = Policy.tiny("llama", seed=1, generation=GenerationConfig(max_new_tokens=8))
    policy.save_pretrained(tmp_path / "tiny")
    again = Policy.from_pretrained(tmp_path / "tiny", generation=GenerationConfig(max_new_tokens=8))
    assert (again.pad_id, again.eos_id) == (policy.pad_id, policy.eos_id)
    assert again.tokenizer.padding_side == "left"
    a, b = policy.generate(PROMPTS, greedy=True), again.generate(PROMPTS, greedy=True)
    assert torch.equal(a.completion_ids, b.completion_ids) and a.texts == b.texts
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-6, rtol=0)


def test_missing_model_raises_model_error(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        Policy.from_pretrained(tmp_path / "nope")
    with pytest.raises(ModelError, match="could not load"):
        Policy.from_pretrained("textzoo-no-such-org/no-such-model", local_files_only=True)


def test_allowed_tokens_out_of_vocab_is_a_config_error():
    policy = Policy.tiny("gpt2", generation=GenerationConfig(allowed_tokens=(10_000,)))
    with pytest.raises(ConfigError, match="allowed_tokens"):
        policy.generate(["x"])


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_new_tokens", 0),
        ("temperature", 0.0),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("stop_strings", ("",)),
        ("stop_strings", "stop"),
        ("allowed_tokens", ()),
        ("max_prompt_tokens", 0),
    ],
)
def test_generation_config_validation_names_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        GenerationConfig(**{field: value})


def test_score_gradient_flows():
    policy = Policy.tiny("gpt2")
    gen = policy.generate(PROMPTS[:2], generator=torch.Generator().manual_seed(0))
    policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask).sum().backward()
    assert all(p.grad is not None for p in policy.model.parameters() if p.requires_grad)


def test_length_counts_rows_without_texts(policy):
    gen = policy.generate(PROMPTS[:3], generator=torch.Generator().manual_seed(0))
    bare = Generation(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask, gen.logprobs)
    assert len(bare) == 3 and bare.texts == []
    assert len(bare.select([2, 0])) == 2 and bare.select([2, 0]).texts == []
    both = Generation.cat([bare, gen], pad_id=PAD_ID)
    assert len(both) == 6 and both.texts == []  # texts of only some batches would misalign rows


def test_the_policy_and_the_test_stand_ins_implement_the_whole_interface():
    from toy import CategoricalPolicy

    from textzoo.models.interface import PolicyInterface

    policy = Policy.tiny("gpt2", n_layer=1, n_embd=16, n_head=2, seed=0)
    assert isinstance(policy, PolicyInterface) and isinstance(CategoricalPolicy(["a", "b"]), PolicyInterface)
    assert not isinstance(object(), PolicyInterface)  # the check can fail
    with policy.prompt_cache(), CategoricalPolicy(["a"]).prompt_cache():
        pass
