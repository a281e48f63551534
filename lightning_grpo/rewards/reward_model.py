"""Reward models: a trained sequence-classification model (one score per sequence) as a reward function.

``transformers`` is imported when a :class:`RewardModel` is built, not when :mod:`lightning_grpo.rewards` is. See
``docs/rewards.md`` ("Reward models").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from lightning_grpo.rewards._text import excerpt
from lightning_grpo.settings_checks import check_number

__all__ = ["RewardModel"]

_SUFFIX = "ForSequenceClassification"


class RewardModel:
    """A Hugging Face ``AutoModelForSequenceClassification`` with one label, scoring prompt + completion.

    The text it scores is rendered with the reward model's own tokenizer: a conversational prompt (a list of chat
    messages) followed by the completion's messages goes through that tokenizer's chat template; a string prompt is
    simply followed by its completion. Scoring is batched and runs without gradient. In a :class:`GRPOModule` the
    model is moved to the module's device and dtype when fitting starts; it is not part of the trained policy: no
    optimizer, checkpoint or FSDP sharding sees it (every rank holds a full copy).

    Args:
        model: A Hugging Face id or local path of a sequence-classification checkpoint, or a loaded
            ``AutoModelForSequenceClassification``.
        tokenizer: Its tokenizer, or an id/path; defaults to the model's own (its id/path, or the loaded model's
            ``name_or_path``).
        batch_size: Sequences per forward pass.
        max_length: Longest input in tokens; longer ones are cut on the right. ``None`` keeps every token.
        torch_dtype: Dtype of the reward model; ``None`` follows the module (its policy's dtype) once placed.
        name: The name its rewards are logged under; defaults to the last part of the id/path.
        trust_remote_code: Passed to ``from_pretrained``.

    Raises:
        ValueError: If the checkpoint is not a sequence-classification model, or its number of labels is not 1.

    Example::

        from lightning_grpo import GRPOModule
        from lightning_grpo.rewards import RewardModel, math_answer

        module = GRPOModule("Qwen/Qwen2.5-0.5B-Instruct",
                            [math_answer, RewardModel("Skywork/Skywork-Reward-V2-Qwen3-0.6B")])
        # the same: GRPOModule(..., ["Skywork/Skywork-Reward-V2-Qwen3-0.6B"]) (a string is a reward model)
    """

    def __init__(
        self,
        model: str | torch.nn.Module,
        tokenizer: Any = None,
        *,
        batch_size: int = 8,
        max_length: int | None = None,
        torch_dtype: str | torch.dtype | None = None,
        name: str | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        check_number("batch_size", batch_size, integer=True, minimum=1)
        check_number("max_length", max_length, integer=True, minimum=1, allow_none=True)
        self.dtype = getattr(torch, torch_dtype) if isinstance(torch_dtype, str) else torch_dtype
        source = model if isinstance(model, str | Path) else getattr(model, "name_or_path", None)
        self.model = _load_model(model, self.dtype, trust_remote_code) if isinstance(model, str | Path) else model
        _check_model(self.model, str(source or type(model).__name__))
        self.model.eval().requires_grad_(False)
        self.tokenizer = _load_tokenizer(tokenizer, source, trust_remote_code)
        if self.model.config.pad_token_id is None:  # batched scoring finds each row's last token by the pad id
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size, self.max_length = batch_size, max_length
        self.name = name or (Path(str(source)).name if source else "reward_model")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, batch_size={self.batch_size})"

    def place(self, device: torch.device | str, dtype: torch.dtype | None = None) -> None:
        """Move the model to ``device``, and to ``dtype`` unless ``torch_dtype`` was given."""
        self.model.to(device=device, dtype=self.dtype or dtype)

    def texts(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[str]:
        """The texts scored: chat-template renderings for conversational prompts, ``prompt + completion`` else."""
        return [self._render(prompt, completion) for prompt, completion in zip(prompts, completions, strict=True)]

    @torch.no_grad()
    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """One score per completion: the model's single logit on prompt + completion.

        Args:
            prompts: Strings, or lists of chat messages.
            completions: In the prompts' form: strings, or the lists of messages the rollout added.
            **kwargs: Columns and extras (unused).
        """
        texts = self.texts(prompts, completions)
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            inputs = self.tokenizer(
                texts[start : start + self.batch_size],
                return_tensors="pt",
                padding=True,
                add_special_tokens=False,
                truncation=self.max_length is not None,
                max_length=self.max_length,
            )
            inputs = {key: value.to(device) for key, value in inputs.items() if key in ("input_ids", "attention_mask")}
            logits = self.model(**inputs).logits  # (b, 1)
            scores.extend(logits[:, 0].float().cpu().tolist())
        return scores

    def _render(self, prompt: Any, completion: Any) -> str:
        if isinstance(prompt, str):
            if not isinstance(completion, str):
                raise TypeError(
                    f"reward model {self.name!r}: a string prompt needs a string completion; got {excerpt(completion)}"
                )
            return prompt + completion
        if isinstance(completion, str):
            completion = [{"role": "assistant", "content": completion}]
        if not isinstance(prompt, Sequence) or not all(isinstance(m, Mapping) for m in [*prompt, *completion]):
            raise TypeError(
                f"reward model {self.name!r}: prompts must be strings or lists of chat messages; got {excerpt(prompt)}"
            )
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"reward model {self.name!r}: conversational prompts are rendered with the reward model's chat "
                "template, but its tokenizer has none; pass a tokenizer with a chat template"
            )
        return self.tokenizer.apply_chat_template([*prompt, *completion], tokenize=False)


def _load_model(path: str | Path, dtype: torch.dtype | None, trust_remote_code: bool) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForSequenceClassification

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise ValueError(f"reward model {str(path)!r} could not be loaded: {err}") from err
    architectures = list(getattr(config, "architectures", None) or [])
    if architectures and not any(a.endswith(_SUFFIX) for a in architectures):
        raise ValueError(
            f"reward model {str(path)!r} is not a sequence-classification model (its architectures are "
            f"{architectures}); a reward model needs AutoModelForSequenceClassification weights with num_labels=1, "
            "e.g. a model trained with TRL's RewardTrainer"
        )
    try:
        return AutoModelForSequenceClassification.from_pretrained(
            path, dtype=dtype, trust_remote_code=trust_remote_code
        )
    except ValueError as err:
        raise ValueError(f"reward model {str(path)!r} is not a sequence-classification model: {err}") from err


def _check_model(model: Any, where: str) -> None:
    if not isinstance(model, torch.nn.Module) or not type(model).__name__.endswith(_SUFFIX):
        raise ValueError(
            f"reward model {where!r} must be an AutoModelForSequenceClassification; got {type(model).__name__}"
        )
    num_labels = getattr(model.config, "num_labels", None)
    if num_labels != 1:
        raise ValueError(
            f"reward model {where!r} has num_labels={num_labels}; a reward model gives one score per sequence "
            "(num_labels=1)"
        )


def _load_tokenizer(tokenizer: Any, source: Any, trust_remote_code: bool) -> Any:
    if tokenizer is None and source is None:
        raise ValueError("RewardModel could not find the model's tokenizer; pass tokenizer=...")
    if tokenizer is None or isinstance(tokenizer, str | Path):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer or source, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
