"""The 2025 outcome advantage estimators: GDPO, pass@k, OPO, REINFORCE++ and GPG (docs/math.md, one section each).

* ``gdpo`` — GDPO (arXiv:2601.05242; TRL ``multi_objective_aggregation="normalize_then_sum"``, verl
  ``adv_estimator=gdpo``): each reward function's rewards normalised within the group, ``(r_k - mean_g) / (std_g +
  eps)``, summed with the functions' weights, and the sum whitened over the (global) batch: over its rows (the
  paper, TRL; the default) or, with ``whiten="tokens"``, over its sampled tokens (verl).
* ``grpo_passk`` — pass@k advantages. ``k=None``: verl's form (its docstring cites arXiv:2503.19595): the best
  response of a group gets ``r_max - r_second``, divided by the group std unless ``advantage_scale="none"``; the
  others 0. ``k`` set: the analytic pass@k advantage of Chen et al. (2025, "Pass@k
  Training", arXiv:2508.10751) for 0/1 rewards.
* ``opo`` — On-Policy RL with Optimal reward baseline (Hao et al., 2025, arXiv:2505.23585): ``r - sum(l r) / sum(l)``
  over the group, ``l`` the completion's length in sampled tokens.
* ``reinforce_plus_plus`` — REINFORCE++ (Hu, 2025, arXiv:2501.03262) without baseline: the outcome reward discounted
  back from the last sampled token, ``gamma ** (tokens after t) * r``, whitened over all sampled tokens of the batch.
* ``gpg`` — Group Policy Gradient (Chu et al., 2025, arXiv:2504.02546): ``alpha * (r - mean_g) / f_norm`` with
  ``alpha = B / (B - M)`` (``M`` of the ``B`` valid rows lie in groups whose rewards are all equal); verl's
  ``alpha = B / (rows with a non-zero reward)`` with ``alpha="nonzero"``.

Batch statistics (GDPO's and REINFORCE++'s whitening, GPG's ``alpha``) are summed over ranks with
``settings.sum_across_ranks``; group statistics stay local (groups never span ranks).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import torch
from torch import Tensor

from lightning_grpo.algorithms.advantage_types import (
    AdvantageFunction,
    AdvantageSettings,
    GroupStats,
    batch_moments,
    declare_needs,
    group_stats,
)
from lightning_grpo.algorithms.components import ComponentSettingError
from lightning_grpo.settings_checks import SettingError

__all__ = [
    "GDPO",
    "GPG",
    "NEW_ESTIMATORS",
    "PassAtK",
    "ReinforcePlusPlus",
    "check_estimator_settings",
    "gdpo",
    "gdpo_metrics",
    "opo",
]


def _need_mask(name: str, stats: GroupStats, completion_mask: Tensor | None) -> Tensor:
    n = stats.rewards.shape[0]
    if completion_mask is None or completion_mask.ndim != 2 or completion_mask.shape[0] != n:
        got = None if completion_mask is None else tuple(completion_mask.shape)
        raise ValueError(f"{name} needs completion_mask of shape (N, T) with N={n}; got {got}")
    return completion_mask.double()


def _need_groups(name: str, stats: GroupStats) -> Tensor:
    if stats.group_ids is None:
        raise ValueError(f"{name} needs group_ids (the group of each sample)")
    return torch.unique(stats.group_ids, return_inverse=True)[1]


# ---------------------------------------------------------------- GDPO


def _function_rewards(stats: GroupStats, settings: AdvantageSettings) -> dict[str, tuple[Tensor, float]]:
    rewards = settings.function_rewards
    if rewards is None or len(rewards) < 2:
        names = None if rewards is None else list(rewards)
        raise ValueError(
            f"advantage_estimator='gdpo' normalises each reward function within its group and needs two reward "
            f"functions or more; got {names}. Give a second reward function (reward_funcs), or use "
            "advantage_estimator='grpo' with advantage_scale='batch' (the same thing for one function)"
        )
    weights = settings.function_weights or {}
    return {name: (values, float(weights.get(name, 1.0))) for name, values in rewards.items()}


def _check_complete(name: str, scored: GroupStats, stats: GroupStats) -> None:
    """A function scores every scorable row of a group or none of them (its ``None`` cannot be normalised)."""
    partial = stats.valid & (scored.count > 0) & (scored.count < stats.count)
    if bool(partial.any()):
        rows = torch.nonzero(partial & ~scored.valid).flatten()[:8].tolist()
        raise ValueError(
            f"advantage_estimator='gdpo': the reward function {name!r} returned None for some completions of a "
            f"group and a number for others (None on rows {rows}); GDPO normalises each function within its group, "
            "which a None inside a group makes ill-defined. Return a number for every completion of a prompt (e.g. "
            "0.0 when the criterion does not apply), None for all of them, or use advantage_estimator='grpo' (sum, "
            "then normalise)"
        )


def _gdpo_terms(stats: GroupStats, settings: AdvantageSettings) -> dict[str, tuple[Tensor, GroupStats]]:
    """Each function's weighted group-normalised rewards ``(N,)`` (0 where it scored nothing) and its group stats."""
    if stats.group_ids is None:
        raise ValueError("gdpo needs group_ids (the group of each sample)")
    terms = {}
    for name, (values, weight) in _function_rewards(stats, settings).items():
        scored = group_stats(torch.where(stats.valid, values.double(), torch.nan), stats.group_ids)
        _check_complete(name, scored, stats)
        normalised = (scored.rewards - scored.mean) / (scored.std + settings.eps)
        terms[name] = (weight * torch.where(scored.valid, normalised, 0.0), scored)
    return terms


