"""The :class:`Rollout` batch: G sampled completions per prompt, with their masks and row data."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor

__all__ = ["Rollout", "TurnStats", "completion_mask_from_ids", "left_pad"]


def left_pad(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Token id lists as left-padded ``(n, width)`` ids (``pad_id`` where masked) and their attention mask.

    Example::

        >>> ids, mask = left_pad([[5, 6], [7]], 0, torch.device("cpu"))
        >>> ids.tolist(), mask.tolist()
        ([[5, 6], [0, 7]], [[1, 1], [0, 1]])
    """
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :], mask[i, width - len(row) :] = torch.tensor(row, dtype=torch.long), 1
    return ids.to(device), mask.to(device)


def completion_mask_from_ids(completion_ids: Tensor, eos_token_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Mask every token after the first end-of-sequence token.

    Args:
        completion_ids: ``(N, T)`` sampled tokens (anything may follow the first EOS).
        eos_token_ids: 1-D tensor of the token ids that end a completion.

    Returns:
        ``(completion_mask, truncated)``: ``(N, T)`` long mask, 1 up to and including the first EOS; ``(N,)`` bool,
        true where no EOS was produced (the completion hit ``max_new_tokens``).

    Example::

        >>> mask, truncated = completion_mask_from_ids(torch.tensor([[5, 1, 7], [5, 6, 7]]), torch.tensor([1]))
        >>> mask.tolist(), truncated.tolist()
        ([[1, 1, 0], [1, 1, 1]], [False, True])
    """
    is_eos = torch.isin(completion_ids, eos_token_ids.to(completion_ids.device))  # (N, T)
    eos_seen_before = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # an EOS strictly earlier in the row
    completion_mask = (~eos_seen_before).long()
    truncated = ~is_eos.any(-1)
    return completion_mask, truncated


@dataclass
class TurnStats:
    """Per-trajectory counts of a multi-turn rollout, ``(N,)`` each (see ``docs/agents.md``).

    Attributes:
        num_turns: Policy turns (generations) in the trajectory.
        tool_calls: Tool calls the policy made.
        tool_errors: Tool calls that ended in an error the model sees (bad JSON, unknown tool, exception).
        tool_timeouts: Tool calls that ran past their timeout.
        max_turns_reached: ``True`` where the trajectory was cut because it reached ``max_turns``.
        turn_rewards: Per-turn environment rewards of each trajectory (``None`` where a turn gave none).
        turn_ends: For each entry of ``turn_rewards``, the index in the completion of the last token of the policy
            turn the environment judged (where that turn's step ends for ``grpo_process``).
    """

    num_turns: Tensor
    tool_calls: Tensor
    tool_errors: Tensor
    tool_timeouts: Tensor
    max_turns_reached: Tensor
    turn_rewards: list[list[float | None]] = field(default_factory=list)
    turn_ends: list[list[int]] = field(default_factory=list)


@dataclass
class Rollout:
    """``N = B*G`` sampled trajectories: token tensors, masks, texts and the dataset columns of their prompts.

    Prompts are left-padded and completions right-padded, so ``cat([prompt_ids, completion_ids], 1)`` is the model
    input and the last ``T`` positions are the completion. A multi-turn completion interleaves tokens the policy
    sampled with tokens inserted by tools or environments: ``completion_mask`` marks every token of the trajectory
    (what is attended), ``sampled_mask`` only the sampled ones (what is trained: loss, KL, entropy, token counts).

    Attributes:
        prompt_ids: ``(N, P)`` left-padded prompt tokens (each prompt repeated G times, consecutively).
        prompt_mask: ``(N, P)`` attention mask of the prompts.
        completion_ids: ``(N, T)`` sampled (and, in multi-turn rollouts, inserted) tokens.
        completion_mask: ``(N, T)`` 1 on every token of the trajectory (single turn: up to and including the first
            EOS).
        truncated: ``(N,)`` bool, true where the trajectory was cut: no EOS within ``max_new_tokens``, or (multi-turn)
            the token budget or ``max_turns`` ran out before the policy answered.
        group_ids: ``(N,)`` the prompt each sample belongs to (unique within this rank's batch).
        prompts: The N prompts: strings, or lists of chat messages for conversational data.
        completions: The N completions in the prompt's form: decoded strings (special tokens removed), or the list of
            messages the rollout added (assistant turns with their ``tool_calls``, tool and environment turns).
        columns: Dataset row fields, each a list of N values (repeated per sample).
        sampled_mask: ``(N, T)`` 1 on the tokens the policy sampled; ``None`` (the default) means every completion
            token was sampled and takes ``completion_mask``.
        turns: Multi-turn counts (turns, tool calls, errors, per-turn rewards); ``None`` for single-turn rollouts.
        logprobs: ``(N, T)`` float32 behaviour log-probs: each sampled token's log-probability when it was drawn,
            under the distribution it was drawn from (``softmax(logits / temperature)`` over the kept set of top-k,
            top-p and min-p; 0 on inserted tokens and padding); ``None`` for a rollout not built by sampling.
            ``GRPOConfig.corrections.old_logprobs="rollout"`` trains with them as old log-probs.
        kept_margins: ``(N, T)`` float32 kept set of each sampled token as a margin below its temperature-scaled
            logit (:attr:`Sampled.margins <lightning_grpo.rollout.sampling_settings.Sampled.margins>`; 0 on inserted
            tokens and padding); ``None`` when sampling truncated nothing: every comparison of the trainer with the
            sampler then takes the whole vocabulary.
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    completion_ids: Tensor
    completion_mask: Tensor
    truncated: Tensor
    group_ids: Tensor
    prompts: list[Any]
    completions: list[Any]
    columns: dict[str, list[Any]] = field(default_factory=dict)
    sampled_mask: Tensor = None  # type: ignore[assignment]  # filled from completion_mask in __post_init__
    turns: TurnStats | None = None
    logprobs: Tensor | None = None
    kept_margins: Tensor | None = None

    def __post_init__(self) -> None:
        if self.sampled_mask is None:
            self.sampled_mask = self.completion_mask
        if self.sampled_mask.shape != self.completion_mask.shape:
            raise ValueError(
                f"sampled_mask {tuple(self.sampled_mask.shape)} must have completion_mask's shape "
                f"{tuple(self.completion_mask.shape)}"
            )

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def input_ids(self) -> Tensor:
        """``(N, P+T)`` prompt and completion tokens."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:
        """``(N, P+T)`` attention mask (padding after the trajectory is masked out)."""
        return torch.cat([self.prompt_mask, self.completion_mask.to(self.prompt_mask.dtype)], dim=1)

    @property
    def completion_lengths(self) -> Tensor:
        """``(N,)`` number of trajectory tokens (EOS included; inserted tool/environment tokens too)."""
        return self.completion_mask.sum(-1)

    @property
    def sampled_lengths(self) -> Tensor:
        """``(N,)`` number of tokens the policy sampled."""
        return (self.sampled_mask * self.completion_mask).sum(-1)

    @property
    def completion_token_ids(self) -> list[list[int]]:
        """The N trajectories' completion tokens as lists, padding removed (reward functions' ``completion_ids``).

        Two copies to the host in all (ids and mask), not one per row.
        """
        rows, masks = self.completion_ids.tolist(), self.completion_mask.tolist()
        return [[t for t, m in zip(row, mask, strict=True) if m] for row, mask in zip(rows, masks, strict=True)]

    def select(self, index: Tensor) -> Rollout:
        """The rows ``index`` (a 1-D long tensor) as a new rollout, e.g. one micro-batch.

        An index on the CPU costs no host sync: its rows pick the list fields, its copy on the device the tensors.
        """
        rows, on_device = index.tolist(), index.to(self.completion_ids.device, non_blocking=True)
        return _map_rows(self, lambda value: _pick(value, on_device, rows))

    def to(self, device: torch.device | str) -> Rollout:
        """The rollout with its tensors on ``device``."""
        return _map_rows(self, lambda value: value.to(device) if isinstance(value, Tensor) else value)

    @classmethod
    def cat(cls, rollouts: Sequence[Rollout], *, pad_token_id: int = 0) -> Rollout:
        """Rows of several rollouts in one (prompts re-padded on the left, completions on the right).

        Group ids are offset so that the groups of different rollouts stay distinct.
        """
        if not rollouts:
            raise ValueError("Rollout.cat needs at least one rollout")
        if len(rollouts) == 1:
            return rollouts[0]
        offsets = torch.tensor([0, *[int(r.group_ids.max()) + 1 for r in rollouts[:-1]]]).cumsum(0).tolist()
        p = max(r.prompt_ids.shape[1] for r in rollouts)
        t = max(r.completion_ids.shape[1] for r in rollouts)
        left = lambda x, v: torch.nn.functional.pad(x, (p - x.shape[1], 0), value=v)  # noqa: E731
        right = lambda x, v: torch.nn.functional.pad(x, (0, t - x.shape[1]), value=v)  # noqa: E731
        with_turns = [r.turns for r in rollouts if r.turns is not None]
        return cls(
            prompt_ids=torch.cat([left(r.prompt_ids, pad_token_id) for r in rollouts]),
            prompt_mask=torch.cat([left(r.prompt_mask, 0) for r in rollouts]),
            completion_ids=torch.cat([right(r.completion_ids, pad_token_id) for r in rollouts]),
            completion_mask=torch.cat([right(r.completion_mask, 0) for r in rollouts]),
            truncated=torch.cat([r.truncated for r in rollouts]),
            group_ids=torch.cat([r.group_ids + o for r, o in zip(rollouts, offsets, strict=True)]),
            prompts=[p for r in rollouts for p in r.prompts],
            completions=[c for r in rollouts for c in r.completions],
            columns={k: [v for r in rollouts for v in r.columns[k]] for k in rollouts[0].columns},
            sampled_mask=torch.cat([right(r.sampled_mask, 0) for r in rollouts]),
            turns=_cat_turns(with_turns) if len(with_turns) == len(rollouts) else None,
            logprobs=_cat_optional([r.logprobs for r in rollouts], right),
            kept_margins=_cat_optional([r.kept_margins for r in rollouts], right),
        )


def _cat_optional(values: Sequence[Tensor | None], right: Any) -> Tensor | None:
    """Per-token tensors of several rollouts, right-padded with 0 and stacked; ``None`` if any rollout has none."""
    return None if any(v is None for v in values) else torch.cat([right(v, 0) for v in values])


def _pick(value: Any, index: Tensor, rows: list[int]) -> Any:
    """Rows ``index`` of a per-row value: a tensor, a list or a dict of lists."""
    if isinstance(value, Tensor):
        return value[index if index.device == value.device else index.to(value.device, non_blocking=True)]
    if isinstance(value, list):
        return [value[i] for i in rows]
    if isinstance(value, dict):
        return {k: _pick(v, index, rows) for k, v in value.items()}
    return value


def _map_rows(obj: Any, fn: Any) -> Any:
    """``obj`` (a dataclass) with ``fn`` applied to every field that is set, recursing into :class:`TurnStats`."""
    mapped = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        mapped[f.name] = _map_rows(value, fn) if isinstance(value, TurnStats) else None if value is None else fn(value)
    return replace(obj, **mapped)


def _cat_turns(turns: Sequence[TurnStats]) -> TurnStats:
    lists = ("turn_rewards", "turn_ends")
    tensors = {f.name: torch.cat([getattr(t, f.name) for t in turns]) for f in fields(TurnStats) if f.name not in lists}
    return TurnStats(**tensors, **{name: [r for t in turns for r in getattr(t, name)] for name in lists})
