"""A backend that samples apart from the trainer, as a server does, for tests and dry runs of ``async_rollout``.

:class:`FrozenCopyBackend` (``rollout_backend: lightning_grpo.testing.apart_backend.FrozenCopyBackend``) declares
``samples_apart = True``: at each :meth:`~FrozenCopyBackend.sync` it takes a frozen copy of the policy, and its
sessions sample from that copy only, with a ``torch.Generator`` of their own seeded from torch's when the session is
opened (as the ``vllm_server`` backend draws its request seeds), so a session can run in a background thread while
the policy is updated. It records every sync and sampling call (the version,
the thread, the prompts, a checksum of the adapter sampled with) for tests to read, and can sleep a scripted
``delay`` per sampling call to stand in for a server's sampling time (``benchmarks.async_rollout``'s dry run). It
honours top-k, top-p and min-p as a vLLM server does (:func:`truncate_as_vllm`), and records the log-probs over the
kept set and the kept set's margins, as every sampler does.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from lightning_grpo.rollout.sampling_settings import Sampled, SampleRequest, SamplingSettings, eos_token_ids

__all__ = ["FrozenCopyBackend", "FrozenCopySession", "FrozenCopySettings", "adapter_checksum", "truncate_as_vllm"]


@dataclass
class FrozenCopySettings:
    """Settings of :class:`FrozenCopyBackend` (``grpo.backend.rollout_backend_args``).

    Attributes:
        delay: Seconds each sampling call sleeps first (a server's sampling time, scripted); 0: none.
    """

    delay: float = 0.0


def adapter_checksum(model: nn.Module) -> float:
    """The sum of the LoRA weights of ``model``: which adapter it holds (float64, to tell two steps apart)."""
    return float(sum(p.detach().double().sum() for name, p in model.named_parameters() if "lora_" in name))


def truncate_as_vllm(z: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    """The scaled logits ``z`` ``(R, V)`` with ``-inf`` outside the kept set, truncated in vLLM's order and way:
    min-p (probability below ``min_p`` times the largest), then top-k (below the k-th largest), then top-p (the
    smallest tokens whose renormalised probabilities sum to at most ``1 - top_p``, the largest always kept)."""
    if settings.min_p > 0:
        probs = z.softmax(-1)
        z = z.masked_fill(probs < settings.min_p * probs.amax(-1, keepdim=True), -torch.inf)
    if 0 < settings.top_k < z.shape[-1]:
        z = z.masked_fill(z < z.topk(settings.top_k, -1).values[:, -1:], -torch.inf)
    if settings.top_p < 1.0:
        ascending, order = z.sort(-1)
        dropped = ascending.softmax(-1).cumsum(-1) <= 1 - settings.top_p
        dropped[:, -1] = False
        z = z.scatter(-1, order, ascending.masked_fill(dropped, -torch.inf))
    return z


def _margins(z: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """``z[token] - min(z[v] for v kept)`` per row (``inf`` where every token is kept)."""
    kept = torch.isfinite(z)
    lowest = torch.where(kept, z, torch.inf).amin(-1)
    margin = z.gather(-1, token[:, None]).squeeze(-1) - lowest
    return margin.masked_fill(kept.all(-1), torch.inf)


class FrozenCopySession:
    """One rollout sampled from the backend's frozen copy (no KV cache: a full forward per token; tiny models only).

    Args:
        backend: The backend (its records, its delay).
        model: The frozen copy synced last.
        version: The version it was synced at.
    """

    def __init__(self, backend: FrozenCopyBackend, model: nn.Module, version: int) -> None:
        self.backend, self.model, self.version = backend, model, version
        self.generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,))))  # as a server's seeds

    def sample(self, model: nn.Module, tokenizer: Any, request: SampleRequest) -> Sampled:
        """Sample ``settings.num_generations`` completions per prompt from the frozen copy (``model`` is ignored)."""
        prompts = tuple(tokenizer.batch_decode(request.prompt_ids, skip_special_tokens=True))
        self.backend.record("sample", self.version, prompts)
        if self.backend.settings.delay:
            time.sleep(self.backend.settings.delay)
        sampled = self._decode(tokenizer, request)
        self.backend.record("sampled", self.version, prompts)
        return sampled

    @torch.no_grad()
    def _decode(self, tokenizer: Any, request: SampleRequest) -> Sampled:
        ids, mask, settings = request.prompt_ids, request.prompt_mask, request.settings
        g, device = settings.num_generations, ids.device
        ids, mask = ids.repeat_interleave(g, 0), mask.repeat_interleave(g, 0)
        eos = torch.tensor(sorted(eos_token_ids(tokenizer)), device=device)
        finished = torch.zeros(len(ids), dtype=torch.bool, device=device)
        logprobs, margins = [], []
        for _ in range(settings.max_new_tokens):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].float()
            z = logits / settings.temperature
            z = truncate_as_vllm(z, settings) if settings.truncates else z
            logp = z.log_softmax(-1)
            token = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(-1)
            token = torch.where(finished, torch.full_like(token, tokenizer.pad_token_id or 0), token)
            logprobs.append(logp.gather(-1, token[:, None]).squeeze(-1))
            margins.append(_margins(z, token).masked_fill(finished, 0.0))
            ids = torch.cat([ids, token[:, None]], -1)
            mask = torch.cat([mask, (~finished).to(mask.dtype)[:, None]], -1)
            finished |= torch.isin(token, eos)
            if bool(finished.all()):
                break
        return Sampled(ids, torch.stack(logprobs, -1), torch.stack(margins, -1) if settings.truncates else None)

    def close(self) -> None:
        """Nothing to drop."""


class FrozenCopyBackend:
    """Samples from a frozen copy of the policy taken at each sync: a server's behaviour, in process.

    Args:
        settings: Its settings (``None``: the defaults).
        run: The run (unused).

    Attributes:
        events: ``(what, version, detail, thread name)`` of every call, in order (``"sync"``, ``"sample"``,
            ``"sampled"``, ``"close"``); ``detail`` is the adapter checksum for a sync, the prompts for a sample.
        checksums: The adapter checksum of each synced version.
    """

    settings_class: ClassVar[type | None] = FrozenCopySettings
    supported_settings: ClassVar[frozenset[str]] = frozenset({"top_p", "top_k", "min_p"})
    records_logprobs: ClassVar[bool] = True
    samples_apart: ClassVar[bool] = True

    def __init__(self, settings: FrozenCopySettings | None, spec: Any) -> None:
        self.settings = settings or FrozenCopySettings()
        self.seed, self.sessions, self.version = 0, 0, -1
        self.model: nn.Module | None = None
        self.events: list[tuple[str, int, Any, str]] = []
        self.checksums: dict[int, float] = {}
        self._lock = threading.Lock()

    def record(self, what: str, version: int, detail: Any = None) -> None:
        """Add an event (thread-safe)."""
        with self._lock:
            self.events.append((what, version, detail, threading.current_thread().name))

    def start(self, policy: nn.Module, seed: int, *, sharded: bool) -> None:
        """Keep the run's seed."""
        self.seed = seed

    def sync(self, policy: nn.Module, version: int) -> None:
        """Freeze a copy of the policy as version ``version`` (nothing if that version is the one held)."""
        if version == self.version and self.model is not None:
            return
        self.model = copy.deepcopy(policy).eval().requires_grad_(False)
        self.version = version
        self.checksums[version] = adapter_checksum(self.model)
        self.record("sync", version, self.checksums[version])

    def session(self, policy: nn.Module, settings: SamplingSettings) -> FrozenCopySession:
        """A session on the copy synced last."""
        if self.model is None:
            raise RuntimeError("FrozenCopyBackend.session before any sync")
        self.sessions += 1
        return FrozenCopySession(self, self.model, self.version)

    def release(self) -> None:
        """Nothing: the copy is apart from the update."""

    def close(self) -> None:
        """Drop the copy."""
        self.record("close", self.version)
        self.model = None
