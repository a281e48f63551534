"""Environments: observation normalisation, per-turn rewards, and errors naming the environment and the row."""

from __future__ import annotations

import math

import pytest

from lightning_grpo.agents import (
    EnvironmentEpisode,
    EnvironmentFailedError,
    EnvStep,
    aggregate_turn_rewards,
    normalize_observation,
    step_episodes,
)
from lightning_grpo.agents.environment import turn_reward_problem


class GuessNumber:
    def __init__(self, row):
        self.target = row["target"]
        self.tries = 0

    def reset(self):
        return "Guess a digit."

    def step(self, message):
        self.tries += 1
        guess = int(message["content"])  # raises on a non-number: a bug in this environment
        if guess == self.target:
            return EnvStep(observation=None, reward=1.0, done=True)
        hint = [{"role": "user", "content": "higher" if guess < self.target else "lower"}]
        return EnvStep(observation=hint, reward=None if self.tries == 1 else 0.0, done=self.tries >= 3)


ROW = {"prompt": [{"role": "user", "content": "Play the guessing game, please, " * 5}], "target": 7}


def say(text):
    return {"role": "assistant", "content": text}


def test_normalize_observation():
    assert normalize_observation(None) == []
    assert normalize_observation("hi") == [{"role": "user", "content": "hi"}]
    assert normalize_observation({"role": "tool", "content": "5"}) == [{"role": "tool", "content": "5"}]
    messages = [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]
    assert normalize_observation(messages) == messages
    with pytest.raises(ValueError, match="must be None, a string"):
        normalize_observation(3)
    with pytest.raises(ValueError, match=r"observation\[0\] has role 'robot'"):
        normalize_observation([{"role": "robot", "content": "x"}])


def test_episode_reset_step_and_rewards():
    episode = EnvironmentEpisode(GuessNumber, ROW, index=0)
    assert episode.reset() == [{"role": "user", "content": "Guess a digit."}]
    first = episode.step(say("3"))
    assert first == EnvStep(observation=[{"role": "user", "content": "higher"}], reward=None, done=False)
    second = episode.step(say("9"))
    assert second.observation[0]["content"] == "lower" and second.reward == 0.0 and not episode.done
    last = episode.step(say("7"))
    assert last.observation == [] and last.done and episode.done
    assert episode.rewards == [None, 0.0, 1.0]
    assert episode.reward("sum") == 1.0 and episode.reward("last") == 1.0


def test_environment_error_names_class_and_row():
    episode = EnvironmentEpisode(GuessNumber, ROW, index=12)
    with pytest.raises(EnvironmentFailedError) as info:
        episode.step(say("seven"))
    message = str(info.value)
    assert "Environment GuessNumber failed in step() for dataset row 12" in message
    assert "ValueError" in message and "Play the guessing game" in message
    assert len(message) < 400  # the prompt is an excerpt
    assert isinstance(info.value.__cause__, ValueError)


def test_factory_error_and_invalid_returns():
    def broken_factory(row):
        raise KeyError("target")

    with pytest.raises(EnvironmentFailedError, match="broken_factory failed in creation for dataset row 3"):
        EnvironmentEpisode(broken_factory, ROW, index=3)
    with pytest.raises(EnvironmentFailedError, match="has no reset"):
        EnvironmentEpisode(lambda row: object(), ROW, index=0)

    class ReturnsTuple(GuessNumber):
        def step(self, message):
            return ("obs", 1.0, True)

    with pytest.raises(EnvironmentFailedError, match="returned tuple; it must return an EnvStep"):
        EnvironmentEpisode(ReturnsTuple, ROW, index=0).step(say("1"))

    class BadObservation(GuessNumber):
        def reset(self):
            return [{"role": "narrator", "content": "x"}]

    with pytest.raises(EnvironmentFailedError, match=r"BadObservation failed in reset.*allowed roles"):
        EnvironmentEpisode(BadObservation, ROW, index=0).reset()


def test_step_episodes_concurrently_in_order():
    episodes = [EnvironmentEpisode(GuessNumber, {**ROW, "target": t}, index=i) for i, t in enumerate([1, 5])]
    steps = step_episodes(episodes, [say("5"), say("5")], max_workers=2)
    assert steps[0].observation[0]["content"] == "lower" and steps[1].done
    with pytest.raises(ValueError, match="one message per episode"):
        step_episodes(episodes, [say("1")])
    with pytest.raises(EnvironmentFailedError, match="row 1"):
        step_episodes(episodes, [say("1"), say("x")])


def test_aggregate_turn_rewards():
    assert aggregate_turn_rewards([1.0, None, 2.0], "sum") == 3.0
    assert aggregate_turn_rewards([1.0, 2.0, None], "last") == 2.0
    assert aggregate_turn_rewards([None, None], "sum") is None
    assert aggregate_turn_rewards([], "last") is None
    with pytest.raises(ValueError, match="'sum' or 'last'"):
        aggregate_turn_rewards([1.0], "mean")


@pytest.mark.parametrize("reward", [math.nan, math.inf, -math.inf, "1.0", True])
def test_a_step_reward_that_is_not_a_finite_number_is_refused_naming_it(reward):
    class Rewards(GuessNumber):
        def step(self, message):
            return EnvStep(observation=None, reward=reward, done=True)

    kind = "not finite" if isinstance(reward, float) else "not a number"
    with pytest.raises(EnvironmentFailedError, match=rf"Rewards failed in step\(\).*returned a reward .* is {kind}"):
        EnvironmentEpisode(Rewards, ROW, index=0).step(say("1"))


def test_the_step_check_is_the_one_the_per_turn_credit_uses():
    assert turn_reward_problem(math.nan) == "reward nan is not finite"
    assert turn_reward_problem(2) == turn_reward_problem(None) == turn_reward_problem(0.5) == ""
