"""textzoo/Writing-v0: two writers summarize and elaborate the same source text.

Roles: `summary` writes a concise summary; `elaboration` writes a detailed elaboration. Both see
the same source and write at once (one turn); neither sees the other's text, so they coordinate
only through what they learn.

Observations (prompts, at most `max_prompt_chars`; the source is cut to fit)::

    Summarize the text in one sentence of at most {summary_max_words} words.
    Text: {source}
    Summary:

and the same with "Elaborate on the text in detail, in at most {elaboration_max_words} words."
and "Elaboration:" for `elaboration`.

Actions: any string (cleaned by `TextParallelEnv`; see its notes).

Words: `words(t)` = the lower-cased `\\w+` runs of `t`; n(t) = their count. Content words:
`content(t)` = the set of words of 3+ characters that are not in `STOPWORDS`. S = summary,
E = elaboration, X = source. Reward terms, each in [0, 1]:

- `length_ratio`: r = n(E) / n(S); 1 inside `ratio_band` [lo, hi] (default [2, 3]), r / lo below
  it, hi / r above it (continuous, falls to 0.5 at r = lo/2 and at r = 2 hi); 0 if either is empty.
- `diversity`: mean over S and E of the unique-word ratio |set(words(t))| / n(t) (0 for an empty text).
- `length_limits`: mean over S and E of [1 <= n(t) <= limit(t)] (limits `summary_max_words`,
  `elaboration_max_words`).
- `coordination`: mean of band(o_se, 0.5, 1.0) and band(o_src, 0.3, 0.8), where
  o_se = |content(S) & content(E)| / |content(S)| (the elaboration covers the summary's points) and
  o_src = |(content(S) | content(E)) & content(X)| / |content(S) | content(E)| (grounded in the source
  but not a copy); band(x, lo, hi) = 1 on [lo, hi], x / lo below, (1 - x) / (1 - hi) above; a ratio
  over an empty set is 0.

Team reward = sum_k w_k term_k / sum_k w_k over the selected terms (`terms`; default: all four,
weight 1 each, i.e. their mean). Every agent gets the team reward; `infos[agent]["reward_terms"]`
holds the selected terms (the same for both agents). `terms={"length_ratio": 1.0}` is the pure
length-ratio task, which a tiny model learns in minutes; it is registered as
`textzoo/WritingRatio-v0` (the task `textzoo train` runs by default).

Items: `num_items` procedural paragraphs (default 400, ~90-190 characters, generated from
templates and word lists with a fixed generator seed, independent of reset seeds) or the
`text_field` of `dataset` (a JSONL path, a `datasets.Dataset` or a list). `split="train"|"eval"`
keeps items k with k % 5 != 4 | k % 5 == 4 (`"all"`: every item); `options={"index": i}` picks
item i of the split.

Version history:
- v0: first version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from textzoo.envs._sources import load_records, procedural_paragraph, split_indices
from textzoo.envs.base import StepResult, TextParallelEnv, words
from textzoo.envs.declare import SPLIT, Arg, anything, entry_points, integer, number, task, text_args
from textzoo.errors import EnvError

TERMS = ("length_ratio", "diversity", "length_limits", "coordination")
STOPWORDS = frozenset(
    "the and for are but not you all any can had her was one our out has him his how its may new now "
    "old see two who did get let put say she too use that with have this will your from they been "
    "were said each which their them then than there these into some what when where would could "
    "about after also because before more most other over such only very just".split()
)
SUMMARY_PROMPT = "Summarize the text in one sentence of at most {limit} words.\nText: {source}\nSummary:"
ELABORATION_PROMPT = "Elaborate on the text in detail, in at most {limit} words.\nText: {source}\nElaboration:"
GENERATOR_SEED = 0  # fixed: the procedural item set never depends on reset seeds


def content_words(text: str) -> set[str]:
    """Distinct words of 3+ characters that are not stopwords."""
    return {w for w in words(text) if len(w) >= 3 and w not in STOPWORDS}


def band(x: float, lo: float, hi: float) -> float:
    """1 on [lo, hi], x / lo below, (1 - x) / (1 - hi) above (for ratios x in [0, 1])."""
    if x < lo:
        return x / lo
    if x > hi:
        return (1.0 - x) / (1.0 - hi)
    return 1.0


def length_ratio_score(summary: str, elaboration: str, lo: float = 2.0, hi: float = 3.0) -> float:
    """`length_ratio` term: 1 when n(E)/n(S) is in [lo, hi], r/lo below, hi/r above."""
    n_s, n_e = len(words(summary)), len(words(elaboration))
    if n_s == 0 or n_e == 0:
        return 0.0
    r = n_e / n_s
    return min(1.0, r / lo, hi / r)


def diversity_score(summary: str, elaboration: str) -> float:
    """`diversity` term: mean unique-word ratio of the two texts."""

    def unique_ratio(text: str) -> float:
        ws = words(text)
        return len(set(ws)) / len(ws) if ws else 0.0

    return (unique_ratio(summary) + unique_ratio(elaboration)) / 2


def length_limits_score(summary: str, elaboration: str, summary_max: int, elaboration_max: int) -> float:
    """`length_limits` term: the share of the two texts with 1 <= words <= their limit."""
    ok_s = 1 <= len(words(summary)) <= summary_max
    ok_e = 1 <= len(words(elaboration)) <= elaboration_max
    return (ok_s + ok_e) / 2


def coordination_score(summary: str, elaboration: str, source: str) -> float:
    """`coordination` term: summary/elaboration overlap and grounding in the source, in bands."""
    c_s, c_e, c_x = content_words(summary), content_words(elaboration), content_words(source)
    o_se = len(c_s & c_e) / len(c_s) if c_s else 0.0
    team = c_s | c_e
    o_src = len(team & c_x) / len(team) if team else 0.0
    return (band(o_se, 0.5, 1.0) + band(o_src, 0.3, 0.8)) / 2


def _parse_terms(terms: Any) -> dict[str, float]:
    if terms is None:
        return dict.fromkeys(TERMS, 1.0)
    if isinstance(terms, str):
        terms = [terms]
    if isinstance(terms, Mapping):
        weights = dict(terms)
    elif isinstance(terms, Sequence):
        weights = dict.fromkeys(terms, 1.0)
    else:
        raise EnvError(f"terms must be None, a list of term names or a dict name -> weight, got {type(terms).__name__}")
    unknown = sorted(set(map(str, weights)) - set(TERMS))
    if unknown:
        raise EnvError(f"terms has unknown term(s) {unknown}; known: {', '.join(TERMS)}")
    for k, w in weights.items():
        if not number(1.0, low=0).accepts(w):
            raise EnvError(f"terms[{k!r}] must be a finite weight >= 0, got {w!r}")
    if not weights or sum(weights.values()) <= 0:
        raise EnvError(f"terms must select at least one term with a positive weight, got {terms!r}")
    return {k: float(w) for k, w in weights.items()}


@task(
    "writing_v0",
    split=SPLIT,
    num_items=integer(None, low=1, optional=True, doc="procedural items (default 400), or the first rows of dataset"),
    dataset=anything(None, doc="a JSONL path, a datasets.Dataset or a list of rows; None: procedural paragraphs"),
    text_field=Arg("text", str, doc="the dataset field holding the source text"),
    terms=anything(None, doc="None (all four), a list of term names or a dict name -> weight"),
    summary_max_words=integer(30, low=1),
    elaboration_max_words=integer(90, low=1),
    ratio_band=anything((2.0, 3.0), doc="(lo, hi) with 0 < lo <= hi: the band of n(E) / n(S) that scores 1"),
    **text_args(max_prompt_chars=512),
)
class WritingEnv(TextParallelEnv):
    """Writing-v0: a summary writer and an elaboration writer; see the module docstring."""

    def __init__(
        self,
        split,
        num_items,
        dataset,
        text_field,
        terms,
        summary_max_words,
        elaboration_max_words,
        ratio_band,
        **text: Any,
    ):
        super().__init__(["summary", "elaboration"], num_turns=1, **text)
        max_prompt_chars = text["max_prompt_chars"]
        self.split = split
        if (
            not isinstance(ratio_band, Sequence)
            or len(ratio_band) != 2
            or not all(isinstance(x, (int, float)) for x in ratio_band)
            or not 0 < ratio_band[0] <= ratio_band[1]
        ):
            raise EnvError(f"ratio_band must be (lo, hi) with 0 < lo <= hi, got {ratio_band!r}")
        self.weights = _parse_terms(terms)
        self.summary_max_words = summary_max_words
        self.elaboration_max_words = elaboration_max_words
        self.ratio_band = (float(ratio_band[0]), float(ratio_band[1]))
        # Leave room for the template so the tail ("Summary:") is never cut off.
        overhead = max(
            len(SUMMARY_PROMPT.format(limit=summary_max_words, source="")),
            len(ELABORATION_PROMPT.format(limit=elaboration_max_words, source="")),
        )
        self.max_source_chars = max_prompt_chars - overhead
        if self.max_source_chars < 32:
            raise EnvError(
                f"max_prompt_chars={max_prompt_chars} leaves no room for a source text; use at least {overhead + 32}"
            )

        if dataset is None:
            total = 400 if num_items is None else num_items
            pool = range(total)
            self._sources = [procedural_paragraph(k, GENERATOR_SEED) for k in split_indices(total, self.split)]
        else:
            rows = load_records(dataset, text_field, "dataset")
            if num_items is not None:
                rows = rows[:num_items]
            pool = rows
            self._sources = [str(rows[k][text_field]) for k in split_indices(len(rows), self.split)]
        if not self._sources:
            raise EnvError(
                f"split={self.split!r} of {len(pool)} items is empty; the eval split holds every 5th item, "
                "so give at least 5 items (or split='all')"
            )
        self.source = ""

    def num_items(self) -> int:
        return len(self._sources)

    def _reset_task(self, index: int) -> dict[str, str]:
        self.source = self._sources[index][: self.max_source_chars]
        return {
            "summary": SUMMARY_PROMPT.format(limit=self.summary_max_words, source=self.source),
            "elaboration": ELABORATION_PROMPT.format(limit=self.elaboration_max_words, source=self.source),
        }

    def _step_task(self, actions: dict[str, str], notes: dict[str, list[str]]) -> StepResult:
        s, e = actions["summary"], actions["elaboration"]
        lo, hi = self.ratio_band
        scorers = {
            "length_ratio": lambda: length_ratio_score(s, e, lo, hi),
            "diversity": lambda: diversity_score(s, e),
            "length_limits": lambda: length_limits_score(s, e, self.summary_max_words, self.elaboration_max_words),
            "coordination": lambda: coordination_score(s, e, self.source),
        }
        terms = {name: scorers[name]() for name in self.weights}
        team = sum(self.weights[k] * terms[k] for k in terms) / sum(self.weights.values())
        extra: dict[str, list[str]] = {}
        for agent, limit in (("summary", self.summary_max_words), ("elaboration", self.elaboration_max_words)):
            n = len(words(actions[agent]))
            if n == 0:
                extra[agent] = [f"{agent} has no words; it scores 0 on length_ratio and its share of the other terms"]
            elif n > limit:
                extra[agent] = [f"{agent} has {n} words, over its limit of {limit}"]
        return StepResult(
            rewards=dict.fromkeys(self.possible_agents, team),
            reward_terms={a: dict(terms) for a in self.possible_agents},
            notes=extra,
        )


parallel_env, env, raw_env = entry_points(WritingEnv)
