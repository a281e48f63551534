"""The vLLM server backend (``rollout_backend: vllm_server``): rollouts sampled by a vLLM OpenAI-compatible server on
other GPUs or machines (or one this backend starts), the adapter hot-loaded before each rollout (docs/vllm.md, "A
vLLM server on other GPUs").

Before each rollout rank 0 writes the adapter once (PEFT format) under a new name to a folder the server reads, loads
it with ``/v1/load_lora_adapter`` and unloads the one before; the other ranks wait for that name. Every rank sends its
own prompts as token ids to ``/v1/completions``, one request per prompt with its G samples, many in flight, with a
seed of its own; the sampled tokens' processed log-probs become the rollout's behaviour log-probs, and the top ``K``
processed log-probs of each position its kept set (:mod:`~lightning_grpo.backends.vllm.truncation`).
"""

from __future__ import annotations

import atexit
import random
import shutil
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from peft import PeftModel
from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.backends.protocol import BackendSpec
from lightning_grpo.backends.vllm.settings import VLLMConfig, engine_lora_rank
from lightning_grpo.backends.vllm.truncation import check_truncation, kept_margins, logprobs_needed, max_logprobs
from lightning_grpo.backends.vllm_server.process import (
    ServerError,
    ServerProcess,
    free_port,
    get_json,
    post_json,
    server_environment,
)
from lightning_grpo.backends.vllm_server.settings import VLLMServerConfig, serve_command, start_hint
from lightning_grpo.distributed import full_adapter_state_dict, is_sharded
from lightning_grpo.rank_failures import agreed
from lightning_grpo.rollout.sampling_settings import Sampled, SampleRequest, SamplingSettings, eos_token_ids

__all__ = ["VLLMServerBackend", "VLLMServerSession"]

_SEEDS = 2**62  # per-request seeds below this, so that seed + (G - 1) stays a valid int64 for vLLM
_JSON_NEG_INF = -9999.0  # vLLM's OpenAI server writes a log-prob of -inf as this (JSON has no infinity)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _from_rank_zero(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (itself without ``torch.distributed``)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _outcome_of_rank_zero(work: Callable[[], str]) -> str:
    """What ``work()`` returns on rank 0 (run there only), on every rank; its failure raised on every rank, so no
    rank waits forever for a rank 0 that failed.

    Raises:
        ServerError: ``work`` raised a :class:`ServerError` or ``ValueError`` on rank 0 (re-raised as it was there).
    """
    outcome: tuple[str, str] = ("", "")
    if _rank() == 0:
        try:
            outcome = ("ok", work())
        except (ServerError, ValueError) as error:
            if not (dist.is_available() and dist.is_initialized()):
                raise
            outcome = ("error", str(error))
    kind, text = _from_rank_zero(outcome)
    if kind == "error":
        raise agreed(ServerError(text if _rank() == 0 else f"rank 0 failed: {text}"))
    return text


