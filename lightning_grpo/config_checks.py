"""The checks of :class:`~lightning_grpo.config.GRPOConfig`: ranges, choices, open-catalogue components, the backend's
name and the batch sizes, each failure naming the setting, its value, why and the fix.

``GRPOConfig.__post_init__`` calls :func:`check_config`; :func:`component` and :func:`check_rollout_size` serve its
methods of the same names. Every function takes the config as its first argument (these checks sit below the class:
the config imports them, never the other way).
"""

from __future__ import annotations

from dataclasses import fields
from functools import cache
from typing import Any

from lightning_grpo.algorithms.advantage_estimators import check_estimator_settings
from lightning_grpo.algorithms.advantages import ADVANTAGE_ESTIMATOR, estimator_needs
from lightning_grpo.algorithms.catalogue import is_import_path
from lightning_grpo.algorithms.components import ComponentRole, ComponentSettingError, build_component
from lightning_grpo.algorithms.corrections import ROLES as CORRECTION_ROLES
from lightning_grpo.algorithms.kl import KL_ESTIMATOR
from lightning_grpo.algorithms.off_policy_checks import check_off_policy_settings
from lightning_grpo.algorithms.policy_losses import POLICY_LOSS
from lightning_grpo.rewards._validation import check_timeouts
from lightning_grpo.rollout.buckets import check_decode_lengths
from lightning_grpo.settings_checks import SettingError, check_choice, check_number, literal_choices, named_errors

__all__ = ["COMPONENTS", "NUMBER_RULES", "check_config", "check_rollout_size", "component"]

#: Components chosen from an open catalogue (a built-in name or an import path), each with its settings' field
#: (``<name>_args``) and its role (``lightning_grpo.algorithms.components``).
COMPONENTS: dict[str, ComponentRole] = {
    "loss_kind": POLICY_LOSS,
    "kl_estimator": KL_ESTIMATOR,
    "advantage_estimator": ADVANTAGE_ESTIMATOR,
    **CORRECTION_ROLES,  # None: off
}

_INT: dict[str, Any] = {"integer": True, "minimum": 1}  # a count or size: an int >= 1
_OPTIONAL_INT: dict[str, Any] = {**_INT, "allow_none": True}
#: Every numeric setting and its allowed range (``check_number``'s arguments); a new numeric field adds a line here.
NUMBER_RULES: dict[str, dict[str, Any]] = {
    "num_generations": _INT,
    "max_prompt_length": _INT,
    "max_new_tokens": _INT,
    "temperature": {"minimum": 0.0, "exclusive_minimum": True},
    "top_p": {"minimum": 0.0, "maximum": 1.0, "exclusive_minimum": True},
    "top_k": {"integer": True, "minimum": 0},
    "ppo_epochs": _INT,
    "mini_batch_size": _OPTIONAL_INT,
    "micro_batch_size": _OPTIONAL_INT,
    "kl_coef": {"minimum": 0.0},
    "loss_agg_norm": _OPTIONAL_INT,
    "advantage_eps": {"minimum": 0.0},
    "process_outcome_weight": {},
    "entropy_coef": {"minimum": 0.0},
    "max_grad_norm": {"minimum": 0.0, "exclusive_minimum": True, "allow_none": True},
    "logprob_chunk_size": _INT,
    "fused_head_tile_mib": _OPTIONAL_INT,
    "val_num_generations": _INT,
    "val_temperature": {"minimum": 0.0, "exclusive_minimum": True, "allow_none": True},
    "val_success_threshold": {},
    "max_sampling_rounds": _INT,
    "max_skipped_steps": {"integer": True, "minimum": 0},
    "micro_batch_tokens": _OPTIONAL_INT,
    "max_turns": _INT,
    "tool_timeout": {"minimum": 0.0, "exclusive_minimum": True},
    "agent_call_timeout": {"minimum": 0.0, "exclusive_minimum": True},
    "agent_timeout": {"minimum": 0.0, "exclusive_minimum": True},
    "agent_batch_window": {"minimum": 0.0},
    "agent_http_port": {"integer": True, "minimum": 0, "maximum": 65535},
    "collective_timeout_s": {"minimum": 1.0, "maximum": 604800.0, "allow_none": True},
}


