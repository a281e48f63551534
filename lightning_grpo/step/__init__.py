"""The phases of one GRPO iteration and the types they exchange.

``GRPOModule.training_step`` runs them in order (docs/index.md): sampling and scoring (the module's ``generate`` and
``score``), :func:`~lightning_grpo.step.dynamic_sampling.dynamic_sample` when asked, the zero-signal check
(:func:`~lightning_grpo.step.zero_signal.check_signal`), advantages, ``prepare_update`` and the update loop
(:func:`~lightning_grpo.step.update.run_updates`). The phases take a :class:`StepContext` that the module builds for
each step, and the module's public steps; never its private state.

Everything a subclass needs to override one step is importable from here (and from :mod:`lightning_grpo`):

* :class:`UpdateBatch`: what ``prepare_update`` returns and ``compute_loss`` receives;
* :class:`LossCounts`: the global normalisers ``compute_loss`` divides by;
* :class:`StepOutput`: what ``training_step`` returns to the callbacks;
* :class:`~lightning_grpo.rollout.Rollout` and :class:`~lightning_grpo.rollout.TokenLogProbs`: what ``generate``
  and ``compute_logprobs`` return.
"""

from lightning_grpo.rollout import Rollout, TokenLogProbs
from lightning_grpo.step.batch import LossCounts, StepOutput, UpdateBatch
from lightning_grpo.step.context import StepContext, StepModule
from lightning_grpo.step.timing import PhaseTimer

__all__ = [
    "LossCounts",
    "PhaseTimer",
    "Rollout",
    "StepContext",
    "StepModule",
    "StepOutput",
    "TokenLogProbs",
    "UpdateBatch",
]
