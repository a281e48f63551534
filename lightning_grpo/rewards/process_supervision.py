"""Process supervision in the rewards layer: step rewards (:class:`StepRewards`) and the process reward model.

Process supervision has one file per layer, each named ``process_supervision.py`` (the same feature in four
layers): ``algorithms`` (the advantages), ``rewards`` (:class:`~lightning_grpo.rewards.StepRewards`, the process reward
model), ``rollout`` (step ends as token positions) and ``iteration`` (gathering the step rewards of one GRPO iteration).

**Step rewards.** A reward function for process supervision (``advantage_estimator: grpo_process``,
``docs/math.md``) returns, for a completion, a :class:`StepRewards` instead of a number: one reward per step and where
each step ends, as a character offset into the completion's text, so no one writes token arithmetic. The module turns
the offsets into token positions once, exactly (:mod:`lightning_grpo.rollout.process_supervision`). Mark such a
function with :func:`step_reward` so that fitting can check, before the first step, that ``grpo_process`` has step
rewards to work with. Under an outcome estimator (``grpo``, ``rloo``, ...) a :class:`StepRewards` counts as the sum of
its step rewards.

**Process reward models.** :class:`ProcessRewardModel` is a classifier scoring each step of a completion, as a reward
function for ``grpo_process``. The completion is cut into steps at a separator (``"\\n"`` by default,
:meth:`StepRewards.split`); each step is scored on the text up to its end (the prompt, then the completion's first
steps), and the function returns one :class:`StepRewards` per completion. Two kinds of Hugging Face models serve:

* ``...ForTokenClassification`` (Math-Shepherd style): one forward over the whole text; a step's score is read at the
  model's own token that holds the step's last character.
* ``...ForSequenceClassification``: one forward per step prefix (batched); a step's score is the prefix's score.

A model with one label scores with its logit; with several, with the probability of ``label`` (the "good step"
class). See ``docs/math.md`` ("Process supervision").
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from lightning_grpo.rewards._text import completion_text

__all__ = ["ProcessRewardModel", "StepRewards", "gives_step_rewards", "step_reward"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class StepRewards:
    """The step rewards of one completion: step ``k`` is ``text[ends[k-1]:ends[k]]`` and earns ``rewards[k]``.

    Args:
        rewards: One finite reward per step.
        ends: Where each step ends, as character offsets into the completion text (exclusive), strictly increasing,
            each in ``1..len(text)``; the first step starts at 0. Text after the last end belongs to no step (its
            tokens get advantage 0 unless an outcome reward is added, ``GRPOConfig.advantages.process_outcome_weight``).

    Raises:
        ValueError: Lengths differ, an end is not an integer, the ends do not increase, or a reward is not finite.

    Example::

        >>> text = "2+3=5\\n5*2=10\\n"
        >>> StepRewards([1.0, 0.0], [6, 13]) == StepRewards.split(text, [1.0, 0.0])  # "2+3=5\\n", "5*2=10\\n"
        True
    """

    rewards: tuple[float, ...]
    ends: tuple[int, ...]

    def __init__(self, rewards: Sequence[float], ends: Sequence[int]) -> None:
        rewards, ends = tuple(rewards), tuple(ends)
        if len(rewards) != len(ends):
            raise ValueError(f"StepRewards needs one end per reward; got {len(rewards)} rewards and {len(ends)} ends")
        for reward in rewards:
            if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
                raise ValueError(f"step rewards must be finite numbers; got {reward!r} in {list(rewards)}")
        for end in ends:
            if isinstance(end, bool) or not isinstance(end, numbers.Integral):
                raise ValueError(f"step ends must be integer character offsets; got {end!r} in {list(ends)}")
        if any(b <= a for a, b in zip((0, *ends), ends, strict=False)):
            raise ValueError(f"step ends must be strictly increasing character offsets >= 1; got {list(ends)}")
        object.__setattr__(self, "rewards", tuple(float(r) for r in rewards))
        object.__setattr__(self, "ends", tuple(int(e) for e in ends))

    @classmethod
    def split(cls, text: str, rewards: Sequence[float], separator: str = "\n") -> StepRewards:
        """Steps of ``text`` cut after each ``separator`` (kept with the step before it), one reward per step.

        Text after the last separator is one more step when it is not empty. ``rewards`` must have one entry per step.

        Raises:
            ValueError: The number of rewards is not the number of steps, or ``separator`` is empty.
        """
        if not separator:
            raise ValueError("separator must be a non-empty string")
        ends, start = [], 0
        while (found := text.find(separator, start)) >= 0:
            start = found + len(separator)
            ends.append(start)
        if start < len(text):
            ends.append(len(text))
        if len(rewards) != len(ends):
            raise ValueError(f"the text has {len(ends)} steps cut at {separator!r}; got {len(rewards)} rewards")
        return cls(rewards, ends)

    @property
    def total(self) -> float:
        """The sum of the step rewards: the value of the completion under an outcome estimator."""
        return math.fsum(self.rewards)

    def check_within(self, length: int, where: str) -> None:
        """Raise a ``ValueError`` naming ``where`` when the last end lies beyond a text of ``length`` characters."""
        if self.ends and self.ends[-1] > length:
            raise ValueError(f"{where}: step ends {list(self.ends)} lie outside the completion's {length} characters")


def step_reward(function: F) -> F:
    """Mark a reward function that returns :class:`StepRewards`, so ``grpo_process`` knows at fit start it has steps.

    Example::

        >>> @step_reward
        ... def each_line(completions, **kwargs):
        ...     return [StepRewards.split(c, [1.0] * c.count("\\n")) for c in completions]
        >>> gives_step_rewards(each_line)
        True
    """
    function.gives_step_rewards = True  # type: ignore[attr-defined]
    return function


def gives_step_rewards(function: Any) -> bool:
    """Whether a reward function is marked as returning :class:`StepRewards` (:func:`step_reward`)."""
    return getattr(function, "gives_step_rewards", False) is True


_KINDS = ("ForTokenClassification", "ForSequenceClassification")


class ProcessRewardModel:
    """A token- or sequence-classification model that scores each step of each completion.

    Args:
        model: A loaded ``AutoModelForTokenClassification`` or ``AutoModelForSequenceClassification``.
        tokenizer: Its tokenizer (a fast one for token classification: the step ends are found by its offsets).
        separator: Ends a step (kept with the step before it); text after the last one is one more step.
        label: With several labels, the class whose probability is the score; ignored with one label.
        batch_size: Sequences per forward pass.
        name: The name its rewards are logged under.

    Raises:
        ValueError: The model is of another kind, or ``label`` is not one of its classes.

    Example::

        from transformers import AutoModelForTokenClassification, AutoTokenizer
        from lightning_grpo.rewards import ProcessRewardModel

        prm = ProcessRewardModel(AutoModelForTokenClassification.from_pretrained(path),
                                 AutoTokenizer.from_pretrained(path), separator="\\n", label=1)
        advantages = AdvantageConfig(advantage_estimator="grpo_process")
        module = GRPOModule(policy_id, [prm], grpo=GRPOConfig(advantages=advantages))
    """

    gives_step_rewards = True  # lightning_grpo.rewards.step_reward's mark

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        separator: str = "\n",
        label: int = 1,
        batch_size: int = 8,
        name: str = "process_reward_model",
    ) -> None:
        kind = next((k for k in _KINDS if type(model).__name__.endswith(k)), None)
        if kind is None:
            raise ValueError(
                f"a process reward model must be a ...{_KINDS[0]} or ...{_KINDS[1]} model; got {type(model).__name__}"
            )
        num_labels = int(model.config.num_labels)
        if num_labels > 1 and not 0 <= label < num_labels:
            raise ValueError(f"label={label} is not a class of the model, which has {num_labels} labels")
        if not separator:
            raise ValueError("separator must be a non-empty string")
        self.model, self.tokenizer, self.token_level = model.eval().requires_grad_(False), tokenizer, kind == _KINDS[0]
        self.separator, self.label, self.batch_size, self.name = separator, label, batch_size, name
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = tokenizer.pad_token_id

    def place(self, device: torch.device | str, dtype: torch.dtype | None = None) -> None:
        """Move the model to ``device`` (and ``dtype``), as ``GRPOModule`` does with reward models at fit start."""
        self.model.to(device=device, dtype=dtype)

    @torch.no_grad()
    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[StepRewards | None]:
        """One :class:`StepRewards` per completion (``None`` for an empty one): a score per step.

        Args:
            prompts: Strings, or lists of chat messages (the last message's content is the prompt text).
            completions: Strings, or single assistant messages.
            **kwargs: Columns and extras (unused).
        """
        out: list[StepRewards | None] = []
        for prompt, completion in zip(prompts, completions, strict=True):
            text = completion_text(completion)
            if not text:
                out.append(None)
                continue
            cut = StepRewards.split(text, [0.0] * _count_steps(text, self.separator), self.separator)
            head = prompt if isinstance(prompt, str) else str(prompt[-1].get("content") or "")
            score = self._token_scores if self.token_level else self._prefix_scores
            out.append(StepRewards(score(head, text, cut.ends), cut.ends))
        return out

    def _score(self, logits: torch.Tensor) -> list[float]:
        """``(n, labels)`` logits to scores: the logit with one label, else the probability of ``label``."""
        if logits.shape[-1] == 1:
            return logits[:, 0].float().cpu().tolist()
        return logits.float().softmax(-1)[:, self.label].cpu().tolist()

    def _encode(self, texts: list[str], **options: Any) -> Any:
        encoded = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False, **options)
        return encoded.to(next(self.model.parameters()).device)

    def _prefix_scores(self, head: str, text: str, ends: tuple[int, ...]) -> list[float]:
        prefixes, scores = [head + text[:end] for end in ends], []
        for start in range(0, len(prefixes), self.batch_size):
            inputs = self._encode(prefixes[start : start + self.batch_size])
            logits = self.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
            scores += self._score(logits)
        return scores

    def _token_scores(self, head: str, text: str, ends: tuple[int, ...]) -> list[float]:
        inputs = self._encode([head + text], return_offsets_mapping=True)
        starts = inputs.pop("offset_mapping")[0, :, 0].tolist()
        logits = self.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits[0]
        last = [max(k for k, s in enumerate(starts) if s < len(head) + end) for end in ends]  # holds the last char
        return self._score(logits[last])


def _count_steps(text: str, separator: str) -> int:
    return text.count(separator) + (not text.endswith(separator))
