"""The off-policy corrections as components: each built-in equals its function, and bad settings are refused."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.algorithms.corrections import build_correction
from lightning_grpo.algorithms.entropy import top_entropy_mask
from lightning_grpo.algorithms.kl import importance_weighted_kl
from lightning_grpo.algorithms.off_policy import off_policy_masked
from lightning_grpo.algorithms.rollout_correction import rollout_correct


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(5, 6, generator=generator, dtype=torch.float64)
    return {
        "per_token": torch.randn(5, 6, generator=generator, dtype=torch.float64),
        "old": old,
        "behaviour": old + 0.3 * torch.randn(5, 6, generator=generator, dtype=torch.float64),
        "mask": (torch.arange(6)[None] < torch.tensor([6, 2, 0, 4, 5])[:, None]).double(),
        "advantages": torch.randn(5, generator=generator, dtype=torch.float64),
    }


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_rollout_corrections_are_their_modes(mode):
    x = _tensors()
    component = build_correction("rollout_correction", mode, {"min": 0.8, "max": 1.3})
    got, metrics = component(x["per_token"], x["old"], x["behaviour"], x["mask"])
    want, expected = rollout_correct(x["per_token"], x["old"], x["behaviour"], x["mask"], (mode, 0.8, 1.3),
                                     (None, 0.0, 0.0))  # fmt: skip
    torch.testing.assert_close(got, want)
    assert metrics.keys() == expected.keys() and not torch.equal(got, x["per_token"])


@pytest.mark.parametrize("statistic", ["token_mean", "geometric"])
def test_rejections_are_their_statistics(statistic):
    x = _tensors(1)
    got, metrics = build_correction("rollout_rejection", statistic, {"min": 0.9, "max": 1.1})(
        x["per_token"], x["old"], x["behaviour"], x["mask"]
    )
    want, _ = rollout_correct(x["per_token"], x["old"], x["behaviour"], x["mask"], (None, None, None),
                              (statistic, 0.9, 1.1))  # fmt: skip
    torch.testing.assert_close(got, want)
    assert 0 < metrics["rollout_rs_rejected_seq_frac"][0] < metrics["rollout_rs_rejected_seq_frac"][1]


def test_opsm_kl_weighting_and_top_entropy_are_their_functions():
    x = _tensors(2)
    current = x["old"] + 0.2
    got, _ = build_correction("off_policy_mask", "opsm", {"threshold": 0.1})(
        x["per_token"], x["advantages"], current, x["behaviour"], x["mask"]
    )
    want, _ = off_policy_masked(x["per_token"], x["advantages"], current, x["behaviour"], x["mask"], 0.1)
    torch.testing.assert_close(got, want)
    kl = torch.rand(5, 6, dtype=torch.float64)
    weighted = build_correction("kl_weighting", "importance", None)(kl, current, x["old"], x["mask"])
    torch.testing.assert_close(weighted, importance_weighted_kl(kl, current, x["old"]))
    sequence = build_correction("kl_weighting", "importance", {"level": "sequence"})(kl, current, x["old"], x["mask"])
    shift = torch.exp(torch.tensor(0.2, dtype=torch.float64))  # every token's log-ratio is 0.2
    torch.testing.assert_close(sequence * x["mask"], kl * shift * x["mask"])
    entropy = torch.rand(5, 6, dtype=torch.float64)
    selected = build_correction("token_selection", "top_entropy", None)(entropy, x["mask"])  # the paper's 0.2
    torch.testing.assert_close(selected, top_entropy_mask(entropy, x["mask"], 0.2).double())


@pytest.mark.parametrize(
    ("setting", "name", "args", "message"),
    [
        ("rollout_correction", "token_clip", None, "unknown rollout correction 'token_clip'; valid names: "
         "'token_truncate', 'token_mask', 'sequence_truncate', 'sequence_mask'"),
        ("rollout_correction", "token_truncate", {"min": None, "max": None}, "token_truncate truncates the weights"),
        ("rollout_correction", "token_mask", {"min": 2.0, "max": 1.0}, "min=2.0 > max=1.0: the band is empty"),
        ("rollout_correction", "token_mask", {"cap": 2.0}, "takes no setting 'cap'; its settings: min, max"),
        ("rollout_rejection", "geometric", {"max": 0.0}, "geometric: max=0.0 must be > 0"),
        ("off_policy_mask", "opsm", None, "needs the setting\\(s\\) threshold"),
        ("off_policy_mask", "opsm", {"threshold": -1.0}, "threshold=-1.0 must be a finite number >= 0"),
        ("kl_weighting", "importance", {"level": "row"}, "level='row' is not valid; choose one of 'token'"),
        ("token_selection", "top_entropy", {"quantile": 0.0}, "quantile=0.0 must be in \\(0, 1\\]"),
        ("token_selection", None, {"quantile": 0.5}, "token_selection_args=.* is set but token_selection is null"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_naming_them(setting, name, args, message):
    with pytest.raises(ValueError, match=message):
        build_correction(setting, name, args)