def _read_logprobs(block: dict[str, Any], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A completion's log-probs from the server's answer: ``(n,)`` the sampled tokens' and ``(n, k)`` the ``k``
    largest of each position, largest first, ``-inf`` outside the kept set (the server's -9999.0)."""
    sampled = torch.tensor(block["token_logprobs"], dtype=torch.float32)
    top = torch.full((len(sampled), k), -torch.inf)
    for position, entries in enumerate((block["top_logprobs"] or []) if k else []):
        values = sorted(entries.values(), reverse=True)[:k]  # the sampled token's is one more when not in the top k
        top[position, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return sampled, top.masked_fill(top <= _JSON_NEG_INF, -torch.inf)


class VLLMServerSession:
    """One rollout sampled by the server with the adapter synced when the session was opened.

    It holds no reference to the policy, and draws its seeds from its own generator (seeded from torch's, which
    the step seeds, when it was opened), so it may sample in a background thread while the policy is updated.

    Args:
        backend: The backend (its URL, settings, and the adapter's use count).
        adapter: The name of the adapter it samples with.
        seed: Seeds its per-request seeds.
    """

    def __init__(self, backend: VLLMServerBackend, adapter: str, seed: int) -> None:
        self.backend, self.adapter, self._seeds = backend, adapter, random.Random(seed)
        self.url, self.config = backend.url, backend.config
        self._open = True

    def sample(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, request: SampleRequest) -> Sampled:
        """``(R*G, P+T)`` prompt and sampled tokens, G consecutive rows per prompt, each token's log-prob and, when
        the settings truncate, its kept set as a margin.

        ``model`` and ``request.rows`` are not used (the server holds the synced adapter). Prompt ``i`` of the call
        is one request with ``n = G`` and seed ``s + i*G``; vLLM seeds its ``j``-th sample ``s + i*G + j``, so no two
        samples of the call share a seed, copies of one prompt included (``s`` is new for every call).

        Raises:
            SettingError: top-p below 1 without top-k (its kept set cannot be recorded).
        """
        prompt_ids, prompt_mask, settings = request.prompt_ids, request.prompt_mask, request.settings
        g, k = settings.num_generations, logprobs_needed(settings, "vllm_server")
        body = self._body(settings, tokenizer, k)
        base = self._seeds.randrange(_SEEDS - len(prompt_ids) * g)
        prompts = [row[mask.bool()].tolist() for row, mask in zip(prompt_ids, prompt_mask, strict=True)]
        bodies = [{**body, "prompt": ids, "seed": base + i * g} for i, ids in enumerate(prompts)]
        workers = min(len(bodies), self.config.max_concurrent_requests)
        with ThreadPoolExecutor(max_workers=max(workers, 1), thread_name_prefix="vllm-server") as pool:
            answers = list(pool.map(self._complete, bodies))
        completions = [c for answer in answers for c in sorted(answer["choices"], key=lambda c: c["index"])]
        width = max(1, *(len(c["token_ids"]) for c in completions))
        tokens = torch.full((len(completions), width), tokenizer.pad_token_id, dtype=torch.long)
        logprobs = torch.zeros(tokens.shape, dtype=torch.float32)
        margins = torch.zeros(tokens.shape, dtype=torch.float32) if settings.truncates else None
        for i, completion in enumerate(completions):
            ids = completion["token_ids"]
            tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            logprobs[i, : len(ids)], top = _read_logprobs(completion["logprobs"], k)
            if margins is not None:
                margins[i, : len(ids)] = kept_margins(logprobs[i, : len(ids)], top, settings)
        device = prompt_ids.device
        sequences = torch.cat([prompt_ids.repeat_interleave(g, dim=0), tokens.to(device)], dim=1)
        return Sampled(sequences, logprobs.to(device), None if margins is None else margins.to(device))

    def _body(self, settings: SamplingSettings, tokenizer: PreTrainedTokenizerBase, logprobs: int) -> dict[str, Any]:
        """The request's settings: those of the colocated engine, every knob set so no server default changes a
        draw; the sampled tokens' ids and log-probs returned, with the top ``logprobs`` of each position (keyed by
        token id, so that no two tokens that decode alike share an entry)."""
        return {
            "model": self.adapter,
            "n": settings.num_generations,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "top_k": settings.top_k or -1,
            "min_p": settings.min_p,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "max_tokens": settings.max_new_tokens,
            "min_tokens": settings.min_new_tokens,
            "stop_token_ids": eos_token_ids(tokenizer).tolist(),
            "ignore_eos": True,
            "logprobs": logprobs,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return post_json(
                f"{self.url}/v1/completions",
                body,
                self.config.request_timeout_s,
                what=f"a completion request (adapter {self.adapter!r})",
            )
        except ServerError as error:
            if "logprobs" not in str(error) or "max allowed" not in str(error):
                raise
            raise ServerError(
                f"{error} (the backend asks for the top {body['logprobs']} processed log-probs of every token, "
                f"sampling.top_k, to record the kept set: start the server with --max-logprobs {body['logprobs']} "
                "or more; docs/vllm.md, Truncated sampling)"
            ) from None

    def close(self) -> None:
        """Give the adapter back (the backend unloads a replaced adapter once no session samples with it)."""
        if self._open:
            self._open = False
            self.backend._done_with(self.adapter)


class VLLMServerBackend:
    """Rollouts sampled by a vLLM server (``rollout_backend: vllm_server``): a running one at ``url``, or one this
    backend starts (``start: true``).

    Args:
        settings: Its :class:`~lightning_grpo.backends.vllm_server.settings.VLLMServerConfig`
            (``grpo.backend.rollout_backend_args``).
        spec: What it samples for (:class:`BackendSpec`: the model's name for ``start: true``, the LoRA rank, the
            lengths).
    """

    settings_class: ClassVar[type | None] = VLLMServerConfig
    supported_settings: ClassVar[frozenset[str]] = frozenset({"top_p", "top_k", "min_p", "drop_finished"})
    keeps_turn_cache: ClassVar[bool] = False
    records_logprobs: ClassVar[bool] = True
    #: Its sampling runs outside the trainer process from the adapter synced by the last ``sync``, so a session may
    #: sample (in a background thread) while the policy is updated.
    samples_apart: ClassVar[bool] = True
    turn_cache_instead: ClassVar[str] = (
        "it sends each turn's whole context, and the server's prefix cache reuses the KV blocks of the turns before"
    )

    def __init__(self, settings: VLLMServerConfig | None, spec: BackendSpec) -> None:
        check_truncation(spec.grpo.sampling.top_p, spec.grpo.sampling.top_k, "vllm_server")
        if settings is None:
            raise ValueError(
                "rollout_backend='vllm_server' needs rollout_backend_args: url (a running vLLM server, e.g. "
                "{url: 'http://127.0.0.1:8000'}) or start: true (docs/vllm.md, A vLLM server on other GPUs)"
            )
        self.config, self.model_name = settings, spec.model_name
        self.lora_rank = engine_lora_rank(VLLMConfig(max_lora_rank=settings.max_lora_rank), spec.policy.lora_r)
        sampling = spec.grpo.sampling
        self.max_model_len = settings.max_model_len or sampling.max_prompt_length + sampling.max_new_tokens
        self.max_logprobs = max_logprobs(sampling.top_k)  # the server's --max-logprobs (start: true)
        self.url: str | None = settings.url
        self.server: ServerProcess | None = None
        self.adapter: str | None = None
        self.synced_version: int | None = None
        self.adapter_root: Path | None = None
        self._in_use: Counter[str] = Counter()
        self._retired: list[str] = []
        self._lock = threading.Lock()
        self._started = False
        self.run_id = uuid.uuid4().hex[:8]  # names this run's adapters on a server others may share

    def start(self, policy: PeftModel, seed: int, *, sharded: bool) -> None:
        """Start the server (``start: true``, rank 0) or check the one at ``url`` answers; later calls do nothing.

        Raises:
            ServerError: The server is unreachable (the message names the URL and the command that starts one), or
                the started one failed (the message holds its output).
            ValueError: ``start: true`` for a policy given as an object (no model name to serve).
        """
        if self._started:
            return
        self._started = True
        atexit.register(self.close)
        if self.config.start:
            self.url = _outcome_of_rank_zero(lambda: self._start_server(policy, seed))
        hint = start_hint(
            self.model_name, lora_rank=self.lora_rank, max_model_len=self.max_model_len, max_logprobs=self.max_logprobs
        )
        get_json(
            f"{self.url}/v1/models",
            min(30.0, self.config.request_timeout_s),
            what="the start-up check (GET /v1/models)",
            hint=hint,
        )
        if _rank() == 0:
            root = self.config.adapter_dir
            if root is not None:
                Path(root).mkdir(parents=True, exist_ok=True)
            self.adapter_root = Path(tempfile.mkdtemp(prefix="lightning-grpo-adapters-", dir=root))

    def _start_server(self, policy: PeftModel, seed: int) -> str:
        if self.model_name is None:
            raise ValueError(
                "rollout_backend_args.start: true serves the run's model by its hub id or folder, but the policy was "
                "given as an object: give GRPOModule the model's name or folder, or start a server yourself and set "
                "rollout_backend_args.url (docs/vllm.md, A vLLM server on other GPUs)"
            )
        config, port = self.config, free_port()
        dtype = str(next(policy.get_base_model().parameters()).dtype).removeprefix("torch.")
        args = serve_command(
            self.model_name,
            port=port,
            lora_rank=self.lora_rank,
            max_model_len=self.max_model_len,
            dtype=dtype,
            seed=seed,
            max_logprobs=self.max_logprobs,
            extra_args=config.extra_args,
        )
        env = server_environment(cpu_kv_cache_gb=config.cpu_kv_cache_gb, cpu_threads=config.cpu_threads)
        self.server = ServerProcess(args, env)
        url = f"http://127.0.0.1:{port}"
        self.server.wait_ready(url, config.start_timeout_s)
        return url

    def sync(self, policy: PeftModel, version: int) -> None:
        """Make adapter ``version`` the one sampled: rank 0 writes and loads it, every rank then takes its name.

        Under FSDP2 the adapter is gathered whole first (a collective every rank reaches with the same version).

        Raises:
            ServerError: The server refused the adapter (vLLM's message) or is unreachable; raised on every rank.
        """
        if not self._started:
            raise RuntimeError("the vLLM server backend is not started: fit, validate, test and predict start it")
        if version == self.synced_version:
            return
        state = full_adapter_state_dict(policy) if is_sharded(policy) else None
        name = _outcome_of_rank_zero(lambda: self._load(policy, version, state))
        with self._lock:
            previous, self.adapter, self.synced_version = self.adapter, name, version
            if previous is not None:
                self._retired.append(previous)
        self._unload_retired()

    def _load(self, policy: PeftModel, version: int, state: dict[str, torch.Tensor] | None) -> str:
        assert self.adapter_root is not None
        name = f"lightning-grpo-{self.run_id}-v{version}"
        path = self.adapter_root / name
        policy.save_pretrained(str(path), state_dict=state)
        try:
            post_json(
                f"{self.url}/v1/load_lora_adapter",
                {"lora_name": name, "lora_path": str(path)},
                self.config.request_timeout_s,
                what=f"loading the adapter {name!r} from {path}",
                already_done=lambda message: f"'{name}' has already been loaded" in message,  # by the timed-out call
            )
        except ServerError as error:
            shutil.rmtree(path, ignore_errors=True)
            raise ServerError(
                f"{error} (the server must see {self.adapter_root}: rollout_backend_args.adapter_dir on a path both "
                "machines share; and run with --enable-lora, a --max-lora-rank of at least the policy's lora_r, and "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)"
            ) from None
        return name

    def _unload_retired(self) -> None:
        """Unload (rank 0) and delete the replaced adapters no session samples with any more."""
        with self._lock:
            done = [name for name in self._retired if self._in_use[name] == 0]
            self._retired = [name for name in self._retired if name not in done]
        for name in done:
            self._unload(name)

    def _unload(self, name: str) -> None:
        if _rank() != 0 or self.adapter_root is None:
            return
        post_json(
            f"{self.url}/v1/unload_lora_adapter",
            {"lora_name": name},
            self.config.request_timeout_s,
            what=f"unloading the adapter {name!r}",
            already_done=lambda message: f"'{name}' cannot be found" in message,  # unloaded by the timed-out call
        )
        shutil.rmtree(self.adapter_root / name, ignore_errors=True)

    def session(self, policy: PeftModel, settings: SamplingSettings) -> VLLMServerSession:
        """A session sampling with the adapter of the last :meth:`sync` (its seeds drawn from torch's generator)."""
        with self._lock:
            if self.adapter is None:
                raise RuntimeError("no adapter is loaded on the vLLM server yet: call sync(policy, version) first")
            self._in_use[self.adapter] += 1
            adapter = self.adapter
        return VLLMServerSession(self, adapter, int(torch.randint(0, 2**62, (1,))))

    def _done_with(self, adapter: str) -> None:
        with self._lock:
            self._in_use[adapter] -= 1
        self._unload_retired()

    def release(self) -> None:
        """Nothing to free in this process: the server keeps its memory."""

    def close(self) -> None:
        """Unload this run's adapter, remove its files, stop the server if this backend started it; safe twice."""
        atexit.unregister(self.close)
        loaded = [*self._retired, *([self.adapter] if self.adapter is not None else [])]
        self.adapter, self._retired, self._in_use = None, [], Counter()
        try:
            for name in loaded:
                self._unload(name)
        except ServerError:
            pass  # the server is gone: nothing is loaded any more
        finally:
            if self.adapter_root is not None:
                shutil.rmtree(self.adapter_root, ignore_errors=True)
            server, self.server = self.server, None
            if server is not None:
                server.close()
            self._started, self.synced_version, self.adapter_root = False, None, None
