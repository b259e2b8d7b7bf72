"""`VLLMServerEngine`: a `textzoo.decoding.engine.RolloutEngine` on a running vLLM OpenAI-compatible server.

``--agent.engine vllm-server --agent.engine-url URL`` samples from a server that another process runs
(``textzoo serve-engine MODEL``, `textzoo.decoding.vllm_serve`; or ``vllm serve``), on this machine or
another. The trainer needs no vLLM: it speaks HTTP (the standard library's ``urllib``) to:

- ``/v1/completions``: token ids in (``prompt`` a list of id lists, nothing re-tokenized), token ids out
  (``return_token_ids``), with the sampled tokens' log-probs (``logprobs=0``; the server is started with
  ``--logprobs-mode processed_logprobs``, so they are of the distribution each token was drawn from, as
  the in-process engine's). The sampling settings map onto the request as `VLLMEngine.params` maps them
  onto ``SamplingParams``. The trainer then scores every sampled completion itself (`EngineClient`).
- ``/v1/load_lora_adapter``: a LoRA agent's adapter, written to a folder the server can read (a private
  tmpfs folder, or ``agent.engine_sync_dir`` when the server runs on another machine), is loaded under
  a new name per weight version (``<agent>-<run>-v<version>``), and the previous version is unloaded;
  the server must allow it (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``, which ``serve-engine --lora`` sets).
- ``/collective_rpc`` (``textzoo_reload`` from a written folder, `textzoo.decoding.vllm_worker`),
  ``/reset_prefix_cache`` and ``/update_weight_version``: a fully fine-tuned agent's weights (vLLM's
  development-mode routes, ``VLLM_SERVER_DEV_MODE=1``, which ``serve-engine`` sets). A server holds one
  model's weights, so each fully fine-tuned agent needs its own server; LoRA agents of one base share one.

Every sync is verified: the server scores a fixed probe completion (prompt log-probs) and its per-token
log-probs must match the trainer's within the engine's precision (mean/max |Δ log p| 1e-3/1e-2 for a
float32 server, 0.1/0.5 for bf16 or fp16); a sync that did not take raises `EngineError`.

Faults: an unreachable server, a connection closed mid-request, a request past ``agent.engine_timeout_s``
and a refused API key each raise `EngineError` with the URL and what to do; the trainer's step fails
before anything is checkpointed (the last checkpoint stays whole) and ``--resume`` continues once the
server is back. A server restarted between steps (it forgot the adapters and weights it was given) is
noticed before the next rollout (`stale`) and given the current weights again.

The API key: ``agent.engine_api_key``, else the ``TEXTZOO_ENGINE_API_KEY`` environment variable, is sent
as ``Authorization: Bearer`` on every request.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import secrets
import shutil
import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from textzoo.decoding.engine import Completion, SamplingSettings
from textzoo.errors import EngineError

logger = logging.getLogger(__name__)

API_KEY_ENV = "TEXTZOO_ENGINE_API_KEY"
"""The environment variable the trainer reads the server's API key from when ``agent.engine_api_key`` is empty."""
PROBE_TEXT = "The quick brown fox jumps over the lazy dog, and the sea is calm tonight."
"""The fixed text a sync is verified on: its first tokens the prompt, the rest the scored completion."""
TOLERANCE = {"float32": (1e-3, 1e-2), "half": (0.1, 0.5)}
"""Per-token |Δ log p| (mean, max) a verified sync may leave: "float32" when the server and the trainer both
compute in float32, else "half" (measured on SmolLM2-135M: 7e-6 / 3e-5 float32 server against float32
trainer; 0.04 / 0.08 float32 server against a bf16-mixed trainer; bf16 engine 0.03 mean)."""


def resolve_api_key(api_key: str) -> str:
    """``api_key``, else ``$TEXTZOO_ENGINE_API_KEY``, else "" (no key sent)."""
    return api_key or os.environ.get(API_KEY_ENV, "")