@cache
def _choices(config_type: type) -> dict[str, tuple[Any, ...]]:
    """The allowed values of each ``Literal`` field (``typing.get_args``): the type is the one place they are
    written."""
    return literal_choices(config_type)


def check_config(config: Any) -> None:
    """Check every setting of a :class:`~lightning_grpo.config.GRPOConfig` (``__post_init__`` calls it).

    Raises:
        SettingError: A setting out of its range or choices, named with its value, why and the fix.
        ValueError: Settings that cannot be combined.
        TypeError: A setting of the wrong type.
    """
    with named_errors(config):  # "GRPOConfig.num_generations=1: ...": the field, the value, why and the fix
        _check_names(config)
        _check_ranges(config)
        _check_batches(config)
        _check_faults(config)
        check_estimator_settings(config.advantage_estimator, config.advantage_estimator_args, config.num_generations)
        check_off_policy_settings(config)
        _check_decode(config)


def _check_decode(config: Any) -> None:
    """``decode_lengths`` hold a first-turn sequence; ``decode: compiled`` is not asked with the eager paths' own
    switches (``drop_finished``, ``static_cache``)."""
    check_decode_lengths(config.decode_lengths, config.max_prompt_length, config.max_new_tokens)
    if config.decode_lengths is not None:
        config.decode_lengths = [int(n) for n in config.decode_lengths]
    clash = [name for name in ("drop_finished", "static_cache") if getattr(config, name)]
    if config.decode == "compiled" and clash:
        raise ValueError(
            f"decode='compiled' cannot be combined with {clash[0]}=True: the compiled path keeps every row in a "
            f"fixed-shape batch (finished rows masked) over its own static cache; set {clash[0]} to false, or decode "
            "to 'eager' or 'auto'"
        )


def _check_faults(config: Any) -> None:
    timeout = config.reward_timeout
    try:
        check_timeouts(timeout, tuple(timeout) if isinstance(timeout, dict) else ("every reward",))
    except SettingError as error:  # timeout['judge'] -> reward_timeout['judge']; one number: reward_timeout
        key = error.setting.removeprefix("timeout")
        raise error.renamed("reward_timeout" + ("" if key == "['every reward']" else key)) from None


def _check_names(config: Any) -> None:
    for setting, choices in _choices(type(config)).items():
        check_choice(setting, getattr(config, setting), choices)
    for setting in COMPONENTS:  # a built-in name, or an import path that imports, with settings it takes
        if component(config, setting) is not None:  # a correction may be None: off
            setattr(config, setting, str(getattr(config, setting)))  # a plain string in hyperparameters, checkpoints
    _check_backend(config)


def component(config: Any, setting: str) -> Any:
    """The component chosen by ``setting`` (``"loss_kind"``, ...) with its settings (``<setting>_args``) bound;
    ``None`` for an off-policy correction set to ``None`` (off).

    Raises:
        SettingError: The name is neither a built-in nor an importable import path (the built-ins listed), the
            settings hold a key the component does not take (its settings listed), or the object is not a
            component of its kind (the call it misses named).
    """
    name, args_name = getattr(config, setting), f"{setting}_args"
    args = getattr(config, args_name)
    if args is not None and not (isinstance(args, dict) and all(isinstance(key, str) for key in args)):
        raise SettingError(f"{args_name} must be a mapping of setting names to values, got {args!r}", args_name, args)
    role = COMPONENTS[setting]
    if name is None and setting in CORRECTION_ROLES:
        if args:
            raise SettingError(f"{args_name}={args!r} is set but {setting} is null; set {setting}", args_name, args)
        return None
    if not isinstance(name, str) or (name not in role.catalogue and not is_import_path(name)):
        options = ", ".join(repr(v) for v in role.catalogue)
        raise SettingError(
            f"{setting}={name!r} is not valid; choose one of {options}, or the import path of a function of the "
            "same signature such as 'my_project.module.function'",
            setting, name,
        )  # fmt: skip
    defaults = vars(config.policy_loss_settings()) if setting == "loss_kind" else None
    try:
        return build_component(role, name, args, defaults)
    except ValueError as error:
        culprit = args_name if isinstance(error, ComponentSettingError) else setting
        value = getattr(config, culprit)
        raise SettingError(f"{culprit}={value!r} is not valid: {error}", culprit, value) from None


