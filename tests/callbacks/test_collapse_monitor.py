"""CollapseMonitor: a run that collapses on purpose is caught once, with its cause; convergence is not a collapse."""

from __future__ import annotations

import warnings

import pytest

from lightning_grpo.callbacks import CollapseMonitor
from tests.callbacks.helpers import Recorder, first_char_code, fit
from tests.conftest import tiny_sampling


def _collapsing_after(step: int, floor: float):
    """A reward with signal (varies within groups) until ``step``, then the same ``floor`` for every sample."""

    def reward(prompts, completions, trainer_state, **_):
        if trainer_state.global_step < step:
            return first_char_code(prompts, completions)
        return [floor] * len(completions)

    return reward


def _collapse_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "has collapsed" in str(w.message)]


def _fit_with(make_module, reward, iterations: int, monitor: CollapseMonitor) -> Recorder:
    module = make_module(reward_funcs=[reward], sampling=tiny_sampling(num_generations=4, max_new_tokens=4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, recorder = fit(module, [monitor], iterations=iterations)
    recorder.warnings = _collapse_warnings(caught)
    return recorder


def test_a_run_that_collapses_is_caught_once_after_patience_steps(make_module):
    monitor = CollapseMonitor(patience=2)
    recorder = _fit_with(make_module, _collapsing_after(3, floor=0.0), iterations=8, monitor=monitor)
    flags = [float(m["train/collapse"]) for m in recorder.metrics]
    # steps 0-2 have signal; 3 and 4 are the two no-signal steps below the peak; the flag is up from the second on
    assert flags == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert len(recorder.warnings) == 1  # once, however long the collapse lasts
    message = recorder.warnings[0]
    assert "for the last 2 iterations every group had equal rewards" in message
    assert "at a mean reward of 0, down from" in message
    assert "lower learning rate" in message and "num_generations" in message and "max_new_tokens" in message


def test_a_run_that_solves_its_task_is_not_a_collapse(make_module):
    # every sample right from step 3 on: no signal either, but at the best reward of the run (convergence)
    monitor = CollapseMonitor(patience=2)
    recorder = _fit_with(make_module, _collapsing_after(3, floor=10.0), iterations=7, monitor=monitor)
    assert [float(m["train/collapse"]) for m in recorder.metrics] == [0.0] * 7
    assert recorder.warnings == []


@pytest.mark.parametrize(
    ("truncated", "entropy", "cut_before_step", "expected"),
    [
        (0.9, 0.5, 0.0, "Most trajectories ran into the token budget (90% cut)"),
        (0.6, 0.5, 0.25, "(60% cut, 25% before their environment stepped)"),
        (0.1, 0.001, 0.0, "token entropy is 0.001: it samples nearly the same completion"),
        (0.1, 0.4, 0.0, "The samples all fail in the same way (token entropy 0.4, 10% cut)"),
    ],
)
def test_the_cause_is_named_from_the_rollout(truncated, entropy, cut_before_step, expected):
    monitor = CollapseMonitor()
    monitor.peak, monitor.peak_step, monitor.streak = 0.8, 12, 3
    message = monitor.message(0.0, entropy, truncated, cut_before_step)
    assert expected in message and "down from 0.8 at step 12" in message


def test_state_survives_a_checkpoint():
    monitor = CollapseMonitor()
    monitor.peak, monitor.peak_step, monitor.streak, monitor.warned = 0.7, 5, 2, True
    restored = CollapseMonitor()
    restored.load_state_dict(monitor.state_dict())
    assert (restored.peak, restored.peak_step, restored.streak, restored.warned) == (0.7, 5, 2, True)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"patience": 0}, ValueError, "patience"),
        ({"min_drop": -1.0}, ValueError, "min_drop must be a finite number >= 0"),
        ({"min_entropy": float("nan")}, ValueError, "min_entropy must be a finite number >= 0"),
        ({"prefix": 3}, TypeError, "prefix"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        CollapseMonitor(**kwargs)


def test_trajectories_cut_before_their_environment_stepped_are_counted(tokenizer):
    from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
    from lightning_grpo.config import AgentConfig, SamplingConfig
    from lightning_grpo.testing.agents import CountdownEnv, short_turn_model

    def env_score(completions, env_reward, **_):
        return [0.0 if r is None else float(r) for r in env_reward]

    grpo = GRPOConfig(
        sampling=SamplingConfig(num_generations=2, max_new_tokens=6, max_prompt_length=32),
        agents=AgentConfig(max_turns=3),
    )
    module = GRPOModule(
        short_turn_model(tokenizer, eos_bias=-50.0), [env_score], tokenizer=tokenizer, grpo=grpo,
        policy=PolicyConfig(lora_r=2, lora_alpha=4), environment_factory=CountdownEnv,
    )  # fmt: skip
    rollout = module.generate({"prompt": [[{"role": "user", "content": "go"}]], "turns": [2]})
    reward, no_signal, truncated, cut_before_step = CollapseMonitor._iteration_stats(rollout, module.score(rollout))
    # EOS is all but impossible: each first turn runs into the 6-token budget, so no environment ever stepped
    assert (reward, no_signal, truncated, cut_before_step) == (0.0, True, 1.0, 1.0)
