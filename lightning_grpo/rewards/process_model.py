"""Process reward models: a classifier scoring each step of a completion, as a reward function for ``grpo_process``.

The completion is cut into steps at a separator (``"\\n"`` by default, :meth:`StepRewards.split`); each step is scored
on the text up to its end (the prompt, then the completion's first steps), and the function returns one
:class:`~lightning_grpo.rewards.StepRewards` per completion. Two kinds of Hugging Face models serve:

* ``...ForTokenClassification`` (Math-Shepherd style): one forward over the whole text; a step's score is read at the
  model's own token that holds the step's last character.
* ``...ForSequenceClassification``: one forward per step prefix (batched); a step's score is the prefix's score.

A model with one label scores with its logit; with several, with the probability of ``label`` (the "good step"
class). See ``docs/math.md`` ("Process supervision").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lightning_grpo.rewards._text import completion_text
from lightning_grpo.rewards.steps import StepRewards

__all__ = ["ProcessRewardModel"]

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
        module = GRPOModule(policy_id, [prm], grpo=GRPOConfig(advantage_estimator="grpo_process"))
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
            scores += self._score(
                self.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
            )
        return scores

    def _token_scores(self, head: str, text: str, ends: tuple[int, ...]) -> list[float]:
        inputs = self._encode([head + text], return_offsets_mapping=True)
        starts = inputs.pop("offset_mapping")[0, :, 0].tolist()
        logits = self.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits[0]
        last = [max(k for k, s in enumerate(starts) if s < len(head) + end) for end in ends]  # holds the last char
        return self._score(logits[last])


def _count_steps(text: str, separator: str) -> int:
    return text.count(separator) + (not text.endswith(separator))
