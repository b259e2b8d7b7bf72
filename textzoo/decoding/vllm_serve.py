"""`textzoo serve-engine`: a vLLM OpenAI-compatible server with the settings textzoo's server engine needs.

`ServerProcess` starts ``python -m textzoo.decoding.vllm_serve`` (vLLM's own API server, `serve` below,
after one change) with:

- ``--logprobs-mode processed_logprobs``: a sampled token's log-prob is of the distribution it was drawn
  from (after temperature, top-k, top-p), as the in-process engine's;
- ``--enable-lora --max-loras N --max-lora-rank R`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` with
  ``lora=True``: LoRA agents' adapters are loaded at run time;
- ``VLLM_SERVER_DEV_MODE=1``: the routes a fully fine-tuned agent's weight sync uses (``/collective_rpc``
  ``reload_weights``, ``/reset_prefix_cache``, ``/update_weight_version``, ``/server_info``);
- ``--worker-extension-cls textzoo.decoding.vllm_worker.WeightSync``: a weight reload that keeps a tied LM
  head tied (vLLM's own leaves it on the old embedding);
- ``--distributed-executor-backend uni`` (one process for the engine, unless ``extra`` says otherwise),
  ``--enforce-eager`` on CPU, ``--host 127.0.0.1`` unless told otherwise;
- the API key through the environment (``VLLM_API_KEY``, never on the command line other users can read).

The one change: vLLM's ``--api-key`` guards only ``/v1``-style routes, so its development routes, which
replace the served weights, would answer anyone who reaches the port. The server textzoo starts guards
every route (``/health`` too) with the key. A server on another interface than loopback must have a key.

The server loads a model folder or hub id (``textzoo serve-engine`` converts a ``.gguf`` file to a temporary
folder first and serves it under the file's name).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import tyro

from textzoo.errors import ConfigError, EngineError

logger = logging.getLogger(__name__)


@dataclass
class ServeConfig:
    """What `textzoo serve-engine` starts (the CLI's flags)."""

    model: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="MODEL")]
    """A model folder, hub id or .gguf file (the agent's agent.model)."""
    port: int = 8000
    """The port to serve on (0: a free one)."""
    host: str = "127.0.0.1"
    """The interface to bind: loopback unless told otherwise (another one needs an API key)."""
    lora: bool = False
    """Serve LoRA adapters loaded at run time (a LoRA team's shared base)."""
    max_loras: int = 4
    """With lora: how many adapters one batch may use (a team's agents)."""
    max_lora_rank: int = 16
    """With lora: the largest adapter rank it accepts."""
    dtype: str = "auto"
    """The served weights' dtype (vLLM's --dtype: auto, float32, bfloat16, float16)."""
    max_model_len: int = 0
    """The longest prompt + completion it serves (0: the model's limit)."""
    kv_cache_gb: float = 1.0
    """KV-cache space in GiB (vLLM's --kv-cache-memory-bytes; 0: vLLM's own sizing)."""
    api_key: str = ""
    """The key every request must carry (else $TEXTZOO_ENGINE_API_KEY). Without one anyone who reaches the port
    may replace the served weights, so a server without a key binds loopback only."""
    extra: tyro.conf.Suppress[list[str]] = field(default_factory=list)
    """More vLLM server arguments, passed as they are (`textzoo serve-engine MODEL -- --tensor-parallel-size 2`)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError(f"serve-engine: --port must be in [0, 65535], got {self.port}")
        if self.max_loras < 1 or self.max_lora_rank < 1 or self.max_model_len < 0 or self.kv_cache_gb < 0:
            raise ConfigError(
                "serve-engine: --max-loras and --max-lora-rank must be >= 1, --max-model-len and --kv-cache-gb >= 0"
            )
        from textzoo.decoding.vllm_server import resolve_api_key

        self.api_key = resolve_api_key(self.api_key)
        if not self.api_key and not _loopback(self.host):
            raise ConfigError(
                f"serve-engine: --host {self.host} lets other machines reach the server, which then accepts new "
                "weights from anyone: give --api-key KEY (or $TEXTZOO_ENGINE_API_KEY), or bind 127.0.0.1"
            )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


class ServerProcess:
    """A vLLM server textzoo started (`ServeConfig`): its URL, readiness and stop."""

    def __init__(self, cfg: ServeConfig, log: Path | None = None, folder: str = ""):
        """Start the server (its output to ``log``, else to this process's stdout and stderr) on ``folder``, the
        model's weights (default ``cfg.model``), served under the name ``cfg.model``; `wait_ready` waits."""
        self.cfg = cfg
        port = cfg.port or _free_port(cfg.host)
        self.url = f"http://{cfg.host if ':' not in cfg.host else '[' + cfg.host + ']'}:{port}"
        model = folder or cfg.model
        argv = [sys.executable, "-m", "textzoo.decoding.vllm_serve", "--model", model, "--served-model-name", cfg.model]
        argv += ["--host", cfg.host, "--port", str(port), "--dtype", cfg.dtype]
        argv += ["--logprobs-mode", "processed_logprobs"]
        if "--worker-extension-cls" not in cfg.extra:  # textzoo_reload: a reload that keeps tied embeddings tied
            argv += ["--worker-extension-cls", "textzoo.decoding.vllm_worker.WeightSync"]
        if "--distributed-executor-backend" not in cfg.extra:
            argv += ["--distributed-executor-backend", "uni"]
        if cfg.max_model_len:
            argv += ["--max-model-len", str(cfg.max_model_len)]
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
        root = str(Path(__file__).resolve().parents[2])  # the server runs this textzoo, wherever it was imported from
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        if _cpu():
            argv.append("--enforce-eager")
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if cfg.kv_cache_gb:
            argv += ["--kv-cache-memory-bytes", str(int(cfg.kv_cache_gb * 2**30))]
        if cfg.lora:
            argv += ["--enable-lora", "--max-loras", str(cfg.max_loras), "--max-lora-rank", str(cfg.max_lora_rank)]
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        if cfg.api_key:
            env["VLLM_API_KEY"] = cfg.api_key
        else:
            env.pop("VLLM_API_KEY", None)
        argv += cfg.extra
        self.argv = argv
        self.log = log
        out = open(log, "ab") if log is not None else None
        try:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if out is not None:
                out.close()

    def wait_ready(self, timeout: float = 900.0) -> float:
        """Wait until the server answers ``/health``; the seconds it took. `EngineError` if it exits or times out."""
        start = time.monotonic()
        headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                where = f" (its log: {self.log})" if self.log else " (its messages are above)"
                raise EngineError(
                    f"the vLLM server for {self.cfg.model!r} exited with code {self.proc.returncode}{where}"
                )
            try:
                with urllib.request.urlopen(urllib.request.Request(self.url + "/health", headers=headers), timeout=5):
                    return time.monotonic() - start
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(1.0)
        self.stop()
        raise EngineError(f"the vLLM server for {self.cfg.model!r} did not answer at {self.url} within {timeout:g} s")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server (SIGTERM to its process group, SIGKILL after ``timeout``)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """Kill the server at once (SIGKILL to its process group), as a crash would."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


def serve() -> None:
    """vLLM's OpenAI API server (its own command line) with every route behind the API key (module docstring)."""
    from vllm.entrypoints.serve.middleware import authenticate

    authenticate.GUARDED_PREFIX = ("/",)
    from vllm.entrypoints.launchers.api_server.entry import main

    main()


if __name__ == "__main__":
    serve()
