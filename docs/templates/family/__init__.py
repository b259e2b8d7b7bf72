"""Template of an algorithm family folder: copy it to `textzoo/algorithms/<family>/` and rename.

- `config.py`: the family's config section (plain data, no torch). Add it to `TrainConfig` as a field named
  like the family: `median: MedianConfig = field(default_factory=MedianConfig)`.
- `family.py`: the family (turns a `Rollout` into update `Job`s), its loss, its routing to `rlmath`.
- `entries.py`: its registry entries (`Algorithm`s); add `ENTRIES` to `textzoo/algorithms/registry.py`.

The example is a REINFORCE variant whose baseline is each group's median (`tests/test_template.py`
trains it).
"""