def _check_backend(config: Any) -> None:
    """The backend's name reads as one (it is imported when the module is built: ``lightning_grpo.backends``)."""
    backend, args = config.rollout_backend, config.rollout_backend_args
    if backend not in ("hf", "vllm", "vllm_server") and not is_import_path(backend):
        raise ValueError(
            f"rollout_backend={backend!r} is not valid; choose one of 'hf', 'vllm', 'vllm_server', or the import path "
            "of a RolloutBackend class such as 'my_project.backends.MyBackend'"
        )
    if args is not None and not (isinstance(args, dict) and all(isinstance(key, str) for key in args)):
        raise TypeError(f"rollout_backend_args must be a mapping of setting names to values, got {args!r}")
    config.rollout_backend_args = None if args is None else dict(args)


def _check_ranges(config: Any) -> None:
    for setting, bounds in NUMBER_RULES.items():
        check_number(setting, getattr(config, setting), **bounds)
    for field in fields(config):
        value = getattr(config, field.name)
        if isinstance(field.default, bool) and not isinstance(value, bool):
            raise TypeError(f"{field.name} must be true or false, got {value!r} ({type(value).__name__})")
    needs = estimator_needs(config.advantage_estimator)  # what the estimator declares (declare_needs)
    if needs.groups and config.num_generations < 2:
        raise SettingError(
            f"num_generations={config.num_generations}: the group estimator {config.advantage_estimator!r} needs "
            "num_generations >= 2 (a group of one has no baseline); set num_generations to 2 or more (8 is usual)",
            "num_generations",
            config.num_generations,
        )
    if config.async_rollout and config.dynamic_sampling:
        raise ValueError(
            "async_rollout=True cannot be combined with dynamic_sampling=True: its extra sampling rounds would sample "
            "beside the rollout running ahead, with another adapter; turn one of them off"
        )
    if needs.step_rewards and config.dynamic_sampling:
        raise ValueError(
            "dynamic_sampling keeps groups whose outcome rewards differ, which says nothing of their step rewards: "
            f"it cannot be combined with advantage_estimator={config.advantage_estimator!r}, which reads step "
            "rewards; turn one of them off"
        )
    config.policy_loss_settings()  # the clip settings in effect are in range (the loss checks the same)


def _check_batches(config: Any) -> None:
    mini, micro = config.mini_batch_size, config.micro_batch_size
    if config.micro_batch_tokens is None and mini is not None and micro is not None and mini % micro:
        raise ValueError(f"mini_batch_size={mini} must be a multiple of micro_batch_size={micro}")


def check_rollout_size(config: Any, rollout_size: int) -> None:
    """Check the batch sizes against a rollout of ``rollout_size`` completions (prompts per step × G)."""
    mini = config.mini_batch_size or rollout_size
    if config.micro_batch_tokens is not None:  # micro-batches by tokens: any number of rows each
        if rollout_size % mini:
            raise ValueError(
                f"the rollout has {rollout_size} completions (prompts per step × G={config.num_generations}); it "
                f"must be a multiple of mini_batch_size={mini} (micro-batches are formed by "
                f"micro_batch_tokens={config.micro_batch_tokens})"
            )
        return
    micro = config.micro_batch_size or mini
    if rollout_size % mini or mini % micro:
        raise ValueError(
            f"the rollout has {rollout_size} completions (prompts per step × G={config.num_generations}); "
            f"it must be a multiple of mini_batch_size={mini}, itself a multiple of micro_batch_size={micro}"
        )