class GDPO:
    """GDPO: ``whiten(sum_k w_k (r_k - mean_g(r_k)) / (std_g(r_k) + eps))`` over the rows some function scored.

    A function that returned ``None`` for a whole group adds nothing to it; ``None`` for part of a group is an error.

    Args:
        whiten: Over what the weighted sum is whitened: ``"rows"`` (the paper's batch normalisation of one value per
            completion; TRL ``normalize_then_sum``), or ``"tokens"`` (verl ``adv_estimator=gdpo``'s
            ``masked_whiten`` over the response tokens: each row weighs by its length in sampled tokens).

    Raises:
        ValueError: ``whiten`` not one of ``"rows"``, ``"tokens"``.
    """

    needs_groups = True
    needs_step_rewards = False
    needs_function_rewards = True

    def __init__(self, whiten: Literal["rows", "tokens"] = "rows") -> None:
        if whiten not in ("rows", "tokens"):
            raise ComponentSettingError(
                f"gdpo: whiten={whiten!r} is not valid; choose one of 'rows' (the paper, TRL), 'tokens' (verl)"
            )
        self.whiten = whiten

    def __call__(self, stats: GroupStats, completion_mask: Tensor | None, settings: AdvantageSettings) -> Tensor:
        total = sum((term for term, _ in _gdpo_terms(stats, settings).values()), torch.zeros_like(stats.rewards))
        if self.whiten == "rows":
            mean, std = batch_moments(total, stats.valid, settings.sum_across_ranks)
        else:
            weights = _need_mask("gdpo", stats, completion_mask) * stats.valid[:, None]
            mean, std = batch_moments(total[:, None].expand_as(weights), weights, settings.sum_across_ranks)
        return torch.where(stats.valid, (total - mean) / (std + settings.eps), 0.0)


#: The default GDPO (``whiten="rows"``), a function of the catalogue's signature.
gdpo = GDPO()


