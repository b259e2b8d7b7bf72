"""`textzoo export` and `textzoo eval --team`: a run's models out of textzoo, checked against the trained policy.

Each model card's loading snippet is run as it is written (plain transformers, PEFT): its greedy completion of the
card's held-out prompt must be token for token the completion of the trained policy in textzoo (the checkpoint
loaded by `Trainer.load_final_weights`), and its logits those of the trained model, not of the base. `textzoo eval
--team` must give the run's logged held-out rewards exactly. Tiny models here; SmolLM2 (and vLLM) at the end.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import features
import pytest
import torch
import yaml
from helpers import tiny_config

from textzoo.config import AgentConfig, LoRAConfig
from textzoo.config_files import load_config
from textzoo.errors import CheckpointError, ConfigError
from textzoo.models.loading import gguf_metadata
from textzoo.runners import checkpoint as ck
from textzoo.runners.cli import main as cli_main
from textzoo.runners.export import export_run
from textzoo.runners.modelcard import describe_base
from textzoo.runners.trainer import Trainer

torch.set_num_threads(1)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
WORDS = ("a ", "bb ", "ccc ")  # allowed outputs: completions whose lengths (the reward) depend on the weights


def _train(run_dir: Path, **fields) -> Path:
    base = dict(steps=2, save_every=1, keep_last=0, eval_every=1, eval_prompts=4, run_dir=run_dir)
    Trainer(tiny_config(**{**base, **fields})).train()
    return run_dir


CHAT_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}{% if tone %} {{ tone }}{% endif %}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)
"""A chat template that reads a template variable (`tone`), for a tiny model in the chat prompt format."""
CHAT = dict(prompt_format="chat", system_prompt="Be brief.", chat_template_kwargs={"tone": "calm"}, precision="fp32")


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    """A tiny Llama saved as a transformers folder whose tokenizer has a chat template: a local model folder
    that formats prompts as chat, as an instruct model does."""
    from textzoo.models.loading import build_tiny
    from textzoo.models.tokenizer import llama_byte_tokenizer

    model, tokenizer = build_tiny("llama", tokenizer=llama_byte_tokenizer(), seed=7)
    tokenizer.chat_template = CHAT_TEMPLATE
    folder = tmp_path_factory.mktemp("chat") / "tiny-chat"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    """Two LoRA agents on one tiny GPT-2 base (Writing-v0's length ratio), checkpoints at steps 1 and 2."""
    agent = AgentConfig(max_new_tokens=8, lora=LoRAConfig(rank=4), lr=5e-2, allowed_outputs=WORDS)
    return _train(tmp_path_factory.mktemp("lora") / "run", agent=agent)


@pytest.fixture(scope="module")
def joint_run(tmp_path_factory, chat_model) -> Path:
    """A joint actor (the chat folder, fully fine-tuned) answering for both roles in the structured format."""
    agent = AgentConfig(model=str(chat_model), max_new_tokens=6, lr=1e-2, allowed_outputs=WORDS, **CHAT)
    return _train(tmp_path_factory.mktemp("joint") / "run", collaboration="centralized", agent=agent)


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory) -> Path:
    """A fully fine-tuned tiny GPT-2 summary beside a frozen tiny-Llama elaboration."""
    agent = AgentConfig(max_new_tokens=8, lr=5e-2, allowed_outputs=WORDS)
    frozen = {"elaboration": {"model": "tiny-llama", "trainable": False}}
    return _train(tmp_path_factory.mktemp("mixed") / "run", agent=agent, agent_overrides=frozen, save_every=0)


# ---- helpers -------------------------------------------------------------------------------------
def _trained_actor(run_dir: Path, actor_id: str):
    """The actor `actor_id` of the run with its newest checkpoint loaded: the trained policy in textzoo."""
    trainer = Trainer(load_config(run_dir / "config.json"), run_dir=run_dir)
    trainer.load_final_weights()
    return {a.id: a for a in trainer.actors}[actor_id]


def _written(gen) -> list[int]:
    """Every completion token of row 0 up to the last sampled one (a structured completion's forced ones too)."""
    sampled = gen.completion_mask[0].nonzero()
    return gen.completion_ids[0, : int(sampled[-1]) + 1].tolist()


