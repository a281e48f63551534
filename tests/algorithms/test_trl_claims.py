"""The weighted KL under GSPO and the entropy bonus under top-entropy selection, against TRL 1.16's own loss.

TRL's ``GRPOTrainer._compute_loss`` runs unchanged on a stand-in trainer whose ``_get_per_token_logps_and_entropies``
returns fixed float64 tensors (current log-probs and entropies with gradient); our ``grpo_loss`` gets the same
tensors. Uneven masks, a fully masked row and off-policy old log-probs throughout.
"""

from __future__ import annotations

import collections
import types

import pytest
import torch

from lightning_grpo.algorithms.corrections import ImportanceWeightedKL
from lightning_grpo.algorithms.kl import kl_penalty
from lightning_grpo.algorithms.objective import grpo_loss

trl = pytest.importorskip("trl")

LENGTHS = [6, 2, 0, 5, 3, 6]  # a fully masked row included
T = 6


def _inputs(seed: int, lengths: list[int] = LENGTHS) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (len(lengths), T)
    old = -torch.rand(shape, generator=generator, dtype=torch.float64) * 2
    return {
        "logprobs": (old + 0.3 * torch.randn(shape, generator=generator, dtype=torch.float64)).requires_grad_(),
        "old": old,
        "ref": old + 0.2 * torch.randn(shape, generator=generator, dtype=torch.float64),
        "entropy": (torch.rand(shape, generator=generator, dtype=torch.float64) * 3).requires_grad_(),
        "advantages": torch.randn(len(lengths), generator=generator, dtype=torch.float64),
        "mask": (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).double(),
    }


def _trl_loss(x: dict[str, torch.Tensor], *, loss_type: str, level: str, beta: float, entropy_coef: float = 0.0,
              quantile: float = 1.0) -> torch.Tensor:  # fmt: skip
    """TRL's ``_compute_loss`` on a stand-in trainer (one process, one accumulation step, train mode)."""
    accelerator = types.SimpleNamespace(
        num_processes=1, sync_gradients=True, reduce=lambda t, reduction: t, gather=lambda t: t,
        gather_for_metrics=lambda t: t, pad_across_processes=lambda t, **_: t,
    )  # fmt: skip
    trainer = types.SimpleNamespace(
        accelerator=accelerator, top_entropy_quantile=quantile, aux_loss_enabled=False, off_policy_mask_threshold=None,
        importance_sampling_level=level, beta=beta, loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.2,
        use_vllm=False, model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        _entropy_bonus_enabled=entropy_coef != 0.0, entropy_coef=entropy_coef, use_adaptive_entropy=False,
        max_completion_length=T, _metrics=collections.defaultdict(lambda: collections.defaultdict(list)),
        args=types.SimpleNamespace(use_bias_correction_kl=True, delta=None, steps_per_generation=1),
        _get_per_token_logps_and_entropies=lambda *_, **__: (x["logprobs"], x["entropy"], None),
    )  # fmt: skip
    trainer.get_high_entropy_mask = types.MethodType(trl.GRPOTrainer.get_high_entropy_mask, trainer)
    n, mask = len(x["mask"]), x["mask"]
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long), "prompt_mask": torch.ones(n, 1),
        "completion_ids": torch.zeros(n, T, dtype=torch.long), "completion_mask": mask,
        "advantages": x["advantages"], "old_per_token_logps": x["old"], "ref_per_token_logps": x["ref"],
        "num_items_in_batch": mask.sum(),
    }  # fmt: skip
    return trl.GRPOTrainer._compute_loss(trainer, None, inputs)


def _settings(**overrides) -> types.SimpleNamespace:
    base = {
        "loss_kind": "clip", "loss_kind_args": None, "clip_low": 0.2, "clip_high": 0.2, "dual_clip": None,
        "delta": None, "kl_coef": 0.0, "kl_estimator": "k3", "kl_estimator_args": None, "entropy_coef": 0.0,
        **{name: None for name in ("rollout_correction", "rollout_rejection", "off_policy_mask", "kl_weighting",
                                   "token_selection")},
        **{f"{name}_args": None for name in ("rollout_correction", "rollout_rejection", "off_policy_mask",
                                             "kl_weighting", "token_selection")},
    }  # fmt: skip
    return types.SimpleNamespace(**{**base, **overrides})


def _top(quantile: float) -> dict[str, object]:
    return {"token_selection": "top_entropy", "token_selection_args": {"quantile": quantile}}


def _token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (per_token * mask).sum() / mask.sum()


def _seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    rows = mask.sum(-1)
    return ((per_token * mask).sum(-1) / rows.clamp(min=1)).sum() / (rows > 0).sum()


def _ours(x: dict[str, torch.Tensor], settings: types.SimpleNamespace, aggregate) -> torch.Tensor:
    mask = x["mask"]
    loss, _ = grpo_loss(x["logprobs"], x["entropy"], x["advantages"], mask, settings, lambda t: aggregate(t, mask),
                        old_logprobs=x["old"], ref_logprobs=x["ref"])  # fmt: skip
    return loss


