"""Parse failures of each joint format on the real model at step 0 (no training).

One SmolLM2-135M-Instruct joint actor (chat format) answers for both roles of Writing-v0 in each
format: ``structured`` (the runner writes the role tags as forced tokens) and the free-form ``tags``,
``labels`` (``role:`` lines) and ``json``. For each it prints, over the same prompts and sampling
seed: the parse-failure rate (sampled and greedy), the mean team reward and the mean characters per
role's action. Usage::

    python benchmarks/joint_formats.py [--prompts 16] [--group 2] [--tokens 48] [--model PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from textzoo.decoding.generation import GenerationConfig
from textzoo.envs import make
from textzoo.models.joint import JOINT_FORMATS, JointActor
from textzoo.models.policy import Policy
from textzoo.models.prompting import PromptFormat
from textzoo.runners.rollout import Collector, prompt_seed
from textzoo.runners.trainer import rollout_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=16, help="Writing-v0 training items")
    parser.add_argument("--group", type=int, default=2, help="samples per item (temperature 1)")
    parser.add_argument("--tokens", type=int, default=48, help="token budget per role")
    parser.add_argument("--model", default="", help="model folder or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    harness.setup(args.threads)
    source = harness.model_folder(args.model)
    roles = ["summary", "elaboration"]
    policy = Policy.from_pretrained(source, generation=GenerationConfig(max_new_tokens=2 * args.tokens))
    fmt = PromptFormat.resolve(policy.tokenizer)
    items = list(range(args.prompts))
    seeds = [prompt_seed(0, 0, b) for b in items]
    print(f"model {source} ({fmt.style} prompts), {args.prompts} prompts x {args.group} samples, "
          f"{args.tokens} tokens per role, {torch.get_num_threads()} thread(s)")  # fmt: skip
    print("| format | parse failures (sampled) | parse failures (greedy) | reward (sampled) | reward (greedy) "
          "| chars summary / elaboration | s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for joint_format in JOINT_FORMATS:
        joint = JointActor(roles, policy, joint_format=joint_format, prompt_format=fmt, section_tokens=args.tokens)
        collector = Collector(lambda: make("textzoo/Writing-v0"), [joint])
        start = time.perf_counter()
        torch.manual_seed(0)
        sampled = rollout_metrics(collector.collect(items, seeds, args.group))
        greedy = rollout_metrics(collector.collect(items, seeds, 1, greedy=True))
        chars = " / ".join(f"{sampled.get(f'role/{r}/completion_chars', 0.0):.0f}" for r in roles)
        seconds = time.perf_counter() - start
        print(
            f"| {joint_format} | {sampled['parse_failure_rate']:.0%} | {greedy['parse_failure_rate']:.0%} | "
            f"{sampled['reward/mean']:.3f} | {greedy['reward/mean']:.3f} | {chars} | {seconds:.0f} |"
        )
        collector.close()


if __name__ == "__main__":
    main()
