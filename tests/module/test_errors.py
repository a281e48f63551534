"""Bad input fails early with a message naming the setting, the function or the row."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.config import GROUPS, UpdateConfig
from lightning_grpo.rewards import RewardError
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer
from tests.conftest import make_trainer, prompt_loader, tiny_sampling


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"sampling": {"num_generations": 1}},
            r"GRPOConfig.sampling.num_generations=1: the group estimator advantages.advantage_estimator='grpo' needs "
            r"num_generations >= 2",
        ),
        (
            {"sampling": {"num_generations": 1}, "advantages": {"advantage_estimator": "rloo"}},
            r"group estimator advantages.advantage_estimator='rloo'",
        ),
        (
            {"update": {"mini_batch_size": 6, "micro_batch_size": 4}},
            r"GRPOConfig.update.mini_batch_size=6 must be a multiple of micro_batch_size=4",
        ),
        (
            {"objective": {"loss_kind": "ppo"}},
            r"GRPOConfig.objective.loss_kind='ppo' is not valid; choose one of 'clip', 'gspo', 'cispo'",
        ),
        (
            {"objective": {"kl_estimator": "k4"}},
            r"GRPOConfig.objective.kl_estimator='k4' is not valid; choose one of .*'low_var_kl'",
        ),
        (
            {"objective": {"loss_agg_mode": "mean"}},
            r"GRPOConfig.objective.loss_agg_mode='mean' is not valid; choose one of 'token-mean'",
        ),
        (
            {"advantages": {"advantage_estimator": "gae"}},
            r"GRPOConfig.advantages.advantage_estimator='gae' is not valid; choose one of 'grpo', 'rloo'",
        ),
        (
            {"advantages": {"advantage_scale": "global"}},
            r"GRPOConfig.advantages.advantage_scale='global' is not valid; choose one of 'group', 'batch'",
        ),
        ({"update": {"ppo_epochs": 0}}, r"GRPOConfig.update.ppo_epochs must be an integer >= 1, got 0"),
        ({"sampling": {"max_new_tokens": 0}}, r"GRPOConfig.sampling.max_new_tokens must be an integer >= 1, got 0"),
        ({"sampling": {"temperature": 0.0}}, r"GRPOConfig.sampling.temperature must be a finite number > 0.0, got 0.0"),
        ({"sampling": {"top_p": 1.5}}, r"GRPOConfig.sampling.top_p must be a finite number in \(0.0, 1.0\], got 1.5"),
        (
            {"objective": {"clip_low": 1.0}},
            r"GRPOConfig.objective.clip_low must be a finite number in \[0.0, 1.0\), got 1.0",
        ),
        (
            {"objective": {"dual_clip": 0.5}},
            r"GRPOConfig.objective.dual_clip must be a finite number > 1.0 or None, got 0.5",
        ),
        ({"objective": {"delta": 1.1}}, r"GRPOConfig.objective.delta must be a finite number > 1.2 or None, got 1.1"),
        ({"objective": {"kl_coef": -1.0}}, r"GRPOConfig.objective.kl_coef must be a finite number >= 0.0, got -1.0"),
        (
            {"update": {"max_grad_norm": 0.0}},
            r"GRPOConfig.update.max_grad_norm must be a finite number > 0.0 or None, got 0.0",
        ),
        (
            {"update": {"micro_batch_size": 0}},
            r"GRPOConfig.update.micro_batch_size must be an integer >= 1 or None, got 0",
        ),
    ],
)
def test_invalid_settings_fail_at_construction(settings, message):
    """Each group given as a mapping (``GRPOConfig`` builds it), so that the error is raised inside the test."""
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**settings)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"lora_r": 0}, r"PolicyConfig.lora_r must be an integer >= 1, got 0"),
        ({"lora_dropout": 1.0}, r"PolicyConfig.lora_dropout must be a finite number in \[0.0, 1.0\), got 1.0"),
        ({"dtype": "int8"}, r"PolicyConfig.dtype must be one of 'auto', 'float32', 'bfloat16', 'float16'; got 'int8'"),
    ],
)
def test_invalid_policy_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        PolicyConfig(**settings)


def test_model_of_the_wrong_type_and_missing_tokenizer(tokenizer):
    with pytest.raises(TypeError, match="model must be a Hugging Face id, a local path or a PreTrainedModel"):
        GRPOModule(torch.nn.Linear(2, 2), [lambda p, c: [0.0] * len(c)], tokenizer=tokenizer)
    with pytest.raises(ValueError, match="pass tokenizer= when the model is given as an object"):
        GRPOModule(build_tiny_model(tokenizer), [lambda p, c: [0.0] * len(c)])


def test_tokenizer_without_pad_token_gets_eos_without_resizing():
    tokenizer = build_tiny_tokenizer(with_pad=False)
    model = build_tiny_model(build_tiny_tokenizer())
    vocab = model.get_input_embeddings().weight.shape[0]
    module = GRPOModule(model, [lambda p, c: [0.0] * len(c)], tokenizer=tokenizer)
    assert module.tokenizer.pad_token == module.tokenizer.eos_token
    assert module.policy.get_input_embeddings().weight.shape[0] == vocab


def test_only_adapter_parameters_are_trainable(make_module):
    module = make_module()
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert all(p.requires_grad for group in module.configure_optimizers().param_groups for p in group["params"])


def test_rollout_that_mini_batches_do_not_divide_fails_at_the_first_step(make_module):
    module = make_module(
        sampling=tiny_sampling(num_generations=3), update=UpdateConfig(mini_batch_size=4)
    )  # 2 prompts x 3 = 6 completions
    with pytest.raises(ValueError, match=r"rollout has 6 completions .* multiple of update.mini_batch_size=4"):
        make_trainer(max_steps=1).fit(module, train_dataloaders=prompt_loader(["1+1=", "2+2="]))


def test_a_batch_size_mismatch_fails_at_fit_start_before_any_rollout(make_module):
    scored: list[int] = []

    def record(completions, **_):
        scored.append(len(completions))
        return [0.0] * len(completions)

    module = make_module(
        (record,), sampling=tiny_sampling(num_generations=3), update=UpdateConfig(mini_batch_size=4)
    )  # batch of 2 prompts x 3 = 6
    with pytest.raises(ValueError, match=r"6 completions .* multiple of update.mini_batch_size=4"):
        make_trainer(max_steps=1).fit(module, train_dataloaders=prompt_loader(["1+1=", "2+2="]))
    assert scored == []  # found from the data's batch size, before sampling and scoring


def test_a_failing_reward_function_stops_training_with_its_name(make_module):
    def flaky(prompts, completions, **_):
        raise ZeroDivisionError("boom")

    module = make_module(reward_funcs=[flaky])
    with pytest.raises(RewardError, match=r"reward function 'flaky' raised ZeroDivisionError: boom"):
        make_trainer(max_steps=1).fit(module, train_dataloaders=prompt_loader(["1+1=", "2+2="]))


def test_a_nan_reward_names_the_function_and_row(make_module):
    def bad(prompts, completions, **_):
        return [0.0] * (len(completions) - 1) + [float("nan")]

    module = make_module(reward_funcs=[bad])
    with pytest.raises(RewardError, match=r"'bad'.*row 7"):
        make_trainer(max_steps=1).fit(module, train_dataloaders=prompt_loader(["1+1=", "2+2="]))


def test_a_reward_of_the_wrong_length_names_the_function(make_module):
    module = make_module(reward_funcs=[lambda prompts, completions: [1.0]])
    with pytest.raises(RewardError, match=r"'lambda'.*expected 8, got 1"):
        make_trainer(max_steps=1).fit(module, train_dataloaders=prompt_loader(["1+1=", "2+2="]))


def test_a_batch_without_prompts_is_an_error(make_module):
    module = make_module()
    with pytest.raises(
        KeyError, match=r"a batch must have a 'prompt' key \(strings or chat messages\); got keys \['question'\]"
    ):
        module.generate({"question": ["1+1="]})


def _float_settings(config_class) -> list[str]:
    """Every setting of ``config_class`` whose default is a float (not a bool)."""
    return [f.name for f in dataclasses.fields(config_class) if type(f.default) is float]


@pytest.mark.parametrize(
    "place", [f"{group}.{name}" for group, kind in GROUPS.items() for name in _float_settings(kind)]
)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_every_float_setting_refuses_nan_and_infinity_naming_it(place, bad):
    group, name = place.split(".")
    with pytest.raises(ValueError, match=rf"GRPOConfig\.{group}\.{name}\b.*must be .*got {bad}"):
        GRPOConfig(**{group: {name: bad}})


@pytest.mark.parametrize("name", _float_settings(PolicyConfig))
def test_every_float_policy_setting_refuses_nan(name):
    with pytest.raises(ValueError, match=rf"{name}\b.*must be .*got nan"):
        PolicyConfig(**{name: float("nan")})


@pytest.mark.parametrize(
    ("place", "value"),
    [("sampling.num_generations", "8"), ("objective.kl_coef", "0.1"), ("sampling.max_new_tokens", 2.5)],
)
def test_a_setting_of_the_wrong_type_is_named(place, value):
    group, name = place.split(".")
    with pytest.raises((TypeError, ValueError), match=rf"GRPOConfig\.{group}\.{name}\b.*must be"):
        GRPOConfig(**{group: {name: value}})
