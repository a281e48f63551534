"""Packed rows: the sequences of a micro-batch concatenated without padding, attention kept inside each sequence.

Two layouts, one builder (:func:`pack_rollout`):

- **plain** (``share_prompt=False``): every row is ``prompt + completion[:-1]`` (real tokens only), positions
  restarting at 0 on each. The model gets ``position_ids`` and no attention mask, and transformers builds the
  block-diagonal mask itself (``masking_utils.find_packed_sequence_indices`` for SDPA/eager, the varlen kernel for
  flash-attention: ``modeling_flash_attention_utils._is_packed_sequence``).
- **shared prompt** (``share_prompt=True``): each distinct prompt once, followed by the completions of its rows, each
  completion attending to its prompt and to itself only. No implementation derives that from positions, so the model
  gets an explicit 4-D mask (:func:`shared_prompt_mask`); SDPA and eager take it as it is, flash-attention cannot.

The last token of a completion is never an input (nothing is predicted from it). The outputs at :attr:`PackedRows.
predict` are those that predict the completion tokens, in the order of :attr:`PackedRows.rows`/:attr:`PackedRows.
cols`; :func:`unpack` puts per-token values back into the ``(N, T)`` layout (0 on padding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lightning_grpo.rollout.batch import Rollout

__all__ = [
    "AUTO_PACKING_MIN_PADDING",
    "MAX_PACKED_TOKENS",
    "PackedRows",
    "PackingRoute",
    "pack_rollout",
    "packed_row_chunks",
    "packing_for",
    "packing_route",
    "padding_fraction",
    "sharded_logprob_settings",
    "shared_prompt_mask",
    "unpack",
]

#: Longest packed row: a micro-batch with more tokens runs as several packed rows, one forward each (their graphs
#: joined, so one backward), because attention over a packed row without a variable-length kernel (SDPA or eager with
#: a mask, on the CPU) costs O(L²) in time and mask memory.
MAX_PACKED_TOKENS = 4096

#: ``packing="auto"`` packs the passes of a rollout whose completion positions are at least this fraction padding,
#: and pads below it: with no padding to drop, packed rows only add the explicit mask's cost (docs/benchmarks.md,
#: "Packing where it pays").
AUTO_PACKING_MIN_PADDING = 0.2

#: How a model takes packed rows: ``"positions"`` (``position_ids`` only, transformers builds the mask),
#: ``"mask"`` (an explicit 4-D mask, needed by the shared-prompt layout), ``None`` (it cannot).
PackingRoute = Literal["positions", "mask"] | None
_POSITION_ROUTES = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")
_MASK_ROUTES = ("sdpa", "eager")


@dataclass(frozen=True)
class PackedRows:
    """One packed row and where its outputs go.

    Attributes:
        input_ids: ``(1, L)`` the tokens.
        position_ids: ``(1, L)`` positions, restarting at 0 on each sequence (a shared prompt's completions continue
            from its prompt's length).
        groups: ``(L,)`` the packed sequence (plain) or prompt group (shared prompt) of every token.
        branches: ``(L,)`` -1 on prompt tokens, the row on completion tokens.
        predict: ``(K,)`` the packed positions whose outputs predict the completion tokens.
        rows: ``(K,)`` the row of each predicted token.
        cols: ``(K,)`` its column in ``completion_ids``.
        targets: ``(K,)`` the predicted tokens.
        shape: ``(N, T)`` of the rollout's completions.
    """

    input_ids: Tensor
    position_ids: Tensor
    groups: Tensor
    branches: Tensor
    predict: Tensor
    rows: Tensor
    cols: Tensor
    targets: Tensor
    shape: tuple[int, int]


def packing_route(model: nn.Module, share_prompt: bool) -> PackingRoute:
    """How ``model`` takes packed rows (see :data:`PackingRoute`), from its attention implementation.

    Sliding-window layers take positions only (transformers combines the window with the packed mask; an explicit
    4-D mask would drop the window).
    """
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    sliding = "sliding_attention" in (getattr(config, "layer_types", None) or ())
    if share_prompt and impl in _MASK_ROUTES and not sliding:
        return "mask"
    return "positions" if impl in _POSITION_ROUTES else None


def padding_fraction(rollout: Rollout) -> float:
    """The fraction of the rollout's ``(N, T)`` completion positions that are padding (one host sync)."""
    mask = rollout.completion_mask
    return 1.0 - float(mask.sum()) / max(1, mask.numel())


def packing_for(rollout: Rollout, packing: bool | str) -> bool | str:
    """The ``packing`` setting of every log-prob pass over ``rollout``: ``"auto"`` becomes ``False`` (padded rows)
    when less than :data:`AUTO_PACKING_MIN_PADDING` of its completion positions are padding; other values pass.

    Decided once per rollout, so that its old, reference and current log-probs take one path (to the last bit).
    """
    if packing == "auto" and padding_fraction(rollout) < AUTO_PACKING_MIN_PADDING:
        return False
    return packing


def sharded_logprob_settings(model: nn.Module, settings: dict[str, Any]) -> dict[str, Any]:
    """The log-prob settings of a model sharded by FSDP2: ``share_prompt`` off unless the shared prompt is packed.

    FSDP2's hooks would miss a backward through the shared prompt's KV cache; the packed shared-prompt layout (one
    row with a mask, :func:`packing_route` ``"mask"``) has none: one forward. Every pass takes the same path, so
    that old, reference and current log-probs agree to the last bit.
    """
    packs = settings.get("share_prompt") and settings.get("packing") is not False
    if packs and packing_route(model, True) == "mask":
        return settings
    return {**settings, "share_prompt": False}


def pack_rollout(rollout: Rollout, *, share_prompt: bool) -> PackedRows:
    """Pack the real tokens of ``rollout`` into one row (see the module docstring for the two layouts).

    Raises:
        ValueError: A row with completion tokens has an empty prompt (nothing predicts its first token).
    """
    host = _HostRollout.of(rollout)
    prompt_lengths, lengths, prompts, completions = host.prompt_lengths, host.lengths, host.prompts, host.completions
    tokens, positions, groups, branches = [], [], [], []
    predict, rows, cols = [], [], []
    for group, members in enumerate(host.groups(share_prompt)):
        start, p = len(tokens), prompt_lengths[members[0]]
        prompt = prompts[members[0]][len(prompts[members[0]]) - p :]
        tokens += prompt
        positions += range(p)
        groups += [group] * p
        branches += [-1] * p
        for row in members:
            n = lengths[row]
            if n and not p:
                raise ValueError(f"row {row} has completion tokens but an empty prompt: nothing predicts its first")
            first = len(tokens)
            tokens += completions[row][: n - 1] if n else []
            positions += range(p, p + max(n - 1, 0))
            groups += [group] * max(n - 1, 0)
            branches += [row] * max(n - 1, 0)
            predict += [start + p - 1, *range(first, first + n - 1)][:n]
            rows += [row] * n
            cols += range(n)
    return _tensors(rollout, tokens, positions, groups, branches, predict, rows, cols)


def packed_row_chunks(rollout: Rollout, *, share_prompt: bool, max_tokens: int = MAX_PACKED_TOKENS) -> list[Tensor]:
    """Host row indices of the packed rows of ``rollout``: prompt groups kept together, each about ``max_tokens``.

    A row's tokens are its prompt and completion (a shared prompt counted once per packed row); a row longer than
    ``max_tokens`` gets a packed row of its own.
    """
    host = _HostRollout.of(rollout)
    prompt_lengths, lengths = host.prompt_lengths, host.lengths
    chunks, current, used = [], [], 0
    for members in host.groups(share_prompt):
        prompt_counted = False
        for row in members:
            cost = lengths[row] + (0 if prompt_counted else prompt_lengths[row])
            if current and used + cost > max_tokens:
                chunks.append(current)
                current, used, cost = [], 0, lengths[row] + prompt_lengths[row]
            current.append(row)
            used += cost
            prompt_counted = share_prompt
    return [torch.tensor(chunk, dtype=torch.long) for chunk in [*chunks, current] if chunk]


@dataclass(frozen=True)
class _HostRollout:
    """The token ids and masks of a rollout as host lists, read with one device-to-host copy (one sync on a GPU)."""

    prompts: list[list[int]]
    prompt_masks: list[list[int]]
    completions: list[list[int]]
    prompt_lengths: list[int]
    lengths: list[int]

    @classmethod
    def of(cls, rollout: Rollout) -> _HostRollout:
        p, t = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
        columns = (rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask)
        joined = torch.cat([column.long() for column in columns], dim=1).tolist()
        prompt_masks = [row[p : 2 * p] for row in joined]
        return cls(
            prompts=[row[:p] for row in joined],
            prompt_masks=prompt_masks,
            completions=[row[2 * p : 2 * p + t] for row in joined],
            prompt_lengths=[sum(mask) for mask in prompt_masks],
            lengths=[sum(row[2 * p + t :]) for row in joined],
        )

    def groups(self, share_prompt: bool) -> list[list[int]]:
        """The rows of each packed sequence: one row each, or the rows of each distinct (prompt, mask)."""
        if not share_prompt:
            return [[row] for row in range(len(self.prompts))]
        members: dict[tuple[int, ...], list[int]] = {}
        for row, (prompt, mask) in enumerate(zip(self.prompts, self.prompt_masks, strict=True)):
            members.setdefault((*prompt, *mask), []).append(row)
        return list(members.values())


def _tensors(rollout: Rollout, *columns: list[int]) -> PackedRows:
    device = rollout.completion_ids.device
    tokens, positions, groups, branches, predict, rows, cols = (
        torch.tensor(c, dtype=torch.long, device=device) for c in columns
    )
    return PackedRows(
        input_ids=tokens.to(rollout.completion_ids.dtype)[None],
        position_ids=positions[None],
        groups=groups,
        branches=branches,
        predict=predict,
        rows=rows,
        cols=cols,
        targets=rollout.completion_ids[rows, cols],
        shape=tuple(rollout.completion_ids.shape),
    )


def shared_prompt_mask(packed: PackedRows, dtype: torch.dtype, *, additive: bool) -> Tensor:
    """``(1, 1, L, L)`` mask: a token sees the earlier tokens of its group's prompt and of its own completion.

    Args:
        packed: The packed row.
        dtype: The model's dtype (for an additive mask).
        additive: ``0``/``dtype``-minimum floats (eager attention adds the mask to the scores) rather than booleans
            (``True``: attend), which SDPA takes.
    """
    g, b = packed.groups, packed.branches
    index = torch.arange(len(g), device=g.device)
    same = (g[:, None] == g[None, :]) & ((b[None, :] == -1) | (b[:, None] == b[None, :]))
    allowed = (same & (index[None, :] <= index[:, None]))[None, None]
    if not additive:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=g.device).masked_fill(~allowed, torch.finfo(dtype).min)


def unpack(values: Tensor, packed: PackedRows) -> Tensor:
    """``(K,)`` per-token values back to ``(N, T)``, 0 on padding (differentiable)."""
    out = values.new_zeros(packed.shape)
    return out.index_put((packed.rows, packed.cols), values)
