"""TRL-style environments (``GRPOTrainer(environment_factory=...)`` of TRL 1.16) running unchanged.

Two environment protocols are accepted by ``environment_factory``; the rule that tells them apart
(:func:`is_trl_factory`):

- **ours** (:mod:`lightning_grpo.agents.environment`): the factory takes the dataset row, the environment has
  ``reset()`` and ``step(message)``. A class with a ``step`` method is ours, whatever its ``__init__`` looks like
  (``__init__(self, row=None)`` with ``step`` is ours and is called with the row).
- **TRL's**: a class *without* ``step`` (called with no argument), a function or other callable that needs no
  argument, or a ``{name: factory}`` dict of such factories. Its public methods are the tools, ``reset(**row)`` starts a
  trajectory, an optional ``get_reward()`` (sync or ``async``) scores it.

What :class:`TRLEnvironments` does, as TRL does it:

- one instance of each factory is made at construction (a probe: ``reset`` must exist) and kept in a pool; each
  trajectory draws one instance from the pool (the pool grows when a batch needs more), and ``reset`` runs first;
- the tools of a trajectory are the standalone ``tools=`` followed by the environment's public methods (alphabetical,
  ``reset``, ``get_reward`` and ``_private`` names excluded), schemas by ``transformers.utils.get_json_schema``;
- ``reset`` receives the row's columns as keywords, without ``environment`` and our internal ``dataset_index``, and
  only those its signature names (unless it takes ``**kwargs``); a returned string is appended to the last message;
- rows without a prompt start from one empty user message, so the prompt comes from ``reset`` alone;
- ``get_reward`` becomes an extra reward function named after the class (weight 1; ``None`` for trajectories of
  other environment classes); reward functions receive ``environments=`` (instances in completion order).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightning_grpo.agents.tools import Tool, ToolSet
from lightning_grpo.settings_checks import SettingError

__all__ = [
    "EMPTY_PROMPT",
    "TRLEnvironments",
    "is_trl_factory",
    "resolve_factory",
    "tool_method_names",
    "trl_environments_of",
    "with_environment_rewards",
]

#: Where a row has no prompt: the prompt comes from ``reset`` alone (TRL's placeholder).
EMPTY_PROMPT: list[dict[str, Any]] = [{"role": "user", "content": ""}]
_NOT_FOR_RESET = ("environment", "dataset_index")  # a control column and our internal row index
_NOT_TOOLS = ("reset", "get_reward")


def is_trl_factory(factory: Any) -> bool:
    """Whether ``factory`` is a TRL-style environment factory (see the module docs for the rule).

    Args:
        factory: A class, a callable, or a ``{name: factory}`` mapping.

    Returns:
        ``True`` for a mapping, a class without ``step``, or a non-class callable that needs no argument.
    """
    if isinstance(factory, Mapping):
        return True
    if isinstance(factory, type):
        return not callable(getattr(factory, "step", None))
    if not callable(factory):
        return False
    try:
        inspect.signature(factory).bind()
    except TypeError:
        return False  # needs an argument: the row (ours)
    except ValueError:
        return False  # no signature to read (a builtin): treat as ours, called with the row
    return True


def trl_environments_of(factory: Any, tools: Sequence[Tool] = ()) -> Any:
    """``factory`` as a :class:`TRLEnvironments` when it is TRL-style, else unchanged (ours, or ``None``)."""
    if factory is None or isinstance(factory, TRLEnvironments) or not is_trl_factory(factory):
        return factory
    return TRLEnvironments(factory, tools)


class TRLEnvironments:
    """The TRL-style environments of a run: factories, the instance pool, per-instance tools, resets and rewards.

    Args:
        factories: A no-argument factory, or a ``{name: factory}`` dict selected per row by its ``environment``
            column.
        tools: Standalone tools offered beside each environment's methods (first, as TRL orders them).

    Raises:
        TypeError: A factory is not callable, or is one of ours (a class with ``step``) inside the dict.
        ValueError: The dict is empty, an instance has no ``reset`` method, or a method cannot be a tool.
    """

    def __init__(self, factories: Callable[[], Any] | Mapping[str, Callable[[], Any]], tools: Sequence[Tool] = ()):
        self.multi = isinstance(factories, Mapping)
        named = dict(factories) if isinstance(factories, Mapping) else {None: factories}
        if not named:
            raise ValueError("environment_factory is an empty dict; give at least one {name: factory}.")
        for name, factory in named.items():
            if not callable(factory) or (isinstance(factory, type) and not is_trl_factory(factory)):
                raise TypeError(
                    f"environment_factory[{name!r}] must be a no-argument factory of a TRL-style environment (a class "
                    f"with reset() and tool methods, no step()), got {factory!r}."
                )
        self.factories: dict[str | None, Callable[[], Any]] = named
        self.tools = list(tools)
        self._pool: dict[str | None, list[Any]] = {}
        self._schemas: dict[type, list[Tool]] = {}
        self.reward_classes: list[type] = []
        for name in named:
            instance = self._make(name)
            self._pool[name] = [instance]
            cls = type(instance)
            if callable(getattr(cls, "get_reward", None)) and cls not in self.reward_classes:
                self.reward_classes.append(cls)
        self._drawn: dict[str | None, int] = {}

    @property
    def names(self) -> list[str]:
        """The environments' names (the dict's keys); empty for a single factory."""
        return [name for name in self.factories if name is not None]

    def environment_of(self, row: Mapping[str, Any], index: int) -> str | None:
        """The name of the row's environment (its ``environment`` column); ``None`` for a single factory.

        Raises:
            ValueError: The row lacks the column, or names no factory (the message lists the names).
        """
        if not self.multi:
            return None
        if "environment" not in row:
            raise ValueError(
                f"row {index} has no 'environment' column; with a dict environment_factory every row names its "
                f"environment, one of {self.names}."
            )
        name = row["environment"]
        if name not in self.factories:
            raise ValueError(
                f"row {index} has environment={name!r}, which is not among the environments of environment_factory; "
                f"expected one of {self.names}."
            )
        return name

    def start_batch(self) -> None:
        """Hand the pool out from its start again (each sampling call draws fresh: instances are reused)."""
        self._drawn = {}

    def draw(self, name: str | None) -> Any:
        """The next free instance of environment ``name`` this batch, made when the pool has none left."""
        pool, index = self._pool[name], self._drawn.get(name, 0)
        if index == len(pool):
            pool.append(self._make(name))
        self._drawn[name] = index + 1
        return pool[index]

    def toolset(self, instance: Any) -> ToolSet:
        """The tools of a trajectory served by ``instance``: the standalone tools, then its public methods."""
        cls = type(instance)
        if cls not in self._schemas:
            self._schemas[cls] = [Tool.from_function(getattr(instance, name)) for name in tool_method_names(cls)]
        bound = [
            Tool(t.name, getattr(instance, t.name), t.schema, t.is_async, inspect.signature(getattr(instance, t.name)))
            for t in self._schemas[cls]
        ]
        return ToolSet([*self.tools, *bound])

    def check_tools(self) -> None:
        """Build each environment's tools once (on its probe instance), so a bad method or a name clash is found now.

        Raises:
            ValueError: A method cannot be a tool (no type hints or docstring), or shares a ``tools=`` name.
        """
        for pool in self._pool.values():
            self.toolset(pool[0])

    def reset(self, instance: Any, row: Mapping[str, Any], prompt: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Call ``instance.reset(**columns)``; the prompt with a returned string appended to its last message.

        Raises:
            ValueError: ``reset`` needs a column the row lacks, or returned something other than ``None`` or a string.
        """
        reset = instance.reset
        kwargs = _reset_keywords(reset, {k: v for k, v in row.items() if k not in _NOT_FOR_RESET})
        name = type(instance).__name__
        try:
            inspect.signature(reset).bind(**kwargs)
        except TypeError as err:
            raise ValueError(
                f"{name}.reset() cannot be called with the row's columns {sorted(kwargs)}: {err}. Give the missing "
                "parameters defaults, add the columns to the data, or take **kwargs."
            ) from err
        observation = reset(**kwargs)
        if observation is None:
            return list(prompt)
        if not isinstance(observation, str):
            raise ValueError(f"{name}.reset() returned {type(observation).__name__}; it must return None or a string.")
        last = prompt[-1]
        return [*prompt[:-1], {**last, "content": (last.get("content") or "") + observation}]

    def reward_functions(self) -> dict[str, Callable[..., Any]]:
        """One reward function per environment class with ``get_reward``, named after the class (TRL's naming)."""
        return {cls.__name__: _get_reward_function(cls) for cls in self.reward_classes}

    def _make(self, name: str | None) -> Any:
        label = "environment_factory" if name is None else f"environment_factory[{name!r}]"
        factory = self.factories[name]
        try:
            instance = factory()
        except TypeError as err:
            raise TypeError(
                f"{label} ({getattr(factory, '__name__', factory)!r}) has no step() method, so it is a TRL-style "
                f"environment, made with no argument; that failed: {err}. Give a TRL-style class a no-argument "
                "__init__, or add step(message) for the row-taking protocol (docs/agents.md)."
            ) from err
        if not callable(getattr(type(instance), "reset", None)):
            raise ValueError(
                f"{label} made a {type(instance).__name__}, which has no reset() method. A TRL-style environment "
                "needs reset(**row) (return None, or a string appended to the last user message); its public methods "
                "are the tools."
            )
        return instance


