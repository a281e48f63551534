"""Step rewards on tokens: character offsets to token positions (exactly, byte-level BPE included), environment
turn ends, and the ``(N, T)`` tensor ``grpo_process`` reads (docs/math.md, "Process supervision")."""

from __future__ import annotations

import math

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from lightning_grpo.rewards import StepRewards
from lightning_grpo.rollout import Rollout
from lightning_grpo.rollout.process_supervision import completion_step_text, step_rewards_tensor, token_ends
from lightning_grpo.testing.agents import short_turn_model
from tests.rollout.test_multi_turn import _env_rollout, _runs

NAN = math.nan


@pytest.fixture(scope="module")
def byte_bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2's scheme) trained in code: merged words, and unseen characters as single bytes."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<eos>", "<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    core.train_from_iterator(["hello world, step one. step two!"] * 50, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<pad>")


def _oracle(tokenizer: PreTrainedTokenizerFast, text: str, end: int) -> int:
    """The last token that starts before character ``end`` (the tokenizer's own offsets): an independent answer.

    It holds the step's last character, whole or its last byte (every byte token of a character has its span).
    """
    offsets = tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
    return max(k for k, (start, _) in enumerate(offsets) if start < end)


@pytest.mark.parametrize(
    ("text", "ends"),
    [
        ("hello world", [3, 5, 6, 11]),  # inside "hello", its end, inside " world", the end: merged tokens
        ("hé€🙂 step one", [1, 2, 3, 4, 9, 13]),  # 2-, 3- and 4-byte characters, each split over byte tokens
        ("step🙂step", [4, 5, 9]),
    ],
)
def test_character_ends_map_to_the_token_that_completes_them(byte_bpe, text, ends):
    ids = byte_bpe(text)["input_ids"]
    assert byte_bpe.decode(ids) == text
    multi_byte = [k for k in range(len(ids)) if "\ufffd" in byte_bpe.decode(ids[: k + 1])]
    assert multi_byte or text == "hello world"  # partial characters decode to U+FFFD: the hard case is present
    got = token_ends(byte_bpe, [*ids, byte_bpe.eos_token_id], text, ends)
    assert got == [_oracle(byte_bpe, text, end) for end in ends]


def test_a_four_byte_character_ends_on_its_last_byte(byte_bpe):
    text = "ab🙂c"
    ids = byte_bpe(text)["input_ids"]
    emoji = [k for k, (start, stop) in enumerate(byte_bpe(text, return_offsets_mapping=True)["offset_mapping"])
             if (start, stop) == (2, 3)]  # fmt: skip
    assert len(emoji) == 4  # one token per UTF-8 byte
    assert token_ends(byte_bpe, ids, text, [2, 3, 4]) == [emoji[0] - 1, emoji[-1], emoji[-1] + 1]


def test_the_character_tokenizer_maps_one_to_one(tokenizer):
    text = "12+3\n4"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert token_ends(tokenizer, ids, text, list(range(1, 7))) == list(range(6))


def test_ends_outside_or_text_that_does_not_match_are_refused(tokenizer):
    ids = tokenizer("abc", add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match="outside the completion's 3 characters"):
        token_ends(tokenizer, ids, "abc", [4])
    with pytest.raises(ValueError, match="does not reproduce its text"):
        token_ends(tokenizer, ids, "abd", [3])


def test_multi_turn_completions_take_no_character_steps():
    assert completion_step_text("x") == "x"
    assert completion_step_text([{"role": "assistant", "content": "y"}]) == "y"
    with pytest.raises(ValueError, match="single-turn"):
        completion_step_text([{"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}])


def _single_turn(tokenizer, completions: list[str]) -> Rollout:
    rows = [tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for c in completions]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    n = len(rows)
    return Rollout(
        torch.ones(n, 1, dtype=torch.long), torch.ones(n, 1, dtype=torch.long), ids, mask,
        torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.long), ["p"] * n, completions,
    )  # fmt: skip


def test_function_steps_are_weighted_and_steps_on_one_token_sum(tokenizer):
    rollout = _single_turn(tokenizer, ["ab\ncd", "xy"])
    steps = {
        "f": [StepRewards([1.0, 2.0], [3, 5]), None],  # "ab\n" ends at token 2, "cd" at 4
        "g": [StepRewards([10.0], [5]), StepRewards([4.0], [1])],  # ends at token 4 (with f's) and token 0
    }
    got = step_rewards_tensor(tokenizer, rollout, steps, {"f": 0.5, "g": 0.1})
    # Row 0: token 2 = 0.5 * 1; token 4 = 0.5 * 2 + 0.1 * 10 = 2. Row 1: token 0 = 0.1 * 4. Everything else NaN.
    expected = torch.full((2, 6), NAN)
    expected[0, 2], expected[0, 4], expected[1, 0] = 0.5, 2.0, 0.4
    torch.testing.assert_close(got, expected, equal_nan=True)
    with pytest.raises(ValueError, match="reward function 'f', row 1: step ends \\[3\\] lie outside"):
        step_rewards_tensor(tokenizer, rollout, {"f": [None, StepRewards([1.0], [3])]}, {"f": 1.0})


def test_environment_turn_rewards_end_at_the_last_token_of_the_judged_turn(tokenizer):
    rollout = _env_rollout(tokenizer, short_turn_model(tokenizer))  # CountdownEnv: 1 and 3 turns, reward = length
    turns = rollout.turns
    assert [len(e) for e in turns.turn_ends] == [len(r) for r in turns.turn_rewards] == [1, 1, 3, 3]
    got = step_rewards_tensor(tokenizer, rollout, {}, {})
    for i in range(len(rollout)):
        length = int(rollout.completion_lengths[i])
        policy_turns = _runs(rollout.sampled_mask[i, :length], 1)  # (start, end) of each sampled run
        assert turns.turn_ends[i] == [end - 1 for _, end in policy_turns]  # the last sampled token of each turn
        assert all(int(rollout.completion_ids[i, end]) == tokenizer.eos_token_id for end in turns.turn_ends[i])
        expected = torch.full((rollout.completion_ids.shape[1],), NAN)
        expected[turns.turn_ends[i]] = torch.tensor(turns.turn_rewards[i])
        torch.testing.assert_close(got[i], expected, equal_nan=True)
    rollout.turns.turn_rewards[1][0] = math.nan  # an environment that returned NaN for a turn
    with pytest.raises(ValueError, match="row 1, turn 0: the environment's reward nan is not finite"):
        step_rewards_tensor(tokenizer, rollout, {}, {})
