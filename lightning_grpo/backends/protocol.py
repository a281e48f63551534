"""The interface of a rollout backend: what samples a GRPO run's rollouts, and its life within a fit.

A backend is a class constructed as ``Backend(settings, spec)``: ``settings`` an instance of its
:attr:`~RolloutBackend.settings_class` (``grpo.backend.rollout_backend_args``, checked key by key), ``spec`` the run's
:class:`BackendSpec`. Construction checks what can be checked before a fit and stays cheap; :meth:`~RolloutBackend.
start` does the heavy work. ``docs/backends.md`` walks through writing one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from peft import PeftModel

from lightning_grpo.config import GRPOConfig
from lightning_grpo.policy import PolicyConfig
from lightning_grpo.rollout.sampling_settings import SamplingSettings
from lightning_grpo.rollout.session import RolloutSession

__all__ = ["OPTIONAL_SETTINGS", "BackendSpec", "RolloutBackend", "RolloutSession"]

#: Settings a backend may not honour, with the value that needs nothing of it: a run that sets one to anything else
#: needs a backend that lists it in ``supported_settings`` (``policy.quantization``: a quantized base model).
OPTIONAL_SETTINGS: dict[str, Any] = {
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "sampler": "multinomial",
    "drop_finished": False,
    "static_cache": False,
    "decode": "auto",
    "sampling_adapter": "as_trained",
    "quantization": None,
}


@dataclass(frozen=True)
class BackendSpec:
    """What a backend learns of the run it samples for, at construction.

    Attributes:
        grpo: The algorithm settings (sampling settings, lengths, ``rollout_backend_args``).
        policy: The policy's settings (LoRA rank, quantization).
        model_name: The model's hub id or folder; ``None``: the policy was given as an object.
        generate_overridden: Whether the module's ``generate`` is a subclass's own (it may never call the backend).
        multi_turn: Whether a trajectory can be sampled in several calls (tools or an environment with
            ``grpo.agents.max_turns > 1``, or agent code); ``None``: unknown, taken to be ``grpo.agents.max_turns > 1``.
    """

    grpo: GRPOConfig
    policy: PolicyConfig
    model_name: str | None = None
    generate_overridden: bool = False
    multi_turn: bool | None = None

    def settings_in_use(self) -> dict[str, Any]:
        """The :data:`OPTIONAL_SETTINGS` this run sets to a value that needs the backend, by name (``"top_k"``)."""
        values = {name: getattr(self.grpo.sampling, name, default) for name, default in OPTIONAL_SETTINGS.items()}
        values["quantization"] = self.policy.quantization
        return {name: value for name, value in values.items() if value != OPTIONAL_SETTINGS[name]}


@runtime_checkable
class RolloutBackend(Protocol):
    """What samples rollouts: started at fit start, synced with the policy's weights, sampled through one
    :class:`RolloutSession` per rollout, released for the update, closed at the end of fit or on an exception.

    Attributes:
        settings_class: The dataclass of its settings (``grpo.backend.rollout_backend_args`` are its keyword arguments);
            ``None``: it takes none.
        supported_settings: The :data:`OPTIONAL_SETTINGS` it honours; a run that needs another is refused at set-up
            with an error naming the setting.
        samples_apart: Optional, read as ``getattr(cls, "samples_apart", False)`` (not a member ``isinstance``
            checks; ``hf`` and ``vllm`` leave it out: ``False``). ``True`` says that its sampling runs outside the
            trainer process, from the adapter the last :meth:`sync` sent (a server), so a session may run in a
            background thread while the main thread updates the policy (``GRPOConfig.backend.async_rollout``, one step
            ahead). Its ``session`` is then opened on the main thread (it may draw request seeds from torch's
            generators there), and the session's ``sample`` and ``close`` run in the background thread: they must
            use nothing the update changes (not the ``model`` argument, a stand-in there; not torch's global
            generators; no collective), and :meth:`release` must leave a running session alone. ``async_rollout``
            with a backend that does not declare it is refused at set-up.

    Example::

        class EchoBackend:  # samples with the policy itself, like the Hugging Face backend
            settings_class = None
            supported_settings = frozenset()
            def __init__(self, settings, spec): ...
            def start(self, policy, seed, *, sharded): ...
            def sync(self, policy, version): ...
            def session(self, policy, settings): return MySession(policy)
            def release(self): ...
            def close(self): ...
    """

    settings_class: ClassVar[type | None]
    supported_settings: ClassVar[frozenset[str]]

    def start(self, policy: PeftModel, seed: int, *, sharded: bool) -> None:
        """Build what sampling needs (an engine, a connection); called at fit start (and at the start of a validate,
        test or predict of its own), on every rank; idempotent."""
        ...

    def sync(self, policy: PeftModel, version: int) -> None:
        """Make the policy's current weights the ones sampled; ``version`` (the global step) names them, so a
        version already synced costs nothing. Under FSDP2 every rank calls it with the same version."""
        ...

    def session(self, policy: PeftModel, settings: SamplingSettings) -> RolloutSession:
        """Open the sampler of one rollout: every turn of it is sampled through the session, then it is closed."""
        ...

    def release(self) -> None:
        """Free memory for the policy update (the next :meth:`sync` or :meth:`session` takes it back)."""
        ...

    def close(self) -> None:
        """Shut down (no process or file left); called at the end of fit (and of a validate, test or predict of its
        own) and on an exception; safe to call twice."""
        ...


#: The members :func:`~lightning_grpo.backends.build.backend_class` checks a class for, in the protocol's order.
PROTOCOL_MEMBERS: tuple[str, ...] = (
    "settings_class",
    "supported_settings",
    "start",
    "sync",
    "session",
    "release",
    "close",
)