def _snippets(card: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", card, re.DOTALL)


def _run_snippet(folder: Path) -> dict:
    """Run the first Python snippet of the folder's card (plain transformers / PEFT); its namespace."""
    namespace: dict = {}
    exec(_snippets((folder / "README.md").read_text())[0], namespace)
    return namespace


def _front_matter(card: str) -> dict:
    return yaml.safe_load(re.match(r"---\n(.*?)\n---\n", card, re.DOTALL).group(1))


def _logged(run_dir: Path, step: int) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if r["step"] == step and "eval/greedy/reward/mean" in r)


def _eval_team(out: Path, capsys, *args: str) -> dict:
    capsys.readouterr()
    assert cli_main(["eval", "--team", str(out), *args]) == 0
    return json.loads(capsys.readouterr().out)


def _check_agent(run_dir: Path, out: Path, role: str, atol: float = 2e-5, actor=None) -> torch.Tensor:
    """The card's snippet completes the card's prompt as the trained policy (`actor`, else loaded from the
    run) does, with its logits (returned)."""
    namespace = _run_snippet(out / role)
    team = json.loads((out / "team.json").read_text())
    example = team["models"][role]["example"]
    actor = actor or _trained_actor(run_dir, role)
    gen = actor.generate([example["prompt"]], greedy=True)
    assert namespace["inputs"]["input_ids"][0].tolist() == gen.prompt_ids[0].tolist() == example["prompt_ids"]
    assert namespace["completion_ids"] == _written(gen) == example["completion_ids"]
    assert len(example["completion_ids"]) > 0
    ids = torch.tensor([example["prompt_ids"] + example["completion_ids"]])
    with torch.no_grad():
        exported = namespace["model"](ids).logits
        trained = actor.policy.model(ids).logits
    torch.testing.assert_close(exported, trained, atol=atol, rtol=1e-4)
    return exported