def tool_method_names(cls: type) -> list[str]:
    """The names of a TRL-style environment class's tool methods, as TRL lists them (alphabetical functions)."""
    return [
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in _NOT_TOOLS and not name.startswith("_")
    ]


def _reset_keywords(reset: Callable[..., Any], columns: dict[str, Any]) -> dict[str, Any]:
    """The columns ``reset`` takes: all of them with ``**kwargs``, else those its signature names."""
    parameters = inspect.signature(reset).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return columns
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in columns.items() if k in names}


def _checked(cls: type, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{cls.__name__}.get_reward() returned {value!r}; it must return a number (int or float).")
    return float(value)


def _get_reward_function(cls: type) -> Callable[..., Any]:
    """A reward function calling ``get_reward()`` of the instances of exactly ``cls`` (``None`` for the others)."""
    if inspect.iscoroutinefunction(cls.get_reward):

        async def get_reward(environments: Sequence[Any], **kwargs: Any) -> list[float | None]:
            return [_checked(cls, await e.get_reward()) if type(e) is cls else None for e in environments]

    else:

        def get_reward(environments: Sequence[Any], **kwargs: Any) -> list[float | None]:  # type: ignore[misc]
            return [_checked(cls, e.get_reward()) if type(e) is cls else None for e in environments]

    get_reward.__name__ = get_reward.__qualname__ = cls.__name__
    return get_reward


def with_environment_rewards(factory: Any, reward_funcs: Any, reward_weights: Any) -> tuple[Any, Any, Any]:
    """The environment factory (a :class:`TRLEnvironments` when TRL-style), and the reward functions and weights with
    the environments' ``get_reward`` functions added (weight 1 each).

    Args:
        factory: The module's ``environment_factory`` (``None``, ours, or TRL-style).
        reward_funcs: The module's ``reward_funcs``: ``None``, a sequence, a mapping (or a ``RewardFunctions``, which
            is refused when ``get_reward`` functions must join it: it holds its functions fixed).
        reward_weights: The module's ``reward_weights`` (``None``, a sequence or a mapping).

    Returns:
        ``(environment_factory, reward_funcs, reward_weights)``.

    Raises:
        ValueError: ``reward_funcs`` is a ``RewardFunctions``, or a mapping with a key named like an environment class.
    """
    environments = trl_environments_of(resolve_factory(factory))
    return (environments, *_add_rewards(reward_funcs, reward_weights, environments))


def resolve_factory(factory: Any) -> Any:
    """``factory`` with import paths (``"my_env.ReverseChecker"``, as YAML gives them) replaced by what they name.

    A string is imported, not called: a class of either protocol stays a class (TRL-style ones are built without
    arguments, ours with the row). A dict's values are resolved alike; anything else is returned unchanged.

    Raises:
        SettingError: A path that cannot be imported, naming it and why.
    """
    if isinstance(factory, str):
        return _import_path(factory, "environment_factory")
    if isinstance(factory, Mapping) and any(isinstance(value, str) for value in factory.values()):
        return {
            name: _import_path(value, f"environment_factory[{name!r}]") if isinstance(value, str) else value
            for name, value in factory.items()
        }
    return factory


def _import_path(path: str, setting: str) -> Any:
    """The object at ``package.module.Name``."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name) if module else importlib.import_module(name)
    except (ImportError, AttributeError, ValueError) as error:
        raise SettingError(
            f"{setting}={path!r} cannot be imported ({type(error).__name__}: {error}); give the import path of a "
            "class or function, e.g. my_env.ReverseChecker (a module of the current folder or installed)",
            setting,
            path,
        ) from error


def _add_rewards(reward_funcs: Any, reward_weights: Any, environments: Any) -> tuple[Any, Any]:
    extra = environments.reward_functions() if isinstance(environments, TRLEnvironments) else {}
    if not extra:
        return reward_funcs, reward_weights
    if hasattr(reward_funcs, "functions") and hasattr(reward_funcs, "weights"):  # a RewardFunctions
        raise ValueError(
            f"the environment(s) {list(extra)} score with get_reward(), which joins the reward functions; pass "
            "reward_funcs as a list or a mapping (not a RewardFunctions) so it can be added."
        )
    if isinstance(reward_funcs, Mapping):
        clash = sorted(set(extra) & set(reward_funcs))
        if clash:
            raise ValueError(f"reward functions are named {clash}, as the environment classes whose get_reward scores.")
        funcs: Any = {**reward_funcs, **extra}
    elif reward_funcs is None:
        funcs = [*extra.values()]
    elif isinstance(reward_funcs, Sequence):
        funcs = [*reward_funcs, *extra.values()]
    else:
        funcs = [reward_funcs, *extra.values()]
    if isinstance(reward_weights, Mapping):
        reward_weights = {**reward_weights, **dict.fromkeys(extra, 1.0)}
    elif reward_weights is not None:
        reward_weights = [*reward_weights, *[1.0] * len(extra)]
    return funcs, reward_weights
