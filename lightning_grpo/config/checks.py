"""The checks shared by the groups of :class:`~lightning_grpo.config.GRPOConfig`: ranges, choices, true/false and
open-catalogue components, each failure naming the setting by its place (``GRPOConfig.sampling.top_p``), its value,
why and the fix; and the checks that span groups (``GRPOConfig.__post_init__``) or a rollout's size.

Each group owns its rules (``rules``, a class variable) and its own interactions (its ``__post_init__``); these
functions sit below the groups: the groups import them, never the other way.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from functools import cache
from typing import Any

from lightning_grpo.algorithms.advantage_estimators import check_estimator_settings
from lightning_grpo.algorithms.advantages import ADVANTAGE_ESTIMATOR, estimator_needs
from lightning_grpo.algorithms.catalogue import is_import_path
from lightning_grpo.algorithms.components import ComponentRole, ComponentSettingError, build_component
from lightning_grpo.algorithms.corrections import ROLES as CORRECTION_ROLES
from lightning_grpo.algorithms.kl import KL_ESTIMATOR
from lightning_grpo.algorithms.policy_losses import POLICY_LOSS
from lightning_grpo.settings_checks import SettingError, check_choice, check_number, literal_choices, named_errors

__all__ = [
    "COMPONENTS",
    "COUNT",
    "OPTIONAL_COUNT",
    "OPTIONAL_POSITIVE",
    "POSITIVE",
    "NumberRules",
    "check_components",
    "check_group",
    "check_groups",
    "check_rollout_size",
]

#: Each numeric setting of a group and its allowed range (``check_number``'s keyword arguments).
NumberRules = dict[str, dict[str, Any]]

#: The range of a count (a whole number of at least one), shared by the groups' rules.
COUNT: dict[str, Any] = {"integer": True, "minimum": 1}
#: A count, or ``None``.
OPTIONAL_COUNT: dict[str, Any] = {**COUNT, "allow_none": True}
#: The range of a number above zero (a temperature, a timeout in seconds).
POSITIVE: dict[str, Any] = {"minimum": 0.0, "exclusive_minimum": True}
#: A number above zero, or ``None``.
OPTIONAL_POSITIVE: dict[str, Any] = {**POSITIVE, "allow_none": True}

#: Components chosen from an open catalogue (a built-in name or an import path), each with its settings' field
#: (``<name>_args``) and its role (``lightning_grpo.algorithms.components``).
COMPONENTS: dict[str, ComponentRole] = {
    "loss_kind": POLICY_LOSS,
    "kl_estimator": KL_ESTIMATOR,
    "advantage_estimator": ADVANTAGE_ESTIMATOR,
    **CORRECTION_ROLES,  # None: off
}


@cache
def _choices(group_type: type) -> dict[str, tuple[Any, ...]]:
    """The allowed values of each ``Literal`` field: the type is the one place they are written."""
    return literal_choices(group_type)


@contextmanager
def check_group(group: Any) -> Iterator[None]:
    """Check a group's choices, true/false fields and number ranges (its ``rules``), then run the group's own checks
    (the body of the ``with``); every error raised names the setting by its place (the group's ``owner``).

    Raises:
        SettingError: A setting out of its range or choices, named with its value, why and the fix.
        ValueError: Settings that cannot be combined.
        TypeError: A setting of the wrong type.
    """
    with named_errors(group, group.owner):
        for setting, choices in _choices(type(group)).items():
            check_choice(setting, getattr(group, setting), choices)
        for setting, bounds in group.rules.items():
            check_number(setting, getattr(group, setting), **bounds)
        for field in fields(group):
            value = getattr(group, field.name)
            if isinstance(field.default, bool) and not isinstance(value, bool):
                raise TypeError(f"{field.name} must be true or false, got {value!r} ({type(value).__name__})")
        yield


def check_components(group: Any, settings: Sequence[str]) -> None:
    """Build each component of ``group`` named in ``settings`` (an error names a bad name or setting) and keep its
    name as a plain string (hyperparameters, checkpoints)."""
    for setting in settings:
        if component(group, setting) is not None:  # a correction may be None: off
            setattr(group, setting, str(getattr(group, setting)))


def component(group: Any, setting: str) -> Any:
    """The component chosen by ``setting`` (``"loss_kind"``, ...) of ``group`` with its settings (``<setting>_args``)
    bound; ``None`` for an off-policy correction set to ``None`` (off).

    Raises:
        SettingError: The name is neither a built-in nor an importable import path (the built-ins listed), the
            settings hold a key the component does not take (its settings listed), or the object is not a
            component of its kind (the call it misses named).
    """
    name, args_name = getattr(group, setting), f"{setting}_args"
    args = getattr(group, args_name)
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
            setting,
            name,
        )
    defaults = vars(group.policy_loss_settings()) if setting == "loss_kind" else None
    try:
        return build_component(role, name, args, defaults)
    except ValueError as error:
        culprit = args_name if isinstance(error, ComponentSettingError) else setting
        value = getattr(group, culprit)
        raise SettingError(f"{culprit}={value!r} is not valid: {error}", culprit, value) from None


def check_groups(config: Any) -> None:
    """The checks that span groups (``GRPOConfig.__post_init__``); each error names every setting involved.

    Raises:
        SettingError: A group estimator with fewer than two samples per prompt, or ``grpo_passk``'s ``k`` not below
            the group size.
        ValueError: ``backend.async_rollout`` with ``advantages.dynamic_sampling``.
    """
    sampling, advantages = config.sampling, config.advantages
    if estimator_needs(advantages.advantage_estimator).groups and sampling.num_generations < 2:
        raise SettingError(
            f"GRPOConfig.sampling.num_generations={sampling.num_generations}: the group estimator "
            f"advantages.advantage_estimator={advantages.advantage_estimator!r} needs num_generations >= 2 (a group "
            "of one has no baseline); set sampling.num_generations to 2 or more (8 is usual)",
            "sampling.num_generations",
            sampling.num_generations,
        )
    with named_errors(advantages, advantages.owner):
        check_estimator_settings(
            advantages.advantage_estimator, advantages.advantage_estimator_args, sampling.num_generations
        )
    if config.backend.async_rollout and advantages.dynamic_sampling:
        raise ValueError(
            "GRPOConfig.backend.async_rollout=True cannot be combined with advantages.dynamic_sampling=True: its "
            "extra sampling rounds would sample beside the rollout running ahead, with another adapter; turn one of "
            "them off"
        )


def check_rollout_size(config: Any, rollout_size: int) -> None:
    """Check the batch sizes against a rollout of ``rollout_size`` completions (prompts per iteration × G)."""
    update, group_size = config.update, config.sampling.num_generations
    mini = update.mini_batch_size or rollout_size
    if update.micro_batch_tokens is not None:  # micro-batches by tokens: any number of rows each
        if rollout_size % mini:
            raise ValueError(
                f"the rollout has {rollout_size} completions (prompts per iteration × G={group_size}); it must be a "
                f"multiple of update.mini_batch_size={mini} (micro-batches are formed by "
                f"update.micro_batch_tokens={update.micro_batch_tokens})"
            )
        return
    micro = update.micro_batch_size or mini
    if rollout_size % mini or mini % micro:
        raise ValueError(
            f"the rollout has {rollout_size} completions (prompts per iteration × G={group_size}); it must be a "
            f"multiple of update.mini_batch_size={mini}, itself a multiple of update.micro_batch_size={micro}"
        )
