"""``GRPOConfig``: every algorithm setting of a GRPO run, typed, documented and checked, in groups by concern.

Each group is a small dataclass that owns the settings that interact and checks them (``lightning_grpo.config``);
the checks that span groups run here. Names follow verl and TRL where they agree; ``docs/coming-from.md`` maps the
rest. In YAML and on the command line a setting is ``grpo.<group>.<name>`` (``--model.grpo.sampling.temperature``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from lightning_grpo.config import checks
from lightning_grpo.config.execution_group import AgentConfig, BackendConfig, FaultConfig, UpdateConfig
from lightning_grpo.config.objective_group import AdvantageConfig, CorrectionConfig, ObjectiveConfig
from lightning_grpo.config.sampling_group import SamplingConfig, ValidationConfig

__all__ = ["GROUPS", "MOVED_SETTINGS", "GRPOConfig", "moved_setting_message"]

#: Each group of ``GRPOConfig`` by its field name.
GROUPS: dict[str, type] = {
    "sampling": SamplingConfig,
    "validation": ValidationConfig,
    "objective": ObjectiveConfig,
    "advantages": AdvantageConfig,
    "corrections": CorrectionConfig,
    "update": UpdateConfig,
    "agents": AgentConfig,
    "backend": BackendConfig,
    "faults": FaultConfig,
}

#: Each flat setting of the ungrouped ``GRPOConfig`` (before issue 63) -> its place now (``"sampling.temperature"``).
MOVED_SETTINGS: dict[str, str] = {
    **{f.name: f"{group}.{f.name}" for group, kind in GROUPS.items() if group != "validation" for f in fields(kind)},
    **{f"val_{f.name}": f"validation.{f.name}" for f in fields(ValidationConfig)},
}


def moved_setting_message(name: str, prefix: str = "grpo.") -> str:
    """``grpo.temperature moved to grpo.sampling.temperature``: the one line for a flat setting's old name."""
    return f"{prefix}{name} moved to {prefix}{MOVED_SETTINGS[name]} (settings are grouped: docs/configuration.md)"


class _RefusesMovedSettings(type):
    """Refuse a flat setting's old name with the one line naming its group (``GRPOConfig(temperature=...)``). A
    metaclass, not ``__new__``: jsonargparse reads a class's settings from its own ``__new__`` where it has one, and
    the command line must see the dataclass's ``__init__`` (``--model.grpo.sampling.temperature``)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        moved = [name for name in kwargs if name in MOVED_SETTINGS]
        if moved:
            raise TypeError(moved_setting_message(moved[0], prefix="GRPOConfig."))
        return super().__call__(*args, **kwargs)


@dataclass
class GRPOConfig(metaclass=_RefusesMovedSettings):
    """Settings of a GRPO run, grouped by concern; each group checks its own settings, this class the ones that span
    groups. A rollout holds ``prompts per iteration × sampling.num_generations`` rows.

    Example::

        >>> config = GRPOConfig(sampling=SamplingConfig(num_generations=4), objective=ObjectiveConfig(kl_coef=0.0))
        >>> config.sampling.num_generations, config.objective.kl_coef, config.update.ppo_epochs
        (4, 0.0, 1)
    """

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """How a training rollout is sampled: group size, lengths, temperature, truncation, decode path."""
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    """How validation samples and what counts as solved."""
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    """The loss: policy loss and its clip bounds, KL, aggregation, entropy bonus."""
    advantages: AdvantageConfig = field(default_factory=AdvantageConfig)
    """How rewards become advantages; dynamic sampling of groups that carry a signal."""
    corrections: CorrectionConfig = field(default_factory=CorrectionConfig)
    """Old log-probs and the off-policy corrections of the sampler/trainer mismatch."""
    update: UpdateConfig = field(default_factory=UpdateConfig)
    """Epochs, mini- and micro-batches, gradient clipping, packing and the log-prob passes' memory."""
    agents: AgentConfig = field(default_factory=AgentConfig)
    """Turns, tools, environments and agent code."""
    backend: BackendConfig = field(default_factory=BackendConfig)
    """What samples the rollouts, and whether one iteration ahead."""
    faults: FaultConfig = field(default_factory=FaultConfig)
    """Reward timeouts, non-finite values, collective timeouts."""

    def __post_init__(self) -> None:
        for name, kind in GROUPS.items():  # a mapping (a checkpoint's, a user's dict) becomes its group
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, kind(**value))
            elif not isinstance(value, kind):
                raise TypeError(f"GRPOConfig.{name} must be a {kind.__name__}, got {type(value).__name__}")
        checks.check_groups(self)

    def component(self, setting: str) -> Any:
        """The component chosen by ``setting`` (``"loss_kind"``, ...) with its settings (``<setting>_args``) bound.

        Raises:
            SettingError: The name is neither a built-in nor an importable import path (the built-ins listed), the
                settings hold a key the component does not take (its settings listed), or the object is not a
                component of its kind (the call it misses named).
        """
        group = next(getattr(self, name) for name, kind in GROUPS.items() if setting in kind.__dataclass_fields__)
        return checks.component(group, setting)

    def check_rollout_size(self, rollout_size: int) -> None:
        """Check the batch sizes against a rollout of ``rollout_size`` rows (prompts per iteration × G)."""
        checks.check_rollout_size(self, rollout_size)

    @property
    def logprob_kwargs(self) -> dict[str, Any]:
        """Settings of the log-prob passes (:func:`~lightning_grpo.rollout.completion_logprobs`)."""
        objective, update = self.objective, self.update
        tile = update.fused_head_tile_mib
        return {
            "temperature": self.sampling.temperature,
            "chunk_size": update.logprob_chunk_size,
            "entropy_grad": objective.entropy_coef > 0 or objective.entropy_control != "constant",
            "share_prompt": self.sampling.share_prompt,
            "fused_head": update.fused_head,
            "packing": update.packing,
            "tile_bytes": None if tile is None else tile * 2**20,
        }
