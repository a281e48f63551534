"""The peers' normalisers as settings (issue 65): each reproduces verl 0.9.1's or TRL 1.16's own function exactly.

* ``gmpo`` ``rows: all`` is verl's ``compute_policy_loss_geo_mean`` (mean over every row, a fully masked one too);
* ``rollout_rejection_args: {normalise: kept}`` is verl's rejection mask then verl's loss over it;
* ``top_entropy`` ``entropy_over: selected`` is TRL's ``GRPOTrainer._compute_loss`` entropy bonus.

At the defaults the documented ratios hold (``test_verl_claims.py``, ``test_trl_claims.py``). The counts of the first
two are global: two simulated ranks, each with half the rows, give the one-process loss.
"""

from __future__ import annotations

import types

import pytest
import torch

from lightning_grpo.algorithms import aggregate_loss
from lightning_grpo.algorithms.corrections import build_correction
from lightning_grpo.algorithms.objective import grpo_loss
from lightning_grpo.algorithms.peer_normalisers import peer_normalisers
from lightning_grpo.algorithms.policy_losses import policy_loss
from tests.algorithms.test_equivalence import _two_ranks
from tests.algorithms.test_trl_claims import _inputs, _settings, _trl_loss

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
rollout_corr_helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
trl = pytest.importorskip("trl")

LENGTHS = [7, 3, 0, 5, 1, 7, 4, 6]  # row 2 fully masked
T = 7


class _VerlActor(types.SimpleNamespace):
    """What verl's policy losses read of an ``ActorConfig`` (attributes and ``get``)."""

    def get(self, name, default=None):
        return getattr(self, name, default)


def _verl_actor() -> _VerlActor:
    return _VerlActor(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, global_batch_info={})