# ---- adapters, merged folders, the joint actor ---------------------------------------------------------
def test_adapters_load_with_peft_on_the_exported_base_and_complete_like_the_trained_policy(lora_run, tmp_path):
    out = export_run(lora_run, tmp_path / "team")
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "bases",
        "elaboration",
        "summary",
        "team.json",
        "training_config.json",
    ]
    for role in ("summary", "elaboration"):
        files = {p.name for p in (out / role).iterdir()}
        assert {"adapter_config.json", "adapter_model.safetensors", "generation_config.json", "README.md"} <= files
        assert "model.safetensors" not in files and "tokenizer.json" in files
        adapter = json.loads((out / role / "adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == str((out / "bases" / "tiny-gpt2").resolve())
        assert adapter["r"] == 4 and adapter["fan_in_fan_out"] is True  # GPT-2's Conv1D weights are (in, out)
        exported = _check_agent(lora_run, out, role)
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(out / "bases" / "tiny-gpt2")
        example = json.loads((out / "team.json").read_text())["models"][role]["example"]
        with torch.no_grad():
            untrained = base(torch.tensor([example["prompt_ids"] + example["completion_ids"]])).logits
        assert (exported - untrained).abs().max() > 1e-2  # the adapter is in the snippet's model
    settings = json.loads((out / "summary" / "generation_config.json").read_text())
    assert settings["max_new_tokens"] == 8 and settings["eos_token_id"] == [2] and settings["top_k"] == 0
    allowed = {2} | {b + 3 for b in b"abc "}  # the byte tokenizer's ids of the allowed outputs, and EOS
    assert set(range(259)) - set(settings["suppress_tokens"]) == allowed


def test_merged_folders_load_with_plain_transformers_and_complete_like_the_trained_policy(lora_run, tmp_path):
    out = export_run(lora_run, tmp_path / "team", lora="merge")
    assert not (out / "bases").exists()  # a merged model needs no base
    for role in ("summary", "elaboration"):
        files = {p.name for p in (out / role).iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= files
        assert "adapter_config.json" not in files
        _check_agent(lora_run, out, role)
        assert _front_matter((out / role / "README.md").read_text())["library_name"] == "transformers"


def test_the_joint_actors_structured_completion_is_reproduced_by_its_cards_snippet(
    joint_run, chat_model, tmp_path, capsys
):
    out = export_run(joint_run, tmp_path / "team")
    team = json.loads((out / "team.json").read_text())
    assert team["mode"] == "centralized" and list(team["models"]) == ["joint"]
    assert team["roles"] == {
        r: {"model": "joint", "folder": "joint", "kind": "merged", "base": str(chat_model.resolve())}
        for r in ("summary", "elaboration")
    }
    joint = team["models"]["joint"]["joint"]
    assert joint["format"] == "structured" and joint["section_tokens"] == {"summary": 6, "elaboration": 6}
    card = (out / "joint" / "README.md").read_text()
    assert joint["layout"][0] == {"prompt": "{task of summary}"}  # a chat prompt: one conversation, no tags
    assert [part.get("sampled") for part in joint["layout"]] == [None, "summary", None, "elaboration"]
    assert "[user calm] {task of elaboration}" in joint["layout"][2]["forced"]  # the next user turn
    assert "  {task of summary}\n" in card and "the answer of `elaboration` (at most 6 tokens)" in card
    namespace = _run_snippet(out / "joint")
    example = team["models"]["joint"]["example"]
    actor = _trained_actor(joint_run, "joint")
    gen = actor.generate([actor.build_prompt(example["observations"])], greedy=True)
    assert namespace["completion"] == _written(gen) == example["completion_ids"]
    assert gen.texts[0] == example["completion"]
    model = team["models"]["joint"]
    assert model["prompt_format"] == {
        "style": "chat",
        "system_prompt": "Be brief.",
        "chat_template_kwargs": {"tone": "calm"},
    }
    assert model["chat_template"] == CHAT_TEMPLATE and (out / "joint" / "generation_config.json").is_file()
    text = bytes(i - 3 for i in example["prompt_ids"] if 3 <= i < 259).decode()  # the byte tokenizer's ids
    assert text.startswith("[system calm] Be brief.\n[user calm] ") and text.endswith("[assistant] ")
    assert "<task" not in text
    assert len(namespace["context"]) == len(example["prompt_ids"]) + len(example["completion_ids"])
    assert list(namespace["sections"]) == ["summary", "elaboration"]
    metrics = _eval_team(out, capsys)
    assert metrics["eval/greedy/reward/mean"] == _logged(joint_run, 2)["eval/greedy/reward/mean"]


# ---- textzoo eval --team --------------------------------------------------------------------------------
def test_eval_team_reproduces_the_runs_held_out_rewards_at_the_exported_step(lora_run, tmp_path, capsys):
    for step in (1, 2):
        logged = _logged(lora_run, step)
        out = export_run(lora_run, tmp_path / f"adapters-{step}", step=step)
        metrics = _eval_team(out, capsys)  # every held-out figure, greedy and sampled, to the last bit
        assert metrics == {k: v for k, v in logged.items() if k.startswith("eval/")}, step
    greedy = [_logged(lora_run, s)["eval/greedy/reward/mean"] for s in (0, 1, 2)]
    assert len(set(greedy)) > 1  # the figures moved while training: a step mix-up would show
    merged = export_run(lora_run, tmp_path / "merged", lora="merge")
    assert _eval_team(merged, capsys)["eval/greedy/reward/mean"] == _logged(lora_run, 2)["eval/greedy/reward/mean"]


def test_a_frozen_agent_is_referenced_by_its_base_and_the_team_still_evaluates_exactly(mixed_run, tmp_path, capsys):
    out = export_run(mixed_run, tmp_path / "team")
    team = json.loads((out / "team.json").read_text())
    assert team["roles"]["summary"] == {"model": "summary", "folder": "summary", "kind": "merged", "base": "tiny"}
    # a frozen tiny model exists only in the run: its base is written once, under bases/, and nothing else of it
    assert team["roles"]["elaboration"] == {
        "model": "elaboration",
        "folder": None,
        "kind": "frozen",
        "base": "bases/tiny-llama",
    }
    assert not (out / "elaboration").exists() and (out / "bases" / "tiny-llama" / "model.safetensors").is_file()
    _check_agent(mixed_run, out, "summary")
    metrics = _eval_team(out, capsys)
    assert metrics["eval/greedy/reward/mean"] == _logged(mixed_run, 2)["eval/greedy/reward/mean"]
    card = (out / "README.md").read_text()
    assert "| `elaboration` | `elaboration` | none | frozen: its base, `bases/tiny-llama` |" in card


# ---- cards and team.json ------------------------------------------------------------------------------
def test_cards_and_team_json_describe_the_run(lora_run, tmp_path):
    out = export_run(lora_run, tmp_path / "team", step=1)
    team = json.loads((out / "team.json").read_text())
    config = json.loads((out / "training_config.json").read_text())
    assert config == json.loads((ck.checkpoints_dir(lora_run) / ck.step_name(1) / "config.json").read_text())
    assert team["task"] == {"id": "textzoo/WritingRatio-v0", "kwargs": {}, "eval_kwargs": {"split": "eval"}}
    assert team["mode"] == "decentralized" and team["algo"] == "magrpo" and team["format"] == 1
    assert team["run"]["step"] == 1 and team["run"]["episodes"] == 1 * 2 * 2
    assert team["run"]["metrics"] == {k: v for k, v in _logged(lora_run, 1).items() if k.startswith("eval/")}
    provenance = [json.loads(line) for line in (lora_run / "provenance.jsonl").read_text().splitlines()]
    assert team["source_commit"] == provenance[0]["source_commit"] and team["textzoo_version"] == "0.1.0"
    assert team["run"]["commands"] == [provenance[0]["command"]]
    git = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"], capture_output=True, text=True)
    if git.returncode == 0:  # a git checkout: the commit (and "-dirty" with uncommitted changes) is recorded
        assert team["source_commit"].split("-")[0] == git.stdout.strip()
    summary = team["models"]["summary"]
    assert summary["prompt_format"] == {"style": "raw", "system_prompt": "", "chat_template_kwargs": {}}
    assert summary["chat_template"] is None and summary["lora"] == {
        "rank": 4,
        "alpha": 16.0,
        "target_modules": ["c_attn"],
        "vllm_max_lora_rank": 8,
    }
    card = (out / "summary" / "README.md").read_text()
    front = _front_matter(card)
    assert front["library_name"] == "peft" and front["pipeline_tag"] == "text-generation"
    assert {"textzoo", "reinforcement-learning", "magrpo", "lora", "writingratio-v0"} <= set(front["tags"])
    assert "base_model" not in front and "license" not in front  # a tiny model: on no hub, no license
    assert provenance[0]["command"] in card and "step 1 of 2: 4 episodes" in card
    greedy = _logged(lora_run, 1)["eval/greedy/reward/mean"]
    assert f"| `eval/greedy/reward/mean` | {greedy:.4f} |" in card
    for template in ("model_card.md", "team_card.md", "critic_card.md"):  # package data, not strings in code
        assert (Path(__file__).parents[1] / "textzoo" / "runners" / "templates" / template).is_file()


def test_a_run_written_before_the_config_sections_exports_through_the_migration(tmp_path, capsys):
    old = Path(__file__).parent / "data" / "old-layout-run"  # flat lora_* / engine_* fields, an old override
    out = export_run(old, tmp_path / "team")
    alphas = {
        r: json.loads((out / r / "adapter_config.json").read_text())["lora_alpha"] for r in ("summary", "elaboration")
    }
    assert alphas == {"summary": 8.0, "elaboration": 16.0}
    assert json.loads((out / "training_config.json").read_text())["agent"]["lora"]["rank"] == 2  # today's layout
    metrics, logged = _eval_team(out, capsys), _logged(old, 2)
    assert metrics.keys() == {k for k in logged if k.startswith("eval/")}  # the run evaluated greedy only
    assert all(metrics[k] == logged[k] for k in metrics)


def test_a_gguf_base_names_its_hub_id_and_license_from_the_files_metadata(smollm2_file):
    meta = gguf_metadata(smollm2_file)
    assert meta["general.architecture"] == "llama" and meta["general.license"] == "apache-2.0"
    base = describe_base(str(smollm2_file))
    assert (base.kind, base.hub_id, base.license) == ("gguf", "HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0")
    assert base.only_in_run and base.slug == "smollm2-135m-instruct"  # its dequantized weights go under bases/
    assert describe_base(str(smollm2_file), "me/other").hub_id == "me/other"
    hub = describe_base("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert (hub.kind, hub.hub_id, hub.load_path, hub.only_in_run) == ("hub", *[hub.setting] * 2, False)


def test_critics_are_exported_only_when_asked(tmp_path):
    agent = AgentConfig(max_new_tokens=4, lr=1e-2, allowed_outputs=WORDS)
    run = _train(tmp_path / "run", algo="iac", steps=1, save_every=0, eval_every=0, agent=agent)
    assert not (export_run(run, tmp_path / "plain") / "critics").exists()
    out = export_run(run, tmp_path / "with", with_critics=True)
    weights = ck.read_checkpoint(ck.latest_intact(run)[0]).weights
    for name in ("summary.critic", "elaboration.critic"):
        from safetensors.torch import load_file

        saved = load_file(out / "critics" / name / "critic.safetensors")
        assert saved.keys() == weights[name].keys() and all(torch.equal(saved[k], weights[name][k]) for k in saved)
        facts = json.loads((out / "critics" / name / "critic.json").read_text())
        assert facts["class"] == "textzoo.models.critic.Critic" and facts["trunk_model_type"] == "gpt2"
        assert "value-function" in _front_matter((out / "critics" / name / "README.md").read_text())["tags"]


# ---- errors, before anything is written -------------------------------------------------------------
def _nothing_beside(out: Path) -> None:
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*"))


def test_every_error_is_one_clear_line_before_anything_is_written(lora_run, mixed_run, tmp_path, capsys):
    out = tmp_path / "out"
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "file").write_text("not a folder")
    (empty / "config.json").write_text((lora_run / "config.json").read_text())
    cases = [
        ((empty, out), CheckpointError, "no verified checkpoint in"),
        ((tmp_path / "missing", out), CheckpointError, "does not exist"),
        ((lora_run, out, 7), CheckpointError, "no checkpoint of step 7; it has steps [1, 2]"),
        ((mixed_run, out, None, "merge"), ConfigError, "have none (lora.rank 0"),
        ((mixed_run, out, None, "adapters"), ConfigError, "summary has none (lora.rank 0"),
        ((lora_run, lora_run / "checkpoints" / "x"), ConfigError, "pick a folder outside it"),
        ((lora_run, tmp_path / "file" / "out"), ConfigError, "which is a file, not a folder"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            export_run(*args)
        _nothing_beside(out)
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "checkpoints").mkdir()
    for step in (1, 2):
        copy = damaged / "checkpoints" / ck.step_name(step)
        subprocess.run(["cp", "-r", str(ck.checkpoints_dir(lora_run) / ck.step_name(step)), str(copy)], check=True)
    (damaged / "checkpoints" / ck.step_name(2) / "weights-summary.safetensors").write_bytes(b"broken")
    with pytest.raises(CheckpointError, match="step 2 .* is damaged: .*weights-summary.safetensors has 6 bytes"):
        export_run(damaged, out, step=2)
    assert json.loads((export_run(damaged, out) / "team.json").read_text())["run"]["step"] == 1  # the newest intact
    before = (out / "team.json").read_text()
    with pytest.raises(ConfigError, match="already exists: pass --overwrite"):
        export_run(lora_run, out)
    assert (out / "team.json").read_text() == before
    assert json.loads((export_run(lora_run, out, overwrite=True) / "team.json").read_text())["run"]["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    # the command line: exit status 2 and one line naming the problem
    capsys.readouterr()
    assert cli_main(["export", str(lora_run), "--out", str(out)]) == 2
    assert cli_main(["export", str(lora_run), "--out", str(tmp_path / "x"), "--merge-lora", "--adapters"]) == 2
    assert cli_main(["export", str(lora_run), "--out", str(tmp_path / "x"), "--step", "9"]) == 2
    assert cli_main(["eval", "--team", str(tmp_path)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 4 and "holds no team.json: pass a folder written by textzoo export" in errors[3]
    assert (
        "already exists" in errors[0] and "exclude each other" in errors[1] and "no checkpoint of step 9" in errors[2]
    )
    assert not (tmp_path / "x").exists()


# ---- an export killed midway -----------------------------------------------------------------------------
KILLED = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import textzoo.runners.export as export

    written = export.save_adapter
    def blocked(policy, folder, base):  # write one adapter, say so, then hang until killed
        written(policy, folder, base)
        Path(sys.argv[3]).write_text(str(folder))
        time.sleep(600)
    export.save_adapter = blocked
    export.export_run(sys.argv[1], sys.argv[2], step=int(sys.argv[4]), overwrite=True)
    """
)


def _kill_midway(run_dir: Path, out: Path, step: int, marker: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(run_dir), str(out), str(marker), str(step)],
        env={**ENV, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 900  # a loaded machine takes minutes to import torch, transformers and peft
    while not marker.exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline
        time.sleep(0.05)
    staging = Path(marker.read_text()).parent
    assert staging.name.startswith(f".{out.name}.export-") and (staging / "summary").is_dir()
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_a_killed_export_leaves_out_absent_or_whole(lora_run, tmp_path):
    out = tmp_path / "team"
    _kill_midway(lora_run, out, 2, tmp_path / "marker-1")
    assert not out.exists()  # absent: half of it lies in the hidden staging folder only
    export_run(lora_run, out, step=1)  # the next export clears what the killed one left
    whole = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert not list(tmp_path.glob(".team*"))
    _kill_midway(lora_run, out, 2, tmp_path / "marker-2")  # an --overwrite killed midway: the old export stays
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == whole
    assert json.loads((out / "team.json").read_text())["run"]["step"] == 1


# ---- the docs page ---------------------------------------------------------------------------------
def test_the_export_docs_page_runs_as_written(tmp_path, monkeypatch, capsys):
    """docs/how-to/export.md: its textzoo commands run, its Python blocks run in order (vLLM's compile)."""
    page = (Path(__file__).parents[1] / "docs" / "how-to" / "export.md").read_text()
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    blocks = re.findall(r"```(bash|python)\n(.*?)```", page, re.DOTALL)
    assert [lang for lang, _ in blocks].count("python") == 4
    for lang, code in blocks:
        if lang == "bash":
            for line in code.splitlines():
                if line.startswith("textzoo "):
                    assert cli_main(shlex.split(line)[1:]) == 0, line
        elif "vllm" in code:
            compile(code, "docs/how-to/export.md", "exec")
        else:
            exec(code, namespace)
    team = json.loads((tmp_path / "exported" / "writing" / "team.json").read_text())
    assert team["roles"]["summary"]["kind"] == "adapter" and team["run"]["step"] == 2
    greedy = _logged(tmp_path / "runs" / "writing", 2)["eval/greedy/reward/mean"]
    printed = capsys.readouterr()
    assert "(the same)" in printed.err and printed.out.splitlines()[-1] == str(greedy)  # eval --team, Python's
    assert namespace["team"].step == 2 and (tmp_path / "exported" / "summary-merged" / "model.safetensors").is_file()
    assert team["run"]["metrics"]["eval/greedy/reward/mean"] == greedy


# ---- the real model ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_run(smollm2, tmp_path_factory) -> Path:
    """One LoRA step of SmolLM2-135M-Instruct (chat template) on Writing-v0, one held-out prompt."""
    agent = AgentConfig(model=str(smollm2), max_new_tokens=6, lora=LoRAConfig(rank=4), lr=1e-3, precision="fp32")
    fields = dict(steps=1, batch_prompts=1, group_size=2, eval_prompts=1, eval_every=0, save_every=0)
    fields["eval_modes"] = ("greedy",)
    return _train(tmp_path_factory.mktemp("smollm2") / "run", agent=agent, **fields)


def test_smollm2_adapters_and_merged_folders_complete_like_the_trained_policy(smollm2_run, smollm2, tmp_path):
    ids = {str(smollm2): "HuggingFaceTB/SmolLM2-135M-Instruct"}
    out = export_run(smollm2_run, tmp_path / "adapters", base_model_ids=ids)
    adapter = json.loads((out / "summary" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(smollm2.resolve()) and not (out / "bases").exists()
    front = _front_matter((out / "summary" / "README.md").read_text())
    assert front["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and front["base_model_relation"] == "adapter"
    team = json.loads((out / "team.json").read_text())
    assert team["models"]["summary"]["prompt_format"]["style"] == "chat"
    assert team["models"]["summary"]["chat_template"].startswith("{% for message in messages %}")
    actor = _trained_actor(smollm2_run, "summary")
    _check_agent(smollm2_run, out, "summary", atol=1e-3, actor=actor)  # 30 layers: another code path's float error
    merged = export_run(smollm2_run, tmp_path / "merged", lora="merge")
    assert (
        "chat_template" in (merged / "summary" / "tokenizer_config.json").read_text()
        or (merged / "summary" / "chat_template.jinja").is_file()
    )
    _check_agent(smollm2_run, merged, "summary", atol=1e-3, actor=actor)


def test_vllm_serves_an_exported_adapter_as_a_lora_module_with_the_same_greedy_completion(smollm2_run, tmp_path):
    features.vllm()
    out = export_run(smollm2_run, tmp_path / "team")
    example = json.loads((out / "team.json").read_text())["models"]["elaboration"]["example"]
    snippet = _snippets((out / "elaboration" / "README.md").read_text())[1]  # the card's vLLM snippet, as written
    assert "LoRARequest" in snippet
    script = snippet + "\nimport json, sys\nprint('COMPLETION', json.dumps(completion_ids), file=sys.stderr)\n"
    env = {**ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stderr.splitlines() if line.startswith("COMPLETION ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    assert json.loads(lines[-1].split(" ", 1)[1]) == example["completion_ids"]
