"""Moved: the parts of one GRPO iteration live in :mod:`lightning_grpo.iteration` ("step" is an optimizer step).

``lightning_grpo.step`` and its modules (``lightning_grpo.step.update``, ``.batch``, ``.context``, ...) still import,
each with one ``DeprecationWarning`` naming its new path (:mod:`lightning_grpo._moved`).
"""

from lightning_grpo._moved import moved_names
from lightning_grpo.iteration.context import STEP_MODULE

__getattr__ = moved_names(
    __name__,
    {
        **{name: f"lightning_grpo.iteration.{name}" for name in ("LossCounts", "PhaseTimer", "StepContext")},
        **{name: f"lightning_grpo.iteration.{name}" for name in ("StepOutput", "UpdateBatch")},
        "Rollout": "lightning_grpo.rollout.Rollout",
        "TokenLogProbs": "lightning_grpo.rollout.TokenLogProbs",
        "StepModule": STEP_MODULE,
    },
)
