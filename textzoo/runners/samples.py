"""Completions you can read: `samples.jsonl` in every run dir, a console table, TensorBoard / W&B.

One JSON object per logged episode and turn::

    {"step": 3, "split": "train", "item": 17, "sample": 0, "turn": 0, "reward": 0.62, "parse_failed": false,
     "roles": {"summary": {"actor": "summary", "prompt": "<|im_start|>system...", "completion": "...",
                           "reward": 0.62, "reward_terms": {"length_ratio": 1.0, ...}}, ...}}

``prompt`` is the prompt as sent: the model's input tokens decoded with their special tokens (so a
chat template, a system prompt or a cut long prompt shows as the model saw it). ``completion`` is
the text the model wrote; for a joint actor, which answers for several roles in one completion, each
role also has ``action``, its parsed part. ``reward`` is the team reward of the turn (the mean over
roles), each role's ``reward`` and ``reward_terms`` its own. ``split`` is "train" or "eval/greedy" /
"eval/sampled" (held-out items, logged at each evaluation). A step logs ``log_completions``
episodes: one sample of each of the first prompts (sample 0 of prompts 0, 1, ..., then sample 1).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from textzoo.algorithms.batch import Rollout
from textzoo.models.team import Actor

CONSOLE_CHARS = 240
"""Console cells show at most this many characters of a text (the file keeps it whole)."""


def episodes(rollout: Rollout, limit: int) -> list[int]:
    """The env copies to log: sample 0 of each prompt first, then sample 1, ... (at most ``limit``)."""
    G = rollout.group_size
    return sorted(range(rollout.num_envs), key=lambda e: (e % G, e // G))[:limit]


def sample_rows(rollout: Rollout, actors: Sequence[Actor], step: int, split: str, limit: int) -> list[dict[str, Any]]:
    """The rows of ``limit`` episodes of ``rollout`` (module docstring), every turn of each."""
    if limit <= 0:
        return []
    by_id = {a.id: a for a in actors}
    actions = rollout.infos.get("actions", [])
    terms = rollout.infos.get("reward_terms_by_turn", [])
    chosen = set(episodes(rollout, limit))
    # (env, turn) -> [(actor, prompt ids, completion text)] from each actor step's rows
    written: dict[tuple[int, int], list[tuple[Actor, list[int], str]]] = {}
    for s in rollout.steps:
        actor = by_id[s.actor]
        for row, e in enumerate(s.env_ids.tolist()):
            if e in chosen:
                ids = s.gen.prompt_ids[row][s.gen.prompt_mask[row].bool()].tolist()
                written.setdefault((e, s.turn), []).append((actor, ids, s.gen.texts[row]))
    rows = []
    G = rollout.group_size
    for e in episodes(rollout, limit):
        for t in range(rollout.rewards.shape[-1]):
            if (e, t) not in written:
                continue
            roles: dict[str, dict[str, Any]] = {}
            failed = False
            for actor, ids, text in written[(e, t)]:
                acted = tuple(r for r in actor.roles if r in actions[t].get(e, {}))
                parsed, fail = actor.parse(text, acted)
                failed |= fail
                for r in acted:
                    entry = {"actor": actor.id, "prompt": _prompt_text(actor, ids), "completion": text}
                    if len(actor.roles) > 1:
                        entry["action"] = parsed.get(r, "")
                    ri = rollout.roles.index(r)
                    entry["reward"] = float(rollout.rewards[e, ri, t])
                    entry["reward_terms"] = terms[t].get(e, {}).get(r, {}) if t < len(terms) else {}
                    roles[r] = entry
            rows.append(
                {
                    "step": step,
                    "split": split,
                    "item": int(rollout.items[e // G]),
                    "sample": e % G,
                    "turn": t,
                    "reward": float(rollout.rewards[e, :, t].mean()),
                    "parse_failed": failed,
                    "roles": roles,
                }
            )
    return rows


def _prompt_text(actor: Actor, ids: list[int]) -> str | None:
    tokenizer = actor.policy.tokenizer
    return None if tokenizer is None else tokenizer.decode(ids, skip_special_tokens=False)


class SamplesLog:
    """Appends rows to ``RUN_DIR/samples.jsonl``; `truncate` drops rows of steps after a checkpoint."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        with open(self.path, "a") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)

    def truncate(self, step: int) -> None:
        """Keep the rows of steps <= ``step`` (what an uninterrupted run had written at that checkpoint)."""
        if not self.path.is_file():
            return
        lines = self.path.read_text().splitlines()
        kept = [line for line in lines if json.loads(line)["step"] <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.path)


def read_samples(path: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    """The rows of a `samples.jsonl` (of one ``split`` when given)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in rows if split is None or r["split"] == split]


def _short(text: str | None, limit: int = CONSOLE_CHARS) -> str:
    if text is None:
        return ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def samples_table(rows: list[dict[str, Any]], title: str = "samples"):
    """A rich `Table` of rows: one line per row and role (item, role, completion, reward, its terms)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, show_lines=True, expand=True)
    for name, kwargs in (
        ("item", {"no_wrap": True}),
        ("role", {"no_wrap": True}),
        ("completion", {"ratio": 4}),
        ("reward", {"justify": "right", "no_wrap": True}),
        ("terms", {"ratio": 1}),
    ):
        table.add_column(name, **kwargs)
    for row in rows:
        for role, entry in row["roles"].items():
            text = entry.get("action", entry["completion"])
            terms = "\n".join(f"{k} {v:.2f}" for k, v in sorted(entry["reward_terms"].items()))
            where = f"{row['item']}/{row['sample']}" + (f" t{row['turn']}" if row["turn"] else "")
            flag = " (parse failed)" if row["parse_failed"] else ""
            shown = Text(_short(text)) if text else Text("(empty)", style="dim")  # model text: never markup
            table.add_row(Text(where), Text(role + flag), shown, Text(f"{entry['reward']:.3f}"), Text(terms))
    return table


def samples_markdown(rows: list[dict[str, Any]]) -> str:
    """Rows as a Markdown table (what TensorBoard's text plugin renders), full texts, prompts included."""

    def cell(text: Any) -> str:
        return str(text).replace("|", "\\|").replace("\n", "<br>")

    lines = ["| item | turn | role | prompt | completion | reward | terms |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        for role, entry in row["roles"].items():
            terms = ", ".join(f"{k}={v:.3f}" for k, v in sorted(entry["reward_terms"].items()))
            text = entry.get("action", entry["completion"])
            lines.append(
                f"| {row['item']}/{row['sample']} | {row['turn']} | {cell(role)} | {cell(entry['prompt'])} | "
                f"{cell(text)} | {entry['reward']:.3f} | {cell(terms)} |"
            )
    return "\n".join(lines)


SAMPLE_COLUMNS = ("step", "split", "item", "sample", "turn", "role", "prompt", "completion", "reward", "reward_terms")
"""Columns of the flat table a tracker (W&B) gets: one line per row and role."""


def flat_samples(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Rows as lists in `SAMPLE_COLUMNS` order (one per row and role)."""
    out = []
    for row in rows:
        for role, entry in row["roles"].items():
            text = entry.get("action", entry["completion"])
            values = {**row, "role": role, "prompt": entry["prompt"], "completion": text, "reward": entry["reward"]}
            values["reward_terms"] = json.dumps(entry["reward_terms"], sort_keys=True)
            out.append([values[c] for c in SAMPLE_COLUMNS])
    return out
