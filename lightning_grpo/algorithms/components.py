"""Components: a policy loss, KL estimator or advantage estimator chosen by name, with settings of its own.

A component is named like any variant of an open catalogue (a built-in name or an import path,
:mod:`~lightning_grpo.algorithms.catalogue`) and given a mapping of its own settings, the way a rollout backend is
given ``rollout_backend_args``: ``loss_kind`` + ``loss_kind_args``, ``kl_estimator`` + ``kl_estimator_args``,
``advantage_estimator`` + ``advantage_estimator_args``. Built-ins and a user's components go the same route:

* a **function** of the role's call (``(logprobs, old_logprobs, advantages, completion_mask, settings)`` for a policy
  loss) takes its settings as further parameters with defaults, usually keyword-only::

      def my_loss(logprobs, old_logprobs, advantages, mask, settings, *, beta=0.1): ...

* a **class** takes its settings in ``__init__``; its instance is called like the function (state kept between
  calls lives on the instance)::

      class MyLoss:
          def __init__(self, temperature_pos=1.0, temperature_neg=1.05): ...
          def __call__(self, logprobs, old_logprobs, advantages, mask, settings): ...

The settings are plain data (a mapping of names to values), so they go to YAML, ``--print_config`` and the
checkpoint's hyper-parameters as they are. An unknown setting, a missing required one, a built-in given settings it
does not take, and an object that cannot be called as the role's call are errors that say so.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lightning_grpo.algorithms.catalogue import choose

__all__ = ["ComponentRole", "ComponentSettingError", "build_component", "component_settings"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class ComponentSettingError(ValueError):
    """Settings a component does not take, or a required one left out (the message lists its settings)."""


@dataclass(frozen=True, eq=False)  # hashed by identity: a key of the cache of built components
class ComponentRole:
    """What a component is for: its noun, its catalogue of built-ins and the arguments it is called with.

    Attributes:
        what: The noun in messages (``"policy loss kind"``).
        catalogue: Built-in name to component.
        call: The names of the positional arguments every component of the role is called with.
        returns: What the call returns, for messages (``"PolicyLossTerms"``).
    """

    what: str
    catalogue: Mapping[str, Callable[..., Any]]
    call: tuple[str, ...]
    returns: str

    @property
    def call_text(self) -> str:
        """``f(logprobs, old_logprobs, ...) -> PolicyLossTerms``, for messages."""
        return f"f({', '.join(self.call)}) -> {self.returns}"


def component_settings(target: Callable[..., Any], role: ComponentRole, name: str | None = None) -> dict[str, Any]:
    """The settings ``target`` takes and their defaults (``inspect.Parameter.empty``: required).

    Of a class: the parameters of ``__init__``; of a function: the parameters after the role's call.

    Raises:
        ValueError: A function that cannot take the role's call (too few positional parameters).
    """
    parameters = list(_signature(target, role).parameters.values())
    if isinstance(target, type):
        return {p.name: p.default for p in parameters if p.kind not in _VARIADIC}
    positional = [p for p in parameters if p.kind in _POSITIONAL]
    if len(positional) < len(role.call) and not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        raise ValueError(_not_a_component(target, role, name))
    after = positional[len(role.call) :] + [p for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return {p.name: p.default for p in after}


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def build_component(
    role: ComponentRole,
    name: str,
    settings: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """The component ``name`` with its ``settings`` bound: a function of the role's call.

    Built once per process for each name, settings and defaults (a class's instance, and its state, is shared by the
    callers that give the same ones).

    Args:
        role: What is being built.
        name: A built-in name or the import path of a function or class.
        settings: The component's own settings (``loss_kind_args``); ``None``: none.
        defaults: Values for settings the component takes and ``settings`` leaves out (``GRPOConfig``'s flat
            ``clip_low``, ... for a loss with a ``clip_low`` setting); names the component does not take are ignored.

    Raises:
        ValueError: An unknown name or an import path that does not import (valid names listed), settings the
            component does not take (its settings listed), a required setting left out, or an object that cannot be
            called as the role's call (the signature it misses named).
    """
    key = (role, name, _key(settings), _key(defaults))
    if key not in _BUILT:
        if len(_BUILT) >= _MAX_BUILT:
            _BUILT.pop(next(iter(_BUILT)))  # the oldest
        _BUILT[key] = _build(role, name, dict(settings or {}), dict(defaults or {}))
    return _BUILT[key]


#: Components built so far, by role, name, settings and defaults (their text): a class's instance is built once.
_BUILT: dict[tuple[ComponentRole, str, str, str], Callable[..., Any]] = {}
_MAX_BUILT = 128


def _key(mapping: Mapping[str, Any] | None) -> str:
    if mapping is not None and not (isinstance(mapping, Mapping) and all(isinstance(k, str) for k in mapping)):
        raise TypeError(f"a component's settings must be a mapping of setting names to values, got {mapping!r}")
    return repr(sorted(mapping.items())) if mapping else ""


def _build(role: ComponentRole, name: str, settings: dict[str, Any], defaults: dict[str, Any]) -> Callable[..., Any]:
    target = choose(role.catalogue, name, role.what, import_paths=True)
    takes = component_settings(target, role, name)
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in _signature(target, role).parameters.values())
    unknown = sorted(set(settings) - set(takes))
    if unknown and not open_ended:
        unknown_text = ", ".join(map(repr, unknown))
        if not takes:
            raise ComponentSettingError(f"the {role.what} {name!r} takes no settings; got {unknown_text}")
        valid = ", ".join(takes)
        raise ComponentSettingError(f"the {role.what} {name!r} takes no setting {unknown_text}; its settings: {valid}")
    given = {**{k: v for k, v in defaults.items() if k in takes}, **settings}
    missing = [k for k, default in takes.items() if default is inspect.Parameter.empty and k not in given]
    if missing:
        needed = ", ".join(missing)
        raise ComponentSettingError(f"the {role.what} {name!r} needs the setting(s) {needed}; give them in its args")
    own_defaults = {k: v for k, v in takes.items() if v is not inspect.Parameter.empty}
    _check_settings(target, {**own_defaults, **given}, role, name)
    component = target(**given) if isinstance(target, type) else _bound(target, given)
    if isinstance(target, type):
        _check_call(component, role, name)
    return component


def _check_settings(target: Callable[..., Any], given: dict[str, Any], role: ComponentRole, name: str) -> None:
    """Call the ``check_settings`` a function is marked with (``policy_loss_terms.with_settings_check``)."""
    check = None if isinstance(target, type) else getattr(target, "check_settings", None)
    if check is None:
        return
    try:
        check(**given)
    except (TypeError, ValueError) as error:
        raise ComponentSettingError(f"the {role.what} {name!r}: {error}") from None


def _bound(function: Callable[..., Any], given: dict[str, Any]) -> Callable[..., Any]:
    if not given:
        return function
    bound = functools.partial(function, **given)
    functools.update_wrapper(bound, function)  # keeps needs_* markers, __name__ and __qualname__
    return bound


def _check_call(component: Any, role: ComponentRole, name: str) -> None:
    if not callable(component):
        raise ValueError(
            f"the {role.what} {name!r} builds a {type(component).__name__} that cannot be called as "
            f"{role.call_text}; give it a __call__ of that signature"
        )
    try:
        inspect.signature(component).bind(*role.call)
    except TypeError:
        raise ValueError(_not_a_component(component, role, name)) from None


def _signature(target: Callable[..., Any], role: ComponentRole) -> inspect.Signature:
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):  # a builtin without a signature: take it as a function of the call
        params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in role.call]
        return inspect.Signature(params)


def _not_a_component(target: Any, role: ComponentRole, name: str | None = None) -> str:
    label = name or getattr(target, "__qualname__", repr(target))
    signature = inspect.signature(target)
    return (
        f"the {role.what} {label!r} is not one: a {role.what.removesuffix(' kind')} is called as {role.call_text}, "
        f"but it takes {signature}"
    )