class VLLMServerEngine:
    """A vLLM server's completions and weight routes as a rollout engine (module docstring)."""

    starts_with_weights = False
    """The server holds whatever it was started with or given last: the trainer gives it its weights first."""

    def __init__(
        self,
        url: str,
        api_key: str = "",
        timeout: float = 300.0,
        sync_dir: str = "",
        leader: bool = True,
        run_token: str | None = None,
    ):
        """``leader``: this process pushes weights (under data parallelism, replica 0; the others use the
        names it loaded). ``run_token``: the run's part of adapter names (equal on every replica)."""
        self.url = url.rstrip("/")
        self.api_key = resolve_api_key(api_key)
        self.timeout = timeout
        self.sync_dir = Path(sync_dir) if sync_dir else None
        self.leader = leader
        self.run_token = run_token or secrets.token_hex(4)
        self.lost = 0
        """How many times the server was found restarted (its weights and adapters gone) and given them again."""
        self._adapters: dict[str, str] = {}  # adapter key -> its served name
        self._adapter_dirs: dict[str, Path] = {}
        self._weights_tag: str | None = None  # the weight version tag the server holds (full weights)
        self._reload_method = "textzoo_reload"
        self._dtype: str | None = None
        models = self._call("GET", "/v1/models", what="a check that it serves a model")
        bases = [m["id"] for m in models.get("data", []) if not m.get("parent")]
        if not bases:
            raise EngineError(
                f"the vLLM server at {self.url} serves no model: start it with textzoo serve-engine MODEL"
            )
        self.model = bases[0]
        """The served base model's name (what requests without an adapter ask for)."""

    # ---- HTTP ---------------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None, timeout: float | None = None, what: str = "") -> Any:
        """One request; its JSON answer (its text when not JSON, None when empty). Every failure is an
        `EngineError` naming the URL."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        limit = timeout or self.timeout
        where = f"the vLLM server at {self.url}"
        again = "start it again (textzoo serve-engine MODEL), then continue the run with --resume RUN_DIR"
        try:
            with urllib.request.urlopen(request, timeout=limit) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as e:
            detail = _error_text(e)
            if e.code == 401:
                raise EngineError(
                    f"{where} refused the API key ({what or path}): give the key its --api-key was started with "
                    f"as agent.engine_api_key or ${API_KEY_ENV}"
                ) from None
            if e.code == 404 and "does not exist" in detail:
                raise EngineError(
                    f"{where} does not serve {body.get('model') if isinstance(body, dict) else '?'!r} ({detail}); "
                    f"a restarted server forgets its adapters: {again}"
                ) from None
            if e.code == 404 and path in ("/collective_rpc", "/reset_prefix_cache", "/update_weight_version"):
                raise EngineError(
                    f"{where} has no {path} route, which a fully fine-tuned agent's weight sync needs: start it with "
                    "VLLM_SERVER_DEV_MODE=1 (textzoo serve-engine sets it)"
                ) from None
            if e.code in (404, 405) and "lora_adapter" in path:
                raise EngineError(
                    f"{where} does not load LoRA adapters at run time ({detail}): start it with --lora "
                    "(textzoo serve-engine MODEL --lora; vLLM needs --enable-lora and "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)"
                ) from None
            raise EngineError(f"{where} answered {e.code} to {what or path}: {detail}") from None
        except TimeoutError as e:
            raise EngineError(
                f"{where} did not answer {what or path} within {limit:g} s (agent.engine_timeout_s): it is overloaded "
                f"or stuck; raise the timeout, or restart it and continue the run with --resume RUN_DIR ({e})"
            ) from None
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise EngineError(
                    f"{where} did not answer {what or path} within {limit:g} s (agent.engine_timeout_s): it is "
                    "overloaded or stuck; raise the timeout, or restart it and continue the run with --resume RUN_DIR"
                ) from None
            if isinstance(reason, ConnectionRefusedError):
                raise EngineError(f"no vLLM server answers at {self.url} (connection refused): {again}") from None
            raise EngineError(
                f"{where} failed during {what or path} ({type(reason).__name__}: {reason}); it stopped or crashed: "
                f"{again}"
            ) from None
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:  # a few routes answer plain text ("Success: ...")
            return raw.decode(errors="replace")

    # ---- sampling -----------------------------------------------------------------------------------
    def request(self, settings: SamplingSettings) -> dict[str, Any]:
        """The ``/v1/completions`` fields of ``settings`` (as `VLLMEngine.params` maps them)."""
        allowed = None
        if settings.allowed_tokens is not None:
            allowed = sorted({*settings.allowed_tokens, *settings.eos_ids})
        return {
            "n": 1,
            "max_tokens": settings.max_tokens,
            "temperature": 0.0 if settings.greedy else settings.temperature,
            "top_p": 1.0 if settings.greedy else settings.top_p,
            "top_k": -1 if settings.greedy or not settings.top_k else settings.top_k,
            "stop": list(settings.stop_strings) or None,
            "include_stop_str_in_output": True,
            "stop_token_ids": list(settings.eos_ids),
            "ignore_eos": True,
            "allowed_token_ids": allowed,
            "logprobs": 0,
            "skip_special_tokens": True,
            "return_token_ids": True,
        }

    def complete(
        self, prompts: Sequence[Sequence[int]], settings: SamplingSettings, adapter: Any = None
    ) -> list[Completion]:
        if not prompts:
            return []
        body = {"model": adapter or self.model, "prompt": [list(p) for p in prompts], **self.request(settings)}
        answer = self._call("POST", "/v1/completions", body, what=f"a rollout request of {len(prompts)} prompts")
        choices = sorted(answer["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompts):
            raise EngineError(f"the vLLM server at {self.url} answered {len(choices)} completions to {len(prompts)}")
        out = []
        for c in choices:
            ids = list(c.get("token_ids") or [])
            logprobs = [float(x) for x in (c.get("logprobs") or {}).get("token_logprobs") or []]
            if len(logprobs) != len(ids):
                raise EngineError(
                    f"the vLLM server at {self.url} sent {len(logprobs)} log-probs for {len(ids)} tokens: it must "
                    "return the sampled tokens' log-probs (a vLLM that supports return_token_ids and logprobs)"
                )
            out.append(Completion(ids, logprobs, c.get("text", ""), isinstance(c.get("stop_reason"), str)))
        return out

    def score(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], adapter: Any = None
    ) -> list[list[float]]:
        """The server's log-probs (temperature 1, every token allowed) of fixed ``completions`` after ``prompts``."""
        out = []
        for p, c in zip(prompts, completions):
            body = {"model": adapter or self.model, "prompt": [*p, *c], "max_tokens": 1, "prompt_logprobs": 0}
            answer = self._call("POST", "/v1/completions", body, what="a scoring request")
            steps = answer["choices"][0]["prompt_logprobs"]
            out.append([float(steps[len(p) + i][str(t)]["logprob"]) for i, t in enumerate(c)])
        return out

    def adapter(self, key: str) -> str:
        """The served name of adapter ``key``'s current version."""
        return self._adapters[key]

    # ---- weights ------------------------------------------------------------------------------------
    def _folder(self, prefix: str) -> Path:
        from textzoo.decoding.vllm_engine import _private_dir

        if self.sync_dir is None:
            return _private_dir(prefix)
        self.sync_dir.mkdir(parents=True, exist_ok=True)
        import tempfile

        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.sync_dir))

    def load_weights(self, state: dict[str, torch.Tensor] | torch.nn.Module, timeout: float, version: int = 0) -> None:
        """Give the server whole weights (a model's or a state dict): written as one safetensors file to a
        folder the server reads, reloaded in place (``reload_weights``), the prefix cache reset, the version
        tagged. Only the leader pushes."""
        if not self.leader:
            self._weights_tag = self._tag(version)
            return
        if isinstance(state, torch.nn.Module):
            state = state.state_dict()
        from safetensors.torch import save_file

        from textzoo.decoding.vllm_engine import untied

        folder = self._folder("textzoo-weights-")
        try:
            save_file(untied(state), str(folder / "model.safetensors"))
            self._reload(str(folder), timeout)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self._call("POST", "/reset_prefix_cache", {}, what="a prefix-cache reset")
        tag = self._tag(version)
        self._call("POST", "/update_weight_version", {"new_version": tag}, what="a weight version update")
        self._weights_tag = tag

    def _reload(self, folder: str, timeout: float) -> None:
        """``textzoo_reload`` (`textzoo.decoding.vllm_worker.WeightSync`, on servers `serve-engine` starts), else
        vLLM's own ``reload_weights`` (a tied LM head then keeps its old weights: the sync's check says so)."""
        rpc = {"method": self._reload_method, "kwargs": {"weights_path": folder}, "timeout": timeout}
        try:
            self._call("POST", "/collective_rpc", rpc, timeout=timeout, what="a weight reload")
        except EngineError as e:
            if self._reload_method != "textzoo_reload" or "textzoo_reload" not in str(e):
                raise
            logger.warning(
                "the vLLM server at %s has no textzoo_reload (not started by textzoo serve-engine): reloading with "
                "vLLM's reload_weights, which leaves a tied LM head on its old weights",
                self.url,
            )
            self._reload_method = "reload_weights"
            self._reload(folder, timeout)

    def update_adapter(self, key: str, view: Any, version: int, timeout: float) -> None:
        """Write LoRA adapter ``key`` (an `AdapterView`'s) to a new folder, load it under a new name, unload the
        previous version. Only the leader pushes; every replica then samples with the new name."""
        name = f"{key}-{self.run_token}-v{version}"
        old, old_dir = self._adapters.get(key), self._adapter_dirs.get(key)
        if self.leader:
            folder = self._folder(f"textzoo-lora-{key}-v{version}-")
            view.shared.model.save_pretrained(folder, selected_adapters=[view.adapter])
            path = folder / view.adapter if (folder / view.adapter).is_dir() else folder
            body = {"lora_name": name, "lora_path": str(path), "load_inplace": True}
            self._call("POST", "/v1/load_lora_adapter", body, timeout=timeout, what=f"loading adapter {name}")
            self._adapter_dirs[key] = folder
            if old is not None and old != name:
                self._unload(old)
            if old_dir is not None and old_dir != folder:
                shutil.rmtree(old_dir, ignore_errors=True)
        self._adapters[key] = name

    def _unload(self, name: str) -> None:
        try:
            self._call("POST", "/v1/unload_lora_adapter", {"lora_name": name}, what=f"unloading adapter {name}")
        except EngineError as e:  # a restarted server no longer has it: nothing to unload
            logger.info("adapter %s not unloaded: %s", name, e)

    def forget_weights(self) -> None:
        """Stop checking the weight version (`stale`): what was pushed last is not a trainer version (a LoRA base)."""
        self._weights_tag = None

    def _tag(self, version: int) -> str:
        return f"textzoo-{self.run_token}-v{version}"

    def stale(self) -> bool:
        """Whether the server lost what it was given (restarted since): an adapter name it no longer serves, or
        other weights than the version pushed last."""
        if self._adapters:
            served = {m["id"] for m in self._call("GET", "/v1/models", what="a check of its adapters").get("data", [])}
            if any(name not in served for name in self._adapters.values()):
                return True
        if self._weights_tag is not None:
            held = self._call("GET", "/weight_info", what="a check of its weight version")
            if held.get("weight_version") != self._weights_tag:
                return True
        return False

    def dtype(self) -> str:
        """The server's weight dtype, "float32" or "half" (bf16/fp16; also when the server does not say)."""
        if self._dtype is None:
            try:
                info = self._call("GET", "/server_info?config_format=json", what="a check of its settings")
                self._dtype = str(info["vllm_config"]["model_config"]["dtype"]).removeprefix("torch.")
            except (EngineError, KeyError, TypeError):
                self._dtype = "unknown"
        return "float32" if self._dtype == "float32" else "half"

    def verify(
        self,
        trainer: Callable[[list[int], list[int]], list[float]],
        tokenizer: Any,
        adapter: Any = None,
        trainer_half: bool = False,
    ) -> float:
        """Score the probe on the server and with ``trainer(prompt_ids, completion_ids)``; the mean |Δ log p|,
        or `EngineError` when it exceeds what the two precisions allow (the sync did not take): the float32
        tolerance when both compute in float32, else the half one (``trainer_half``: the trainer computes in
        bf16 or fp16)."""
        ids = list(tokenizer(PROBE_TEXT)["input_ids"])
        prompt, completion = ids[: len(ids) // 3], ids[len(ids) // 3 :]
        served = torch.tensor(self.score([prompt], [completion], adapter)[0])
        expected = torch.tensor(trainer(prompt, completion), dtype=served.dtype)
        gap = (served - expected).abs()
        precision = "half" if trainer_half else self.dtype()
        mean_tol, max_tol = TOLERANCE[precision]
        if float(gap.mean()) > mean_tol or float(gap.max()) > max_tol:
            raise EngineError(
                f"the vLLM server at {self.url} did not take the weights it was sent: on a fixed probe its log-probs "
                f"{'(adapter ' + str(adapter) + ') ' if adapter else ''}differ from the trainer's by "
                f"{float(gap.mean()):.3g} mean / {float(gap.max()):.3g} max per token ({precision} precision allows "
                f"{mean_tol:g} / {max_tol:g}); check that it serves the agent's model (textzoo serve-engine "
                "MODEL) and that no other run syncs weights to it"
            )
        return float(gap.mean())

    def close(self) -> None:
        """Unload this engine's adapters from the server (the leader) and delete its folders."""
        if self.leader:
            for name in self._adapters.values():
                try:
                    self._unload(name)
                except EngineError:
                    pass
        for folder in self._adapter_dirs.values():
            shutil.rmtree(folder, ignore_errors=True)
        self._adapters.clear()
        self._adapter_dirs.clear()


def _error_text(e: urllib.error.HTTPError) -> str:
    """The message of an error answer (vLLM's JSON ``error.message``, else the body's start)."""
    try:
        body = e.read().decode(errors="replace")
    except Exception:
        return str(e.reason)
    try:
        parsed = json.loads(body)
        err = parsed.get("error", parsed)
        return str(err.get("message", err) if isinstance(err, dict) else err)[:300]
    except (ValueError, AttributeError):
        return body[:300]
