"""The settings of a GRPO run: :class:`GRPOConfig` and its groups, each a small dataclass owning the settings that
interact (docs/configuration.md shows one full YAML with every group).

* ``sampling`` (:class:`SamplingConfig`), ``validation`` (:class:`ValidationConfig`);
* ``objective`` (:class:`ObjectiveConfig`), ``advantages`` (:class:`AdvantageConfig`), ``corrections``
  (:class:`CorrectionConfig`);
* ``update`` (:class:`UpdateConfig`), ``agents`` (:class:`AgentConfig`), ``backend`` (:class:`BackendConfig`),
  ``faults`` (:class:`FaultConfig`).
"""

from lightning_grpo.config.execution_group import AgentConfig, BackendConfig, FaultConfig, UpdateConfig
from lightning_grpo.config.grpo import GROUPS, MOVED_SETTINGS, GRPOConfig, moved_setting_message
from lightning_grpo.config.objective_group import AdvantageConfig, CorrectionConfig, ImportPath, ObjectiveConfig
from lightning_grpo.config.sampling_group import SamplingConfig, ValidationConfig

__all__ = [
    "GROUPS",
    "MOVED_SETTINGS",
    "AdvantageConfig",
    "AgentConfig",
    "BackendConfig",
    "CorrectionConfig",
    "FaultConfig",
    "GRPOConfig",
    "ImportPath",
    "ObjectiveConfig",
    "SamplingConfig",
    "UpdateConfig",
    "ValidationConfig",
    "moved_setting_message",
]
