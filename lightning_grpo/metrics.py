"""Cross-rank reductions of logged metrics, in one place, on torchmetrics.

Every metric that GRPO logs is a global value over all ranks, computed here: a torchmetrics ``Metric`` whose state
has a ``dist_reduce_fx`` (``"sum"``, ``"min"`` or ``"max"``) is updated with this rank's value and computed, which
gathers the state of every rank and reduces it. Every rank then holds the same global value and logs it without
Lightning's ``sync_dist``, whose mean of per-rank means is not the global mean when ranks hold different numbers of
tokens or of valid rewards. Means and standard deviations come from global sums (counts, sums, sums of squares,
:func:`~lightning_grpo.algorithms.statistics.mean_std`), so they are exact. In one process nothing is gathered.

The sums that enter the loss and the advantages (global token counts, batch statistics) are part of the algorithm,
not logged metrics: the module all-reduces them with ``trainer.strategy.reduce`` on the strategy's process group.
docs/callbacks.md lists every metric with its owner and its reduction. :class:`MetricSums` adds up the update loop's
per-micro-batch metrics and averages them over all ranks at the end of the step.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.aggregation import MeanMetric

from lightning_grpo.algorithms.statistics import SumAcrossRanks

__all__ = ["MetricSums", "RankReduction", "ReduceOp", "ValidationMetrics", "reduce_across_ranks", "without_extrema"]

ReduceOp = Literal["sum", "min", "max"]
_START = {"sum": 0.0, "min": float("inf"), "max": float("-inf")}
_COMBINE = {"sum": torch.add, "min": torch.minimum, "max": torch.maximum}


class RankReduction(Metric):
    """Element-wise sum, minimum or maximum of a float64 tensor over updates and, when computed, over all ranks.

    Args:
        shape: Shape of the values.
        op: ``"sum"``, ``"min"`` or ``"max"``.
        device: Where the state lives (that of the values it will reduce); ``None``: torch's default device.

    Raises:
        ValueError: If ``op`` is not one of them.

    Example::

        >>> total = RankReduction((2,), "sum")
        >>> total.update(torch.tensor([1.0, 2.0])); total.update(torch.tensor([3.0, 4.0]))
        >>> total.compute()
        tensor([4., 6.], dtype=torch.float64)
    """

    full_state_update = False

    def __init__(
        self, shape: tuple[int, ...] | torch.Size, op: ReduceOp = "sum", device: torch.device | None = None
    ) -> None:
        if op not in _START:
            raise ValueError(f"op must be one of {', '.join(repr(o) for o in _START)}; got {op!r}")
        super().__init__(compute_with_cache=False)
        self.op = op
        start = torch.full(tuple(shape), _START[op], dtype=torch.float64, device=device)
        self.add_state("value", start, dist_reduce_fx=op)

    def update(self, value: Tensor) -> None:
        """Combine ``value`` into the state (this rank only)."""
        self.value = _COMBINE[self.op](self.value, value.detach().to(self.value))

    def compute(self) -> Tensor:
        """The state reduced over all ranks."""
        return self.value


def reduce_across_ranks(value: Tensor, op: ReduceOp = "sum") -> Tensor:
    """``value`` reduced element-wise over all ranks, in float64 on its device; a collective: every rank calls it.

    Example::

        >>> reduce_across_ranks(torch.tensor([1.0, 2.0]))  # one process: the value itself
        tensor([1., 2.], dtype=torch.float64)
    """
    metric = RankReduction(value.shape, op, device=value.device)
    metric.update(value)
    return metric.compute()


def without_extrema(metrics: dict[str, Tensor]) -> dict[str, Tensor]:
    """``metrics`` less the ``*_max`` and ``*_min`` ones (:class:`MetricSums`' extrema).

    The update loop drops them on a step without a loss token on any rank, where they hold only their start values
    (an infinity, or a meaningless 0).

    Example::

        >>> without_extrema({"kl": torch.tensor(0.0), "w_min": torch.tensor(float("inf"))})
        {'kl': tensor(0.)}
    """
    return {name: value for name, value in metrics.items() if name.rsplit("_", 1)[-1] not in ("max", "min")}


class ValidationMetrics(nn.Module):
    """``val/reward_mean``, ``val/accuracy`` and ``val/pass@k`` over every validation sample of every rank.

    Each is a torchmetrics ``MeanMetric`` (sum and count states): logged as the metric object, Lightning computes it
    at the end of the validation epoch, which sums the states over ranks, and resets it. The means are exact over
    all samples, whatever each rank and batch holds.

    Args:
        k: Samples per prompt; ``val/pass@k`` is logged when ``k > 1``.
        threshold: A sample counts as solved when its reward is at least this (NaN never does).

    Example::

        >>> metrics = ValidationMetrics(k=2, threshold=1.0)
        >>> logged = metrics.update(torch.tensor([1.0, 0.0, 0.0, float("nan")]))
        >>> {name: round(metric.compute().item(), 4) for name, metric in logged.items()}
        {'val/reward_mean': 0.3333, 'val/accuracy': 0.25, 'val/pass@2': 0.5}
    """

    def __init__(self, k: int, threshold: float) -> None:
        super().__init__()
        self.k, self.threshold = k, threshold
        self.reward_mean = MeanMetric(nan_strategy="ignore")  # rows no reward function applied to are left out
        self.accuracy = MeanMetric()
        self.pass_at_k = MeanMetric()

    def update(self, rewards: Tensor) -> dict[str, Metric]:
        """Add one batch's ``(B * k,)`` rewards (``k`` consecutive samples per prompt); the metrics to log by name."""
        success = (rewards >= self.threshold).float()  # NaN compares False
        self.reward_mean.update(rewards)
        self.accuracy.update(success)
        logged: dict[str, Metric] = {"val/reward_mean": self.reward_mean, "val/accuracy": self.accuracy}
        if self.k > 1:
            self.pass_at_k.update(success.view(-1, self.k).amax(-1))  # (B,) any success among the k samples
            logged[f"val/pass@{self.k}"] = self.pass_at_k
        return logged


class MetricSums:
    """Running sums of per-micro-batch metrics, reduced over all ranks at the end of the step, by name:

    * ``*_max`` / ``*_min``: the maximum / minimum (a 0-dim value);
    * ``*_seq_frac``: a fraction of sequences, given as a ``(2,)`` tensor ``[sequences counted, sequences]``: the
      numerators and denominators are summed, so the result is the exact global fraction of sequences;
    * any other name: a 0-dim value, averaged with the ``weight`` given to :meth:`add` (the valid-token count).

    Example::

        >>> sums = MetricSums()
        >>> sums.add({"kl": torch.tensor(1.0), "w_min": torch.tensor(0.5), "x_seq_frac": torch.tensor([1.0, 4.0])}, 2)
        >>> sums.add({"kl": torch.tensor(4.0), "w_min": torch.tensor(0.2), "x_seq_frac": torch.tensor([0.0, 1.0])}, 1)
        >>> {k: round(float(v), 4) for k, v in sums.means().items()}
        {'kl': 2.0, 'x_seq_frac': 0.2, 'w_min': 0.2}
    """

    def __init__(self) -> None:
        self._sums: dict[str, Tensor] = {}
        self._weights: dict[str, Tensor] = {}
        self._extrema: dict[str, dict[str, Tensor]] = {"max": {}, "min": {}}

    def add(self, metrics: dict[str, Tensor], weight: Tensor | float) -> None:
        """Add each metric with ``weight`` (e.g. the micro-batch's valid-token count); see the class for the names."""
        for name, value in metrics.items():
            value = value.detach().float()
            op = name.rsplit("_", 1)[-1]
            if op in self._extrema:
                extrema = self._extrema[op]
                extrema[name] = _COMBINE[op](extrema.get(name, value), value)
                continue
            if name.endswith("_seq_frac"):
                total, count = value[0], value[1]
            else:
                count = torch.as_tensor(weight, dtype=value.dtype, device=value.device)
                total = value * count
            self._sums[name] = self._sums.get(name, torch.zeros_like(total)) + total
            self._weights[name] = self._weights.get(name, torch.zeros_like(count)) + count

    def means(self, sum_across_ranks: SumAcrossRanks | None = None) -> dict[str, Tensor]:
        """The mean of each metric (float32), over all ranks when ``sum_across_ranks`` is given (one reduce each for
        the sums, the maxima and the minima).

        The update loop passes :func:`reduce_across_ranks`, so the means are exact global values.
        """
        extrema = {
            name: value
            for op in self._extrema
            for name, value in self._reduced(op, sum_across_ranks is not None).items()
        }
        if not self._sums:
            return extrema
        names = list(self._sums)
        stacked = torch.stack(
            [torch.stack([self._sums[n] for n in names]), torch.stack([self._weights[n] for n in names])]
        )
        if sum_across_ranks is not None:
            stacked = sum_across_ranks(stacked)  # (2, M): weighted sums and weights
        means = {name: (stacked[0, i] / stacked[1, i].clamp(min=1e-12)).float() for i, name in enumerate(names)}
        return {**means, **extrema}

    def _reduced(self, op: str, across_ranks: bool) -> dict[str, Tensor]:
        """The ``*_max`` or ``*_min`` metrics, over all ranks when asked (every rank has the same names: one reduce)."""
        values = self._extrema[op]
        if not values:
            return {}
        names = sorted(values)
        stacked = torch.stack([values[n] for n in names])
        if across_ranks:
            stacked = reduce_across_ranks(stacked, op).reshape(-1)  # torchmetrics squeezes one value
        return {name: stacked[i].float() for i, name in enumerate(names)}
