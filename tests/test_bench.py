"""`textzoo bench`: grid parsing, cell configs, resumable runs, results.md and curves."""

import json
import re
import statistics

import pytest
import torch

torch.set_num_threads(1)

import textzoo.runners.bench as bench  # noqa: E402
from textzoo.algorithms import registry as algorithms  # noqa: E402
from textzoo.config_files import to_dict  # noqa: E402
from textzoo.errors import ConfigError, TextzooError  # noqa: E402
from textzoo.runners.bench import load_grid, merge_config, run_grid, summarize, write_report  # noqa: E402
from textzoo.runners.cli import main as cli_main  # noqa: E402

TINY = """
[grid]
name = "tiny"
tasks = ["writing"]
algos = ["magrpo", "mareinforce"]
collaboration = ["decentralized"]
seeds = [0, 1]

[base]
steps = 2
batch_prompts = 1
group_size = 2
eval_prompts = 2
threads = 1

[base.agent]
n_layer = 1
n_embd = 16
max_new_tokens = 4

[task.writing]
env = "textzoo/Writing-v0"
env_kwargs = { terms = { length_ratio = 1.0 } }
"""


def write(tmp_path, text, name="grid.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_cell_configs_layer_base_task_algo_and_mode(tmp_path):
    path = write(
        tmp_path,
        """
[grid]
tasks = ["writing", "relay"]
algos = ["magrpo", "iac"]
collaboration = ["decentralized", "centralized"]
seeds = [3]
exclude = [{ algo = "iac", collaboration = "centralized" }]
[base]
steps = 7
agent = { lr = 0.5, max_new_tokens = 9 }
[task.writing]
env = "textzoo/Writing-v0"
agent = { lr = 0.25 }
[task.relay]
env = "textzoo/Relay-v0"
env_kwargs = { num_symbols = 3 }
agent_overrides = { receiver = { max_new_tokens = 2 } }
[algo.iac]
steps = 11
[collaboration.centralized]
agent_overrides = {}
""",
    )
    grid = load_grid(path, out_dir=str(tmp_path / "out"))
    cells = {(c.task, c.algo, c.collaboration): c for c in grid.cells}
    assert len(cells) == 6  # 2 tasks x (magrpo x 2 modes + iac decentralized)
    w = cells["writing", "magrpo", "decentralized"].config
    assert (w.agent.lr, w.agent.max_new_tokens, w.steps, w.seed) == (0.25, 9, 7, 3)  # agent tables merge key by key
    assert cells["writing", "iac", "decentralized"].config.steps == 11
    r = cells["relay", "magrpo", "decentralized"].config
    assert r.env_kwargs == {"num_symbols": 3} and r.agent_overrides == {"receiver": {"max_new_tokens": 2}}
    assert cells["relay", "magrpo", "centralized"].config.agent_overrides == {}
    assert cells["relay", "iac", "decentralized"].run_dir == tmp_path / "out" / "relay" / "iac-decentralized-s3"
    assert merge_config(
        {"agent": {"lr": 1}, "env_kwargs": {"a": 1}}, {"agent": {"n_layer": 2}, "env_kwargs": {"b": 2}}
    ) == {"agent": {"lr": 1, "n_layer": 2}, "env_kwargs": {"b": 2}}
    # the agent's sections merge key by key too, an agent table in the old flat layout read as today's first
    base = {"agent": {"lora_rank": 16, "lora_alpha": 32, "chat_template_kwargs": {"a": 1}}}
    layer = {"agent": {"lora": {"rank": 8}, "chat_template_kwargs": {"b": 2}}}
    assert merge_config(base, layer) == {"agent": {"lora": {"rank": 8, "alpha": 32}, "chat_template_kwargs": {"b": 2}}}


def test_all_algorithms_are_whatever_textzoo_has_at_run_time(tmp_path, monkeypatch):
    monkeypatch.setitem(algorithms.ALGORITHMS, "magrpo_late", algorithms.ALGORITHMS["magrpo"])
    path = write(tmp_path, TINY.replace('algos = ["magrpo", "mareinforce"]', 'algos = "all"'))
    grid = load_grid(path)
    algos = list(dict.fromkeys(c.algo for c in grid.cells))
    assert algos == list(algorithms.ALGORITHMS) and "magrpo_late" in algos


@pytest.mark.parametrize(
    "edit, match",
    [
        (('tasks = ["writing"]', 'tasks = ["writing", "code"]'), r"\[task.code\]"),
        (('algos = ["magrpo", "mareinforce"]', 'algos = ["magrpo", "nope"]'), "unknown algo 'nope'"),
        (('collaboration = ["decentralized"]', 'collaboration = ["solo"]'), "grid.collaboration"),
        (("steps = 2", "steps = 2\nseed = 4"), r"\[base\] sets 'seed'"),
        (("steps = 2", "step = 2"), r"cell writing/magrpo/decentralized/seed 0: unknown config field.*'step'"),
        (("steps = 2", "steps = 0"), "steps must be >= 1"),
        (("seeds = [0, 1]", "seeds = []"), "grid.seeds"),
        (('name = "tiny"', 'name = "tiny"\nrepeat = 2'), "unknown key.*repeat"),
        (("steps = 2", 'steps = 2\neval_modes = ["sampled"]'), "needs eval_modes to include 'greedy'"),
    ],
)
def test_bad_grids_say_what_to_fix(tmp_path, edit, match):
    with pytest.raises(ConfigError, match=match):
        load_grid(write(tmp_path, TINY.replace(*edit)))


def test_summarize_reads_start_final_best_and_speed():
    history = [
        {"step": 0, "eval/greedy/reward/mean": 0.1},
        {"step": 1, "time/tokens_per_s": 100.0},
        {"step": 2, "time/tokens_per_s": 300.0, "eval/greedy/reward/mean": 0.7},
        {"step": 3, "time/tokens_per_s": 200.0, "eval/greedy/reward/mean": 0.4},
    ]
    s = summarize(history, "eval/greedy/reward/mean")
    assert (s["start"], s["final"], s["best"], s["tokens_per_s"], s["steps"]) == (0.1, 0.4, 0.7, 200.0, 3)
    assert bench._spread([0.2, 0.4]) == "0.300 ± 0.141" and bench._spread([0.5, None]) == "0.500"


def test_grid_runs_end_to_end_then_resumes_without_retraining(tmp_path, monkeypatch):
    grid = load_grid(write(tmp_path, TINY), out_dir=str(tmp_path / "out"))
    lines: list[str] = []
    results = run_grid(grid, log=lines.append)
    assert len(results) == 4 and not any("error" in s for s in results.values())
    for cell in grid.cells:
        marker = json.loads((cell.run_dir / bench.MARKER).read_text())
        assert marker["steps"] == 2 and marker["config"]["seed"] == cell.seed
        assert (cell.run_dir / "metrics.jsonl").is_file()
    md = write_report(grid, results).read_text()
    row = re.search(r"\| magrpo \| decentralized \| 2/2 \| [^|]+ \| ([^|]+) \|", md).group(1).strip()
    finals = [results[c.label]["final"] for c in grid.cells if c.algo == "magrpo"]
    assert row == f"{statistics.fmean(finals):.3f} ± {statistics.stdev(finals):.3f}"
    assert (tmp_path / "out" / "curves-writing.png").stat().st_size > 0

    # a rerun trains nothing; losing one cell's marker retrains that cell only
    calls = []
    monkeypatch.setattr(
        bench,
        "run_cell",
        lambda config, metric: (
            calls.append(config["run_dir"])
            or results[next(c.label for c in grid.cells if str(c.run_dir) == config["run_dir"])]
        ),
    )
    run_grid(grid, log=lines.append)
    assert calls == [] and lines[-1] == "tiny: 4 cells, 4 finished, 0 to train"
    (grid.cells[1].run_dir / bench.MARKER).unlink()
    run_grid(grid, log=lines.append)
    assert calls == [str(grid.cells[1].run_dir)]

    # a finished cell whose config the grid no longer gives is an error, not a silent skip
    changed = load_grid(write(tmp_path, TINY.replace("steps = 2", "steps = 3")), out_dir=str(tmp_path / "out"))
    with pytest.raises(ConfigError, match="different config"):
        run_grid(changed, log=lines.append)


def test_a_failed_cell_is_reported_and_retried(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, TINY.replace("seeds = [0, 1]", "seeds = [0]"))

    def broken(config, metric):
        raise RuntimeError("out of luck")

    monkeypatch.setattr(bench, "run_cell", broken)
    assert cli_main(["bench", str(path), "--out-dir", str(tmp_path / "out")]) == 2
    assert "some cells failed" in capsys.readouterr().err
    error = tmp_path / "out" / "writing" / "magrpo-decentralized-s0" / "error.txt"
    assert "out of luck" in error.read_text()
    md = (tmp_path / "out" / "results.md").read_text()
    assert "| magrpo | decentralized | 0/1 | failed: RuntimeError: out of luck |" in md

    assert cli_main(["bench", str(path), "--out-dir", str(tmp_path / "out"), "--dry-run"]) == 0
    assert re.search(r"writing magrpo decentralized seed 0 +failed", capsys.readouterr().out)
    assert cli_main(["bench", str(path), "--out-dir", str(tmp_path / "out"), "--report"]) == 2
    assert "| 0/1 | failed: RuntimeError: out of luck |" in (tmp_path / "out" / "results.md").read_text()
    with pytest.raises(TextzooError):
        bench.main([str(tmp_path / "missing.toml")])


def test_a_stopped_cell_stops_the_grid_and_the_next_run_resumes_it(tmp_path, monkeypatch, capsys):
    import textzoo.runners.trainer as trainer_module

    path = write(tmp_path, TINY.replace('algos = ["magrpo", "mareinforce"]', 'algos = ["magrpo"]'))
    out = tmp_path / "out"
    stops = iter([False, True])  # SIGTERM during the first cell's first step: it stops before step 2
    monkeypatch.setattr(trainer_module, "agree", lambda requested: next(stops, False))
    assert cli_main(["bench", str(path), "--out-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "stopped by" in printed and "the same command continues the grid" in printed
    grid = load_grid(path, out_dir=str(out))
    first, second = grid.cells
    assert not (first.run_dir / bench.MARKER).exists() and (first.run_dir / "checkpoints" / "step-00000001").is_dir()
    assert not (second.run_dir / "config.json").exists()  # the grid stopped with the cell
    monkeypatch.undo()
    assert cli_main(["bench", str(path), "--out-dir", str(out)]) == 0
    marker = json.loads((first.run_dir / bench.MARKER).read_text())
    assert marker["resumed"] and marker["steps"] == 2
    assert (second.run_dir / bench.MARKER).exists()


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (from /proc)."""
    from pathlib import Path

    kids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(pid):
            kids.append(int(status.parent.name))
    return kids


def _alive(pid: int) -> bool:
    from pathlib import Path

    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
def test_a_parallel_grid_stops_on_sigterm_and_its_workers_die_with_it(tmp_path):
    """--workers 2: SIGTERM to the grid stops the running cells (checkpointed) and starts no queued one;
    a SIGKILLed grid leaves no worker running (they get SIGTERM); the next run finishes every cell."""
    import signal
    import subprocess
    import sys
    import time

    path = write(tmp_path, TINY.replace("steps = 2", "steps = 30"))
    out = tmp_path / "out"
    grid = load_grid(path, out_dir=str(out))
    command = [sys.executable, "-c", "import sys; from textzoo.runners.cli import main; sys.exit(main(sys.argv[1:]))"]
    command += ["bench", str(path), "--out-dir", str(out), "--workers", "2"]

    def wait_for_exit(pids, seconds):
        deadline = time.monotonic() + seconds
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in pids if _alive(pid)]

    def start_and_wait_for_training():
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            rows = [c.run_dir / "metrics.jsonl" for c in grid.cells]
            if any(r.is_file() and len(r.read_text().splitlines()) >= 2 for r in rows):
                return proc, _children(proc.pid)
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.1)
        proc.kill()
        raise AssertionError("no cell trained a step in 240 s")

    proc, workers = start_and_wait_for_training()
    assert len(workers) >= 2  # the pool's processes (and the resource tracker)
    proc.send_signal(signal.SIGTERM)
    printed = proc.communicate(timeout=240)[0]
    assert proc.returncode == 0, printed
    assert "stopped by SIGTERM" in printed and "the same command continues the grid" in printed
    wait_for_exit(workers, 30)  # the resource tracker may outlive the grid by a moment
    started = [c for c in grid.cells if (c.run_dir / "config.json").is_file()]
    assert len(started) <= 2  # the queued cells never started
    for cell in started:
        assert (cell.run_dir / bench.MARKER).is_file() or list((cell.run_dir / "checkpoints").iterdir())

    proc, workers = start_and_wait_for_training()
    proc.kill()  # SIGKILL: no chance to forward anything; the workers get SIGTERM from the kernel
    proc.wait()
    wait_for_exit(workers, 120)  # each finishes its step and checkpoints first

    assert cli_main(["bench", str(path), "--out-dir", str(out), "--workers", "2"]) == 0
    markers = [json.loads((c.run_dir / bench.MARKER).read_text()) for c in grid.cells]
    assert all(m["steps"] == 30 for m in markers) and any(m["resumed"] for m in markers)


def test_a_cell_finished_with_an_older_config_layout_counts_as_finished(tmp_path, monkeypatch):
    """A grid run before the agent's engine and lora sections left flat `engine_*` / `lora_*` keys in its
    cells' markers: read through the migration, they are the same config, so nothing retrains."""
    grid = load_grid(write(tmp_path, TINY), out_dir=str(tmp_path / "out"))
    for cell in grid.cells:
        config = to_dict(cell.config)
        agent = config["agent"]
        flat = {f"lora_{k}": v for k, v in agent.pop("lora").items()}
        engine = agent.pop("engine")
        flat |= {"engine": engine.pop("kind"), "dtype": None, **{f"engine_{k}": v for k, v in engine.items()}}
        config["agent"] = {**agent, **flat}
        cell.run_dir.mkdir(parents=True)
        (cell.run_dir / bench.MARKER).write_text(json.dumps({"config": config, "steps": 2, "final": 0.5}))
    monkeypatch.setattr(bench, "run_cell", lambda config, metric: pytest.fail(f"retrained {config['run_dir']}"))
    lines: list[str] = []
    run_grid(grid, log=lines.append)
    assert lines[-1] == "tiny: 4 cells, 4 finished, 0 to train"
