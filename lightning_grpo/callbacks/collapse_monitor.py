"""Tell the user when a run collapses: the reward falls to a floor where no group carries signal, and stays there."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_grpo.callbacks._arguments import check_positive_int, check_prefix
from lightning_grpo.callbacks._step_output import step_output
from lightning_grpo.iteration.dynamic_sampling import informative_groups
from lightning_grpo.metrics import reduce_across_ranks
from lightning_grpo.settings_checks import check_number

__all__ = ["COLLAPSE_MESSAGE", "CollapseMonitor"]

#: Warned once, when a collapse is first seen; ``{cause}`` is one of :attr:`CollapseMonitor.CAUSES`.
COLLAPSE_MESSAGE = (
    "The run has collapsed: for the last {iterations} iterations every group had equal rewards (no signal, every "
    "advantage 0) at a mean reward of {reward:.3g}, down from {peak:.3g} at step {peak_step}. {cause} Usual fixes: a "
    "lower learning rate (LoRA on a small model: 1e-4 to 3e-3; on a 0.5B-7B model: 1e-6 to 2e-5), more samples per "
    "prompt (num_generations), a token budget that fits a whole answer (max_new_tokens), and a checkpoint from before "
    "step {peak_step} to resume from. train/collapse is 1 on collapsed iterations; docs/troubleshooting.md has more."
)


class CollapseMonitor(Callback):
    r"""Warn once, with the likely cause and the fix, when a run that was learning stops getting any signal.

    A GRPO run collapses when the policy drifts into a region where every sample of a group gets the same reward:
    every advantage is 0, the policy gets no gradient, and it cannot come back (the optimizer's momentum may still
    push it further). The signature this callback watches for, over ``patience`` consecutive iterations:

    * no group carries signal (``train/zero_std_frac`` is 1, or every reward is ``None``), and
    * the mean reward is below the best mean reward of the run by more than ``min_drop`` (a run whose every sample
      succeeds also has no signal: that is convergence, not a collapse).

    It then names the likely cause from the iteration's rollout: *runaway completions* (most trajectories cut by
    ``max_new_tokens``, or by the budget before their environment stepped), *entropy collapse* (the policy samples
    nearly one completion: mean token entropy under ``min_entropy``), or *reward collapse* (the samples all fail in
    the same way), and the fixes (lower learning rate, larger ``num_generations``, a larger budget).

    Metrics: ``<prefix>collapse`` (1.0 on an iteration that belongs to a collapse, else 0.0). Values are global over
    ranks.

    Args:
        patience: Consecutive no-signal iterations below the best reward before it is called a collapse.
        min_drop: How far below the run's best mean reward the reward must be.
        min_entropy: Mean token entropy (nats) under which the cause is called an entropy collapse.
        prefix: Prepended to the metric name.

    Raises:
        ValueError: If ``patience`` is not a positive integer, or ``min_drop``/``min_entropy`` is negative.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks import CollapseMonitor
        >>> trainer = Trainer(callbacks=[CollapseMonitor(patience=3)], logger=False)
    """

    #: The causes it names, each with its own advice.
    CAUSES: ClassVar[dict[str, str]] = {
        "runaway": "Most trajectories ran into the token budget ({truncated:.0%} cut{env}): the policy's turns got "
        "longer until no answer fits. Lower the learning rate; raise max_new_tokens only if right answers need it; "
        "mask_truncated_completions=True keeps cut samples out of the loss.",
        "entropy": "The policy's token entropy is {entropy:.3g}: it samples nearly the same completion every time, "
        "so groups cannot differ. Lower the learning rate, raise the temperature or add entropy_coef.",
        "reward": "The samples all fail in the same way (token entropy {entropy:.3g}, {truncated:.0%} cut): an update "
        "too large moved the policy off what worked. Lower the learning rate (and keep max_grad_norm), use more "
        "samples per prompt, or add a KL penalty to the reference (kl_coef).",
    }

    def __init__(
        self, patience: int = 3, min_drop: float = 0.05, min_entropy: float = 0.01, prefix: str = "train/"
    ) -> None:
        self.patience = check_positive_int("patience", patience)
        for name, value in (("min_drop", min_drop), ("min_entropy", min_entropy)):
            check_number(name, value, minimum=0.0)
        self.min_drop, self.min_entropy = float(min_drop), float(min_entropy)
        self.prefix = check_prefix(prefix)
        self.peak, self.peak_step, self.streak, self.warned = -math.inf, 0, 0, False

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        out = step_output(outputs, self, ("rollout", "rewards", "metrics"))
        reward, no_signal, truncated, cut_before_step = self._iteration_stats(out["rollout"], out["rewards"])
        if reward > self.peak:
            self.peak, self.peak_step = reward, trainer.global_step
        collapsed = no_signal and reward < self.peak - self.min_drop
        self.streak = self.streak + 1 if collapsed else 0
        pl_module.log(f"{self.prefix}collapse", float(self.streak >= self.patience), on_step=True)
        if self.streak >= self.patience and not self.warned:
            self.warned = True
            entropy = float(out["metrics"].get("entropy", torch.tensor(math.nan)))
            rank_zero_warn(self.message(reward, entropy, truncated, cut_before_step))

    def message(self, reward: float, entropy: float, truncated: float, cut_before_step: float) -> str:
        """The warning for a collapse at mean ``reward`` with these rollout statistics (fractions in [0, 1])."""
        if truncated >= 0.5:
            cause = "runaway"
        elif entropy < self.min_entropy:
            cause = "entropy"
        else:
            cause = "reward"
        env = f", {cut_before_step:.0%} before their environment stepped" if cut_before_step > 0 else ""
        text = self.CAUSES[cause].format(truncated=truncated, entropy=entropy, env=env)
        return COLLAPSE_MESSAGE.format(
            iterations=self.streak, reward=reward, peak=self.peak, peak_step=self.peak_step, cause=text
        )

    @staticmethod
    def _iteration_stats(rollout: Any, scores: Any) -> tuple[float, bool, float, float]:
        """Global mean reward, whether no group has signal, the fraction cut, and cut before any environment step."""
        rewards, valid = torch.nan_to_num(scores.rewards.double()), scores.valid.double()
        _, informative = informative_groups(scores.rewards, rollout.group_ids)
        cut = rollout.truncated.double()
        no_step = torch.zeros_like(cut)
        if "env_reward" in rollout.columns:  # an environment ran: which trajectories were cut before its first step
            never = [not rewards_ for rewards_ in rollout.turns.turn_rewards]
            no_step = cut * torch.tensor(never, dtype=cut.dtype, device=cut.device)
        stats = [(rewards * valid).sum(), valid.sum(), informative.double().sum(), cut.sum(), no_step.sum()]
        sums = reduce_across_ranks(torch.stack([*stats, torch.ones_like(cut).sum()])).tolist()
        total, count, informative_count, cut_count, no_step_count, n = sums
        n = max(n, 1.0)  # every rank without rows: none of them is cut
        return total / max(count, 1.0), informative_count == 0, cut_count / n, no_step_count / n

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"peak": self.peak, "peak_step": self.peak_step, "streak": self.streak, "warned": self.warned}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.peak, self.peak_step = state_dict["peak"], state_dict["peak_step"]
        self.streak, self.warned = state_dict["streak"], state_dict["warned"]