def gdpo_metrics(stats: GroupStats, settings: AdvantageSettings) -> dict[str, Tensor]:
    """What shows GDPO working, per reward function, over the global batch (``sum_across_ranks``):

    * ``gdpo/<name>/share``: its share of the summed advantage, ``sum |w_k n_k| / sum_j sum |w_j n_j|`` over the
      scored rows (``n_k`` its group-normalised reward): 1/K each when the functions weigh alike.
    * ``gdpo/<name>/zero_std_frac``: the fraction of the groups it scored in which it is constant (no signal).
    """
    terms = _gdpo_terms(stats, settings)
    _, inverse, sizes = torch.unique(stats.group_ids, return_inverse=True, return_counts=True)
    per_row = 1.0 / sizes[inverse].double()  # each group's rows add up to 1
    rows: list[Tensor] = []  # per function: summed |advantage|, groups it scored, groups where it is constant
    for term, scored in terms.values():
        groups_scored = per_row * (scored.count > 0)
        groups_constant = per_row * ((scored.count > 0) & scored.constant)
        rows.append(torch.stack([term.abs().sum(), groups_scored.sum(), groups_constant.sum()]))
    sums = torch.stack(rows)
    sums = sums if settings.sum_across_ranks is None else settings.sum_across_ranks(sums)
    total = sums[:, 0].sum()
    metrics = {}
    for name, (size, groups, flat) in zip(terms, sums.unbind(), strict=True):
        metrics[f"gdpo/{name}/share"] = size / total if total > 0 else torch.full_like(size, torch.nan)
        metrics[f"gdpo/{name}/zero_std_frac"] = flat / groups if groups > 0 else torch.full_like(size, torch.nan)
    return metrics


# ---------------------------------------------------------------- pass@k


def _comb_ratio(top: Tensor, bottom: Tensor, k: Tensor) -> Tensor:
    """``C(top, k) / C(bottom, k)`` (0 where ``top < k``), float64, for ``bottom >= k >= 0``."""
    lg = torch.lgamma
    log_ratio = lg(top + 1) - lg((top - k).clamp(min=0) + 1) - lg(bottom + 1) + lg(bottom - k + 1)
    return torch.where(top >= k, log_ratio.exp(), 0.0)


