"""The joint actor's rollouts with forced runs fed in one pass against token by token, side by side.

A centralized SmolLM2-135M-Instruct joint actor plays Debate-v0 `one-digit-sums` (2 debaters, 2 turns, 48
tokens a section) greedily on the first `--items` held-out items. Between its two sections of a turn the
joint answer writes the next role's observation as forced text (the chat template's next user turn, a
hundred tokens and more); the plain backend feeds such a run in one pass (`PlainDecoding.decode_many`).
The same collection runs with that method hidden (one pass per forced token, as before), alternating,
`--repeats` times each, in this process; it prints each side's seconds, the ratio, and whether the two
wrote the same completions. Usage::

    OMP_NUM_THREADS=1 python benchmarks/joint_decode.py [--items 10] [--repeats 2] [--model PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from textzoo.config import AgentConfig, TrainConfig
    from textzoo.decoding.backends.plain import PlainDecoding
    from textzoo.envs.debate_v0 import PRESETS
    from textzoo.runners.build import build_actors, env_factory
    from textzoo.runners.rollout import Collector, prompt_seed

    cfg = TrainConfig(
        env="textzoo/Debate-v0", **PRESETS["one-digit-sums"].train_fields("centralized"), collaboration="centralized",
        agent=AgentConfig(model=harness.model_folder(args.model), max_prompt_tokens=512), progress=False, plot=False,
    )  # fmt: skip
    env_fn = env_factory(cfg, eval=True)
    collector = Collector(env_fn, build_actors(cfg, list(env_fn().possible_agents)))
    items = list(range(args.items))
    many = PlainDecoding.decode_many

    def collect(chunked: bool):
        if chunked:
            PlainDecoding.decode_many = many
        elif hasattr(PlainDecoding, "decode_many"):
            del PlainDecoding.decode_many
        start = time.perf_counter()
        rollout = collector.collect(items, [prompt_seed(0, -1, b) for b in items], 1, greedy=True)
        return time.perf_counter() - start, rollout

    collect(True)  # warm-up
    times: dict[bool, list[float]] = {True: [], False: []}
    texts: dict[bool, list] = {}
    for _ in range(args.repeats):
        for chunked in (False, True):
            seconds, rollout = collect(chunked)
            times[chunked].append(seconds)
            texts[chunked] = [step.gen.completion_ids.tolist() for step in rollout.steps]
    PlainDecoding.decode_many = many
    one, chunk = statistics.median(times[False]), statistics.median(times[True])
    print(harness.host_line())
    print(f"{args.items} items, greedy, {args.repeats} repeats each (median): token by token {one:.1f} s "
          f"{times[False]}, forced runs in one pass {chunk:.1f} s {times[True]}: {one / chunk:.2f}x")  # fmt: skip
    print(f"same completions: {texts[True] == texts[False]}")


if __name__ == "__main__":
    main()
