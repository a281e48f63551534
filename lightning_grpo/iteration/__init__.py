"""The phases of one GRPO iteration and the types they exchange.

``GRPOModule.training_step`` runs them in order (docs/index.md): sampling and scoring (the module's ``generate`` and
``score``; with ``async_rollout``, the rollout sampled one iteration ahead: not a phase here but the backend's,
:mod:`lightning_grpo.backends.ahead`, handed plain values),
:func:`~lightning_grpo.iteration.dynamic_sampling.dynamic_sample` when asked, the zero-signal check
(:func:`~lightning_grpo.iteration.zero_signal.check_signal`), advantages, ``prepare_update`` and the update loop
(:func:`~lightning_grpo.iteration.update.run_updates`). The phases take an :class:`IterationContext` that
``training_step`` builds once per iteration, and the module's overridable methods as explicit callables; they never
call back into the module.

Everything a subclass needs to override one phase is importable from here (and from :mod:`lightning_grpo`):

* :class:`UpdateBatch`: what ``prepare_update`` returns and ``compute_loss`` receives;
* :class:`LossCounts`: the global normalisers ``compute_loss`` divides by;
* :class:`StepOutput`: what ``training_step`` returns to the callbacks (named after Lightning's ``STEP_OUTPUT``);
* :class:`~lightning_grpo.rollout.Rollout` and :class:`~lightning_grpo.rollout.TokenLogProbs`: what ``generate``
  and ``compute_logprobs`` return.
"""

from lightning_grpo.iteration.context import IterationContext
from lightning_grpo.iteration.timing import PhaseTimer
from lightning_grpo.iteration.types import LossCounts, StepOutput, UpdateBatch
from lightning_grpo.rollout import Rollout, TokenLogProbs

__all__ = [
    "IterationContext",
    "LossCounts",
    "PhaseTimer",
    "Rollout",
    "StepOutput",
    "TokenLogProbs",
    "UpdateBatch",
]