def _batch(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (len(LENGTHS), T)
    old = -torch.rand(shape, generator=generator, dtype=torch.float64) * 2
    return {
        "logprobs": old + 0.3 * torch.randn(shape, generator=generator, dtype=torch.float64),
        "old": old,
        "behaviour": old + 0.2 * torch.randn(shape, generator=generator, dtype=torch.float64),
        "advantages": torch.randn(len(LENGTHS), generator=generator, dtype=torch.float64),
        "mask": (torch.arange(T)[None] < torch.tensor(LENGTHS)[:, None]).double(),
    }


def _ours(x, settings, corrections=None, rows=slice(None), reduce=None):
    """Our loss of ``rows`` (one simulated rank when ``reduce`` sums over ranks), aggregated with global counts."""
    mask, logprobs = x["mask"][rows], {"old_logprobs": x["old"][rows], "behaviour_logprobs": x["behaviour"][rows]}
    local = torch.stack([mask.sum(), (mask.sum(-1) > 0).sum().double()])
    tokens, sequences = (local if reduce is None else reduce(local)).unbind()

    def aggregate(values: torch.Tensor) -> torch.Tensor:
        return aggregate_loss(values, mask, settings.loss_agg_mode, num_tokens=tokens, num_sequences=sequences)

    normalisers = None  # one process: grpo_loss counts the batch itself
    if reduce is not None:
        normalisers = peer_normalisers(mask, settings, corrections, sum_across_ranks=reduce, **logprobs)
    entropy = torch.zeros_like(mask)
    loss, _ = grpo_loss(
        x["logprobs"][rows],
        entropy,
        x["advantages"][rows],
        mask,
        settings,
        aggregate,
        corrections=corrections,
        normalisers=normalisers,
        **logprobs,
    )
    return loss


def _on_two_ranks(x, settings, corrections=None):
    half = len(LENGTHS) // 2
    halves = _two_ranks(
        lambda rank, reduce: _ours(x, settings, corrections, slice(rank * half, (rank + 1) * half), reduce)
    )
    return halves[0] + halves[1]


# ---------------------------------------------------------------- gmpo: rows


def _gmpo(rows: str | None, mode: str = "seq-mean-token-mean") -> types.SimpleNamespace:
    args = {"log_clip_low": 0.2, "log_clip_high": 0.2, **({"rows": rows} if rows else {})}
    return _settings(loss_kind="gmpo", loss_kind_args=args, loss_agg_mode=mode)


@pytest.mark.parametrize("seed", [0, 1])
def test_gmpo_rows_all_is_verls_geo_mean(seed):
    x = _batch(seed)
    mask = x["mask"]
    theirs, _ = core_algos.compute_policy_loss_geo_mean(
        x["old"], x["logprobs"], x["advantages"][:, None] * mask, mask, config=_verl_actor()
    )
    torch.testing.assert_close(_ours(x, _gmpo("all")), theirs, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(_on_two_ranks(x, _gmpo("all")), theirs, rtol=1e-6, atol=1e-9)  # global counts
    rows, with_tokens = len(LENGTHS), sum(n > 0 for n in LENGTHS)
    for default in (None, "with_tokens"):
        torch.testing.assert_close(_ours(x, _gmpo(default)), theirs * rows / with_tokens, rtol=1e-6, atol=1e-9)


def test_gmpo_rows_leaves_token_mean_alone():
    x = _batch(2)
    assert _ours(x, _gmpo("all", "token-mean")) == _ours(x, _gmpo(None, "token-mean"))


def test_gmpo_rejects_unknown_rows():
    with pytest.raises(ValueError, match="rows='every' is not valid; choose one of 'with_tokens', 'all'"):
        policy_loss(
            *[torch.zeros(2, 3)] * 2, torch.zeros(2), torch.ones(2, 3), kind="gmpo", kind_args={"rows": "every"}
        )


# ---------------------------------------------------------------- rollout rejection: normalise


def _rejection(normalise: str | None) -> types.SimpleNamespace:
    args = {"min": 1 / 1.1, "max": 1 / 0.9, **({"normalise": normalise} if normalise else {})}
    off = dict.fromkeys(("rollout_correction", "rollout_correction_args", "off_policy_mask", "off_policy_mask_args"))
    return types.SimpleNamespace(rollout_rejection="geometric", rollout_rejection_args=args, **off)


def _verl_rejected_loss(x, mode: str) -> torch.Tensor:
    """verl: ``seq_mean_k1`` rejection with ``"0.9_1.1"`` on the response mask, then its vanilla loss over it."""
    kept, _ = rollout_corr_helper.compute_rollout_rejection_mask(
        x["old"] - x["behaviour"], x["mask"], rollout_rs="seq_mean_k1", rollout_rs_threshold="0.9_1.1"
    )
    kept_mask = kept * x["mask"]
    assert 0 < kept_mask.sum() < x["mask"].sum()  # some rows rejected, some kept
    loss, _ = core_algos.compute_policy_loss_vanilla(
        x["old"], x["logprobs"], x["advantages"][:, None] * kept_mask, kept_mask, mode, config=_verl_actor()
    )
    return loss, kept_mask


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("seed", [3, 4])
def test_rejection_normalise_kept_is_verls_loss_over_its_kept_mask(mode, seed):
    x = _batch(seed)
    theirs, kept_mask = _verl_rejected_loss(x, mode)
    settings = _settings(dual_clip=3.0, loss_agg_mode=mode)
    torch.testing.assert_close(_ours(x, settings, _rejection("kept")), theirs, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(_on_two_ranks(x, settings, _rejection("kept")), theirs, rtol=1e-6, atol=1e-9)
    counted = (kept_mask.sum(), x["mask"].sum())
    if mode != "token-mean":
        counted = ((kept_mask.sum(-1) > 0).sum(), (x["mask"].sum(-1) > 0).sum())
    for default in (None, "all"):  # ours = verl × kept / all
        ours = _ours(x, settings, _rejection(default))
        torch.testing.assert_close(ours, theirs * counted[0] / counted[1], rtol=1e-6, atol=1e-9)


def test_rejection_rejects_unknown_normalise():
    with pytest.raises(ValueError, match="normalise='tokens' is not valid; choose one of 'all', 'kept'"):
        build_correction("rollout_rejection", "geometric", {"normalise": "tokens"})


# ---------------------------------------------------------------- top-entropy selection: entropy_over


def _top(quantile: float, entropy_over: str | None) -> dict[str, object]:
    args = {"quantile": quantile, **({"entropy_over": entropy_over} if entropy_over else {})}
    return {"token_selection": "top_entropy", "token_selection_args": args, "loss_agg_mode": "token-mean"}


def _ours_trl(x, settings) -> torch.Tensor:
    mask = x["mask"]
    token_mean = lambda values: aggregate_loss(values, mask, "token-mean")  # noqa: E731
    loss, _ = grpo_loss(x["logprobs"], x["entropy"], x["advantages"], mask, settings, token_mean, old_logprobs=x["old"])
    return loss


@pytest.mark.parametrize("quantile", [0.2, 0.5])
def test_entropy_over_selected_is_trls_bonus(quantile):
    x, coef = _inputs(1), 0.05
    theirs = _trl_loss(x, loss_type="bnpo", level="token", beta=0.0, entropy_coef=coef, quantile=quantile)
    ours = _ours_trl(x, _settings(entropy_coef=coef, **_top(quantile, "selected")))
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-9)
    their_grads = torch.autograd.grad(theirs, [x["logprobs"], x["entropy"]])
    for mine, their in zip(torch.autograd.grad(ours, [x["logprobs"], x["entropy"]]), their_grads, strict=True):
        torch.testing.assert_close(mine, their, rtol=1e-6, atol=1e-9)
    # the default: ours = TRL + coef · (bonus_sel − bonus_sel · selected / all)
    no_bonus = float(_trl_loss(x, loss_type="bnpo", level="token", beta=0.0, quantile=quantile).detach())
    one_process = types.SimpleNamespace(pad_across_processes=lambda t, **_: t, gather=lambda t: t)
    trainer = types.SimpleNamespace(accelerator=one_process)
    selected = trl.GRPOTrainer.get_high_entropy_mask(trainer, x["entropy"].detach(), x["mask"], 1 - quantile).double()
    their_bonus = (no_bonus - float(theirs.detach())) / coef
    for default in (None, "loss_tokens"):
        ours = _ours_trl(x, _settings(entropy_coef=coef, **_top(quantile, default))).detach()
        our_bonus = (no_bonus - float(ours)) / coef
        assert our_bonus == pytest.approx(their_bonus * float(selected.sum() / x["mask"].sum()), rel=1e-10)


def test_top_entropy_rejects_unknown_entropy_over():
    with pytest.raises(ValueError, match="entropy_over='all' is not valid; choose one of 'loss_tokens', 'selected'"):
        build_correction("token_selection", "top_entropy", {"entropy_over": "all"})
