"""The end-of-run summary and the curve legend name each figure: what was decoded how, on how many prompts,
first -> last and the change, so a figure that learned and one that stayed flat read as such."""

from textzoo.config import TrainConfig
from textzoo.runners.commands import summary_lines
from textzoo.runners.plot import curve_label


def test_summary_lines_name_each_figure_by_hand():
    history = [
        {"step": 0, "eval/sampled/reward/mean": 0.5, "eval/greedy/reward/mean": 0.0},
        *({"step": s, "reward/mean": 0.1 * s} for s in range(1, 8)),
        {"step": 8, "reward/mean": 0.8, "eval/sampled/reward/mean": 0.9, "eval/greedy/reward/mean": 0.0},
    ]
    lines = summary_lines(history, TrainConfig(batch_prompts=8, group_size=4), 16)
    assert lines == [
        "held-out reward, sampled at temperature 1, 16 prompts, step 0 -> 8: 0.500 -> 0.900 (+0.400)",
        "held-out reward, greedy (argmax) decoding, 16 prompts, step 0 -> 8: 0.000 -> 0.000 (+0.000)",
        # 8 training steps: k = 8 // 4 = 2, (0.1 + 0.2) / 2 -> (0.7 + 0.8) / 2
        "training reward, sampled, 8 prompts x 4 samples a step, mean of the first and the last 2 step(s): "
        "0.150 -> 0.750 (+0.600)",
        # sampled rose 0.4, greedy 0.0: the gap is more than FLAT_GAP = 0.1
        "the sampled reward rose and the greedy one did not: the models learned a distribution of answers "
        "that scores, not yet one most likely answer that does (README, Quick start)",
    ]
    history[-1]["eval/greedy/reward/mean"] = 0.35  # greedy rose 0.35, within 0.1 of sampled's 0.4: no note
    assert len(summary_lines(history, TrainConfig(batch_prompts=8, group_size=4), 16)) == 3


def test_a_mode_evaluated_once_has_no_before_and_after():
    history = [{"step": 0, "eval/greedy/reward/mean": 0.2}, {"step": 1, "reward/mean": 0.3}]
    assert summary_lines(history, TrainConfig(), 4) == [
        "training reward, sampled, 8 prompts x 4 samples a step, mean of the first and the last 1 step(s): "
        "0.300 -> 0.300 (+0.000)"
    ]


def test_curve_labels():
    assert curve_label("eval/greedy/reward/mean", [0.0, 0.25, 1.0]) == "held-out, greedy: 0.00 -> 1.00"
    assert curve_label("reward/mean", [0.5]) == "training batches (sampled)"  # one point: no change to show
    assert curve_label("eval/sampled/reward/mean", [0.1, 0.2], "run-a") == "run-a: held-out, sampled"
    assert curve_label("agent/summary/loss", [1.0, 0.5]) == "agent/summary/loss"