class PassAtK:
    """pass@k advantages (``grpo_passk``): the analytic form of Chen et al. (2025) with ``k``; verl's without.

    Args:
        k: The ``k`` of pass@k, for 0/1 rewards: a group of ``N`` valid rows, ``N_neg`` of them 0, has
            ``R = 1 - C(N_neg, k) / C(N, k)`` and ``sigma = sqrt(R (1 - R))``; a correct row gets ``(1 - R) / sigma``,
            a wrong one ``(1 - R - C(N_neg - 1, k - 1) / C(N - 1, k - 1)) / sigma`` (``k`` is capped at ``N``).
            ``None``: verl's ``grpo_passk`` — the group's best row (the first of equal best) gets ``r_max -
            r_second``, divided by the group std (``advantage_scale="group"``), the batch std (``"batch"``) or 1
            (``"none"``); every other row 0.

    Raises:
        ValueError: ``k`` not a positive integer.
    """

    needs_groups = True

    def __init__(self, k: int | None = None) -> None:
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ComponentSettingError(
                f"grpo_passk: k={k!r} must be a positive integer (the k of pass@k), or None for verl's form"
            )
        self.k = k

    def __call__(self, stats: GroupStats, completion_mask: Tensor | None, settings: AdvantageSettings) -> Tensor:
        inverse = _need_groups("grpo_passk", stats)
        if self.k is None:
            return self._max_gap(stats, inverse, settings)
        return self._analytic(stats, inverse, self.k)

    @staticmethod
    def _max_gap(stats: GroupStats, inverse: Tensor, settings: AdvantageSettings) -> Tensor:
        n, groups = stats.rewards.shape[0], int(inverse.max()) + 1
        r = torch.where(stats.valid, stats.rewards, -torch.inf)
        best = torch.full((groups,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, inverse, r, "amax")
        index = torch.arange(n, device=r.device)
        is_best = stats.valid & (r == best[inverse])
        best_index = torch.where(is_best, index, n)
        first = torch.full((groups,), n, device=r.device).scatter_reduce(0, inverse, best_index, "amin")
        chosen = index == first[inverse]
        rest = torch.where(chosen, -torch.inf, r)
        second = torch.full_like(best, -torch.inf).scatter_reduce(0, inverse, rest, "amax")
        gap = torch.where(chosen & (stats.count > 1), best[inverse] - second[inverse], 0.0)
        if settings.scale == "group":
            return gap / (stats.std + settings.eps)
        if settings.scale == "batch":
            _, std = batch_moments(stats.rewards, stats.valid, settings.sum_across_ranks)
            return gap / (std + settings.eps)
        return gap

    @staticmethod
    def _analytic(stats: GroupStats, inverse: Tensor, k: int) -> Tensor:
        valid_r = stats.rewards[stats.valid]
        if not bool(((valid_r == 0) | (valid_r == 1)).all()):
            bad = valid_r[(valid_r != 0) & (valid_r != 1)][0].item()
            raise ValueError(
                f"grpo_passk with k={k} takes 0/1 rewards (pass@k counts correct completions); got a reward {bad}. "
                "Make the weighted reward 0 or 1, or set advantage_estimator_args={'k': None} (verl's form)"
            )
        count = stats.count
        negatives = count - stats.total  # valid rows with reward 0
        kk = torch.minimum(torch.full_like(count, float(k)), count)
        mean = 1 - _comb_ratio(negatives, count, kk)
        sigma = (mean * (1 - mean)).clamp(min=0).sqrt()
        wrong_all = _comb_ratio(negatives - 1, count - 1, kk - 1)
        advantage = torch.where(stats.rewards == 1, 1 - mean, 1 - mean - wrong_all)
        return torch.where(sigma > 0, advantage / sigma.clamp(min=1e-300), 0.0)


# ---------------------------------------------------------------- OPO


@declare_needs(groups=True)
def opo(stats: GroupStats, completion_mask: Tensor | None, settings: AdvantageSettings) -> Tensor:
    """OPO: ``r - sum_g(l r) / sum_g(l)``, ``l`` the number of sampled tokens of each completion (valid rows only)."""
    lengths = _need_mask("opo", stats, completion_mask).sum(1) * stats.valid  # (N,)
    inverse = _need_groups("opo", stats)
    groups = int(inverse.max()) + 1
    weighted = torch.zeros(groups, dtype=torch.float64, device=lengths.device)
    weighted.index_add_(0, inverse, lengths * stats.rewards)  # each group's sum of l·r
    length = torch.zeros_like(weighted).index_add_(0, inverse, lengths)
    baseline = torch.where(length > 0, weighted / length.clamp(min=1e-300), 0.0)[inverse]
    baseline = torch.where(length[inverse] > 0, baseline, stats.mean)  # no sampled token: the plain mean
    return stats.rewards - baseline


# ---------------------------------------------------------------- REINFORCE++


class ReinforcePlusPlus:
    """REINFORCE++ without baseline (``reinforce_plus_plus``): discounted returns of the outcome reward, whitened.

    Token ``t`` of a completion with reward ``r`` gets ``gamma ** n_t * r``, ``n_t`` the number of sampled tokens
    after it (the reward sits on the last sampled token); these are whitened, ``(x - mean) / (std + eps)``, over every
    sampled token of the (global) batch. Rows no reward function scored get 0 and are left out of the statistics.

    Args:
        gamma: The discount, in ``[0, 1]`` (verl ``algorithm.gamma``, default 1).

    Raises:
        ValueError: ``gamma`` outside ``[0, 1]``.
    """

    needs_groups = False

    def __init__(self, gamma: float = 1.0) -> None:
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0.0 <= gamma <= 1.0:
            raise ComponentSettingError(
                f"reinforce_plus_plus: gamma={gamma!r} must be a number in [0, 1] (the discount)"
            )
        self.gamma = float(gamma)

    def __call__(self, stats: GroupStats, completion_mask: Tensor | None, settings: AdvantageSettings) -> Tensor:
        mask = _need_mask("reinforce_plus_plus", stats, completion_mask)
        after = mask.flip(1).cumsum(1).flip(1) - mask  # sampled tokens after t
        returns = torch.pow(torch.full_like(after, self.gamma), after) * stats.rewards[:, None]
        weights = mask * stats.valid[:, None]
        mean, std = batch_moments(returns, weights, settings.sum_across_ranks)
        return (returns - mean) / (std + settings.eps) * weights


# ---------------------------------------------------------------- GPG


class GPG:
    """Group Policy Gradient advantages (``gpg``): ``alpha * (r - mean_g) / f_norm``.

    Args:
        f_norm: The divisor (verl ``f_norm``, default 1).
        alpha: ``"valid"`` (the paper): ``B / (B - M)``, ``B`` the valid rows of the global batch, ``M`` those in
            groups whose valid rewards are all equal; ``"nonzero"`` (verl): ``B / max(1, rows with a non-zero
            reward)``.

    Raises:
        ValueError: ``f_norm`` not positive, or ``alpha`` not one of ``"valid"``, ``"nonzero"``.
    """

    needs_groups = True

    def __init__(self, f_norm: float = 1.0, alpha: Literal["valid", "nonzero"] = "valid") -> None:
        if isinstance(f_norm, bool) or not isinstance(f_norm, (int, float)) or not f_norm > 0:
            raise ComponentSettingError(f"gpg: f_norm={f_norm!r} must be a positive number")
        if alpha not in ("valid", "nonzero"):
            raise ComponentSettingError(
                f"gpg: alpha={alpha!r} is not valid; choose one of 'valid' (the paper), 'nonzero' (verl)"
            )
        self.f_norm, self.alpha = float(f_norm), alpha

    def __call__(self, stats: GroupStats, completion_mask: Tensor | None, settings: AdvantageSettings) -> Tensor:
        valid = stats.valid.double()
        if self.alpha == "valid":
            counts = torch.stack([valid.sum(), (valid * (stats.constant | (stats.count < 2))).sum()])
        else:
            counts = torch.stack([valid.sum(), (valid * (stats.rewards != 0)).sum()])
        if settings.sum_across_ranks is not None:
            counts = settings.sum_across_ranks(counts)
        rows, other = counts.unbind()
        alpha = rows / ((rows - other) if self.alpha == "valid" else other).clamp(min=1)
        return alpha * (stats.rewards - stats.mean) / self.f_norm


for _estimator in (PassAtK, GPG, ReinforcePlusPlus):
    _estimator.needs_step_rewards = False  # type: ignore[attr-defined]
    _estimator.needs_function_rewards = False  # type: ignore[attr-defined]

#: The estimators of this module by their catalogue name (merged into ``ADVANTAGE_ESTIMATORS``).
NEW_ESTIMATORS: Mapping[str, AdvantageFunction] = MappingProxyType(
    {"gdpo": GDPO, "grpo_passk": PassAtK, "opo": opo, "reinforce_plus_plus": ReinforcePlusPlus, "gpg": GPG}
)


def check_estimator_settings(estimator: str, args: Mapping[str, object] | None, num_generations: int) -> None:
    """``GRPOConfig``'s cross-field check of the new estimators: ``grpo_passk``'s ``k`` below ``num_generations``.

    With ``k >= G`` every group holding a correct completion has pass@k 1 for every k-subset (no spread), so every
    advantage would be 0.

    Raises:
        SettingError: Naming ``advantage_estimator_args``, ``num_generations`` and the fix.
    """
    k = (args or {}).get("k")
    if estimator == "grpo_passk" and isinstance(k, int) and k >= num_generations:
        raise SettingError(
            f"advantage_estimator_args={dict(args or {})!r}: grpo_passk needs k < num_generations={num_generations} "
            "(with k >= G every k-subset of a group with a correct completion passes: every advantage is 0); lower k "
            "or raise num_generations",
            "advantage_estimator_args",
            dict(args or {}),
        )
