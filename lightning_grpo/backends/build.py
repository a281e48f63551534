"""Choosing a rollout backend: a built-in name (``"hf"``, ``"vllm"``, ``"vllm_server"``) or a class's import path,
its settings checked key by key, and the run's settings it must honour (``docs/backends.md``).

Every error is a :class:`~lightning_grpo.settings_checks.SettingError` whose message starts with the setting it
refuses (``GRPOConfig.backend.rollout_backend=...``, ``GRPOConfig.backend.rollout_backend_args.<key>=...``,
``GRPOConfig.sampling.top_k=...``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from lightning_grpo.algorithms.catalogue import is_import_path
from lightning_grpo.algorithms.rollout_correction import behaviour_logprob_settings
from lightning_grpo.backends.hf import HFBackend
from lightning_grpo.backends.protocol import OPTIONAL_SETTINGS, PROTOCOL_MEMBERS, BackendSpec, RolloutBackend
from lightning_grpo.backends.vllm.backend import VLLMBackend
from lightning_grpo.backends.vllm.settings import VLLMConfig
from lightning_grpo.backends.vllm_server.backend import VLLMServerBackend
from lightning_grpo.settings_checks import SettingError

__all__ = [
    "BACKENDS",
    "backend_class",
    "backend_settings",
    "build_backend",
    "check_async_rollout",
    "check_behaviour_logprobs",
]

#: The built-in backends by name.
BACKENDS: dict[str, type] = {"hf": HFBackend, "vllm": VLLMBackend, "vllm_server": VLLMServerBackend}
_FIELD = "GRPOConfig.backend.rollout_backend"
_FIX = (
    "choose 'hf', 'vllm', 'vllm_server' or the import path of a RolloutBackend class such as "
    "'my_project.backends.MyBackend'"
)


def backend_class(name: str) -> type:
    """The backend class ``name`` chooses: a built-in name or ``"package.module.Class"``.

    Raises:
        SettingError: ``name`` is neither, its module or class does not import, or the class misses a member of
            :class:`~lightning_grpo.backends.protocol.RolloutBackend` (the message names them).
    """
    if name in BACKENDS:
        return BACKENDS[name]
    if not is_import_path(name):
        raise SettingError(f"{_FIELD}={name!r}: not a backend name or an import path; {_FIX}", _FIELD, name)
    module_name, attribute = name.rsplit(".", 1)
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise SettingError(f"{_FIELD}={name!r}: cannot import it ({error}); {_FIX}", _FIELD, name) from None
    if not isinstance(found, type):
        kind = type(found).__name__
        raise SettingError(f"{_FIELD}={name!r}: a backend is a class, got a {kind}; {_FIX}", _FIELD, name)
    missing = [member for member in PROTOCOL_MEMBERS if not hasattr(found, member)]
    if missing:
        raise SettingError(
            f"{_FIELD}={name!r}: {found.__qualname__} is not a RolloutBackend: it lacks {', '.join(missing)} "
            "(docs/backends.md lists the protocol: settings_class, supported_settings, start, sync, session, "
            "release, close)",
            _FIELD,
            name,
        )
    return found


def backend_settings(cls: type, args: Mapping[str, Any] | None, name: str) -> Any:
    """``cls.settings_class(**args)``, or ``None`` for a backend without settings (then ``args`` must be empty).

    Raises:
        SettingError: A key of ``args`` is not a field of the settings class (the message lists the allowed keys),
            or the backend takes no settings.
    """
    args, settings_class = dict(args or {}), cls.settings_class
    if settings_class is None:
        if args:
            raise SettingError(
                f"GRPOConfig.backend.rollout_backend_args={args!r}: the rollout backend {name!r} takes no settings; "
                "remove rollout_backend_args",
                "GRPOConfig.backend.rollout_backend_args",
                args,
            )
        return None
    allowed = [f.name for f in fields(settings_class)] if is_dataclass(settings_class) else None
    for key in args:
        if allowed is not None and key not in allowed:
            setting = f"GRPOConfig.backend.rollout_backend_args.{key}"
            raise SettingError(
                f"{setting}={args[key]!r}: not a setting of the rollout backend {name!r} "
                f"({settings_class.__name__}); allowed keys: {', '.join(allowed) or 'none'}",
                setting,
                args[key],
            )
    return settings_class(**args)


def check_supported(cls: type, spec: BackendSpec, name: str) -> None:
    """Refuse a run that sets an :data:`~lightning_grpo.backends.protocol.OPTIONAL_SETTINGS` entry the backend does
    not list in ``supported_settings``.

    Raises:
        SettingError: Names the first such setting, its value and the backend.
    """
    for setting, value in spec.settings_in_use().items():
        if setting not in cls.supported_settings:
            owner = "PolicyConfig" if setting == "quantization" else "GRPOConfig.sampling"
            default = OPTIONAL_SETTINGS[setting]
            raise SettingError(
                f"{owner}.{setting}={value!r}: the rollout backend {name!r} does not honour {setting} (it supports "
                f"{', '.join(sorted(cls.supported_settings)) or 'none of the optional settings'}); set {setting} to "
                f"{default!r} or choose a backend that supports it",
                f"{owner}.{setting}",
                value,
            )


def check_turn_cache(cls: type, spec: BackendSpec, name: str) -> None:
    """Refuse ``GRPOConfig.agents.turn_cache`` set to anything but ``None``/``True``/``False``, or ``True`` with a
    backend that cannot keep a trajectory's KV cache across turns (its ``keeps_turn_cache`` is not true).

    Raises:
        SettingError: Names the value, the backend and what the backend does instead.
    """
    value = spec.grpo.agents.turn_cache
    if not (value is None or isinstance(value, bool)):
        raise SettingError(
            f"GRPOConfig.agents.turn_cache={value!r} is not valid; choose one of None (auto), True, False",
            "GRPOConfig.agents.turn_cache",
            value,
        )
    if value is True and not getattr(cls, "keeps_turn_cache", False):
        instead = getattr(cls, "turn_cache_instead", "it samples each turn from the turn's whole context")
        raise SettingError(
            f"GRPOConfig.agents.turn_cache=True: the rollout backend {name!r} does not keep a trajectory's KV cache "
            f"across agent turns ({instead}); set turn_cache to None (auto) or False, or use rollout_backend: hf",
            "GRPOConfig.agents.turn_cache",
            value,
        )


def check_behaviour_logprobs(cls: type, spec: BackendSpec, name: str) -> None:
    """Refuse a rollout correction or rejection with a backend that does not record the sampler's
    log-probs (its ``records_logprobs`` is not true): the correction would have nothing to compare with.

    A ``generate`` override may fill ``Rollout.logprobs`` itself; it is checked at the first loss instead.

    Raises:
        SettingError: Names the first such setting, the backend and the setting that provides the log-probs.
    """
    needs = behaviour_logprob_settings(spec.grpo.corrections)
    if not needs or spec.generate_overridden or getattr(cls, "records_logprobs", False):
        return
    setting, value = next(iter(needs.items()))
    raise SettingError(
        f"GRPOConfig.corrections.{setting}={value!r} compares the trainer's log-probs with the sampler's "
        "(Rollout.logprobs), but "
        f"the rollout backend {name!r} does not record them (its records_logprobs is not true); choose a "
        "rollout_backend that does ('hf' or 'vllm'), declare records_logprobs = True on your backend if its "
        f"sessions fill Rollout.logprobs, or set {setting} to null",
        f"GRPOConfig.corrections.{setting}",
        value,
    )


def check_async_rollout(cls: type, spec: BackendSpec, name: str) -> None:
    """Refuse ``GRPOConfig.backend.async_rollout`` with a backend whose ``samples_apart`` is not true (its sampling
    would race the update in this process), with a ``generate`` override (it may not sample through the backend), or for
    a multi-turn run (``spec.multi_turn``: tools, environments, agent code).

    Raises:
        SettingError: Names the setting, the backend and the backends that allow it.
    """
    if not spec.grpo.backend.async_rollout:
        return
    setting = "GRPOConfig.backend.async_rollout"
    if not getattr(cls, "samples_apart", False):
        allowed = ", ".join(sorted(n for n, c in BACKENDS.items() if getattr(c, "samples_apart", False)))
        raise SettingError(
            f"{setting}=True samples the next rollout in a background thread during the update, but the rollout "
            f"backend {name!r} samples in the trainer process with the weights being updated (its samples_apart is "
            f"not true); choose a backend that samples apart ({allowed or 'vllm_server'}, or your own declaring "
            "samples_apart = True), or set async_rollout to false",
            setting,
            True,
        )
    if spec.generate_overridden:
        raise SettingError(
            f"{setting}=True needs GRPOModule.generate: a subclass's own generate is not known to sample only "
            "through the backend (the background thread may not touch the policy); set async_rollout to false",
            setting,
            True,
        )
    if spec.multi_turn if spec.multi_turn is not None else spec.grpo.agents.max_turns > 1:
        raise SettingError(
            f"{setting}=True cannot sample ahead multi-turn rollouts (tools or an environment with max_turns > 1, "
            "or agent code): their tool calls, environments and agent executions would run in the background sampling "
            "thread, which hosts sampling only; set async_rollout to false",
            setting,
            True,
        )


def build_backend(spec: BackendSpec, vllm: VLLMConfig | None = None) -> RolloutBackend:
    """The backend ``spec.grpo.backend.rollout_backend`` names, built with ``spec.grpo.backend.rollout_backend_args``
    (or ``vllm``).

    Args:
        spec: What it samples for: the run's settings, policy and model (:class:`BackendSpec`).
        vllm: The module's ``vllm`` argument: the vLLM backend's settings, given the older way.

    Raises:
        SettingError: See :func:`backend_class`, :func:`backend_settings`, :func:`check_supported`,
            :func:`check_turn_cache`, :func:`check_behaviour_logprobs`, :func:`check_async_rollout`.
        ValueError: ``vllm`` settings with another backend, or with ``rollout_backend_args`` too.
    """
    name, args = spec.grpo.backend.rollout_backend, spec.grpo.backend.rollout_backend_args
    cls = backend_class(name)
    if vllm is not None and cls is not VLLMBackend:
        raise ValueError(
            f"vllm settings were given but grpo.backend.rollout_backend is {name!r}; set rollout_backend: vllm"
        )
    if vllm is not None and args:
        raise ValueError(
            "vllm settings were given twice: as the module's vllm and grpo.backend.rollout_backend_args; keep one"
        )
    settings = vllm if vllm is not None else backend_settings(cls, args, name)
    check_async_rollout(cls, spec, name)  # before anything is built
    backend = cls(settings, spec)
    check_supported(cls, spec, name)
    check_turn_cache(cls, spec, name)
    check_behaviour_logprobs(cls, spec, name)
    return backend