def _value(loss: torch.Tensor) -> float:
    return float(loss.detach())


def _value_and_grad(loss: torch.Tensor, x: dict[str, torch.Tensor]) -> tuple[float, torch.Tensor]:
    (grad,) = torch.autograd.grad(loss, x["logprobs"])
    return float(loss.detach()), grad


# ---------------------------------------------------------------- claim 6: weighted KL under GSPO


def test_weighted_kl_under_gspo_is_trls_token_level_kl_not_its_sequence_level_one():
    """Our weighted KL multiplies by the token ratio whatever the loss; TRL at ``importance_sampling_level=
    "sequence"`` multiplies by the sequence ratio. No row is empty here, so TRL's ``grpo`` row mean is ours."""
    x = _inputs(0, [6, 2, 1, 5, 3, 6])
    settings = _settings(loss_kind="gspo", kl_coef=0.1, kl_weighting="importance")
    ours = _value_and_grad(_ours(x, settings, _seq_mean_token_mean), x)
    sequence_kl = _value_and_grad(_trl_loss(x, loss_type="grpo", level="sequence", beta=0.1), x)
    pg_only = _value_and_grad(_trl_loss(x, loss_type="grpo", level="sequence", beta=0.0), x)
    token_kl = _value_and_grad(_trl_loss(x, loss_type="grpo", level="token", beta=0.1), x)
    token_pg = _value_and_grad(_trl_loss(x, loss_type="grpo", level="token", beta=0.0), x)
    # ours = TRL's GSPO policy loss + TRL's token-level weighted KL
    assert ours[0] == pytest.approx(pg_only[0] + token_kl[0] - token_pg[0], rel=1e-10)
    torch.testing.assert_close(ours[1], pg_only[1] + token_kl[1] - token_pg[1], rtol=1e-8, atol=1e-12)
    assert abs(ours[0] - sequence_kl[0]) > 1e-5  # and not TRL's sequence-level KL
    assert float((ours[1] - sequence_kl[1]).abs().max()) > 1e-4


# ---------------------------------------------------------------- claim 7: entropy bonus under top-entropy selection


@pytest.mark.parametrize("quantile", [0.2, 0.5])
def test_entropy_bonus_under_top_entropy_divides_by_all_loss_tokens_trl_by_the_selected(quantile):
    """The policy loss and the entropy bonus act on the same selected tokens in both; TRL divides the bonus by the
    selected tokens, ours (``token-mean``) by all loss tokens: ours = TRL + coef·(H_sel/n_sel − H_sel/n_all)."""
    x = _inputs(1)
    coef = 0.05
    settings = _settings(entropy_coef=coef, **_top(quantile))
    ours = _value(_ours(x, settings, _token_mean))
    theirs = _value(_trl_loss(x, loss_type="bnpo", level="token", beta=0.0, entropy_coef=coef, quantile=quantile))
    no_bonus = _value(_trl_loss(x, loss_type="bnpo", level="token", beta=0.0, quantile=quantile))
    our_no_bonus = _value(_ours(x, _settings(**_top(quantile)), _token_mean))
    assert our_no_bonus == pytest.approx(no_bonus, rel=1e-10)  # the selected policy loss is TRL's
    selected = trl.GRPOTrainer.get_high_entropy_mask(
        types.SimpleNamespace(accelerator=types.SimpleNamespace(pad_across_processes=lambda t, **_: t,
                                                                gather=lambda t: t)),
        x["entropy"].detach(), x["mask"], 1 - quantile,
    ).double()  # fmt: skip
    their_bonus, our_bonus = (no_bonus - theirs) / coef, (our_no_bonus - ours) / coef
    assert their_bonus * selected.sum() / x["mask"].sum() == pytest.approx(our_bonus, rel=1e-10)
    assert abs(ours - theirs) > 1e-3
    on_all = _value(_ours(x, _settings(entropy_coef=coef), _token_mean))  # without selection the two agree
    assert on_all == pytest.approx(_value(_trl_loss(x, loss_type="bnpo", level="token", beta=0.0, entropy_coef=coef)))


def test_weighted_kl_at_sequence_level_is_trls_sequence_level_kl():
    """``kl_weighting: importance`` with ``level: sequence`` is TRL's GSPO KL (value and gradient)."""
    x = _inputs(0, [6, 2, 1, 5, 3, 6])
    mask, weighting = x["mask"], ImportanceWeightedKL(level="sequence")
    pg = _ours(x, _settings(loss_kind="gspo"), _seq_mean_token_mean)
    kl = weighting(kl_penalty(x["logprobs"], x["ref"], "k3"), x["logprobs"], x["old"], mask)
    ours = _value_and_grad(pg + 0.1 * _seq_mean_token_mean(kl, mask), x)
    theirs = _value_and_grad(_trl_loss(x, loss_type="grpo", level="sequence", beta=0.1), x)
    assert ours[0] == pytest.approx(theirs[0], rel=1e-10)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-8, atol=1e-12)
