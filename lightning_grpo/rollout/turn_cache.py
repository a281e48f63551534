"""Per-trajectory KV caches kept from one agent turn to the next (``GRPOConfig.agents.turn_cache``).

A multi-turn rollout samples each turn from the whole context so far (prompt, earlier turns, tool or environment
messages). Re-prefilling that context costs a forward over every earlier token at every turn; :class:`TurnCache`
keeps, for each trajectory, the keys and values of the tokens it has already read, and at the next turn prefills only
what is new: the previous turn's last token, the inserted tool/environment tokens and the chat template's separators.

Each trajectory's cache is stored compact (only the positions it attends to). At a turn the running trajectories'
caches are right-aligned into one batched cache (left padding masked), the new tokens of each are appended
left-padded (so a row may have masked positions between its cache and its new tokens), and every token carries its
explicit position id: a trajectory's positions are those of its full re-prefill, and the attention mask hides the
padding. The decoding steps are :func:`~lightning_grpo.rollout.decode.decode_steps`, our own loop.

When a trajectory ends: in the turn loop every running trajectory is in every call, so one absent from a call has
finished and its cache is dropped at once. Agent code's calls are batched as they arrive, so a trajectory still busy
with a tool is absent from a batch without having ended: that route sets :attr:`TurnCache.explicit_ends` and calls
:meth:`TurnCache.finish` when an agent's run returns (and :meth:`TurnCache.close` drops the rest).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedTokenizerBase

from lightning_grpo.rollout.batch import left_pad
from lightning_grpo.rollout.cache_keyword import cache_of, with_cache
from lightning_grpo.rollout.decode import DecodeState, decode_steps, prefill
from lightning_grpo.rollout.logprobs import position_ids_from_mask
from lightning_grpo.rollout.sampling_settings import Sampled, SampleRequest, eos_token_ids

__all__ = ["TurnCache"]


@dataclass
class _Kept:
    """One trajectory's cache: the tokens it holds and, per layer, their ``(heads, L, head_dim)`` keys and values."""

    tokens: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]


class TurnCache:
    """The KV caches of one rollout's trajectories, by trajectory number (a session's ``rows``).

    Example::

        cache = TurnCache()
        first = cache.sample(model, tokenizer, SampleRequest(prompt_ids, prompt_mask, settings, rows=range(8)))
        # ... append tool results to the contexts of rows 2 and 5, which go on ...
        second = cache.sample(model, tokenizer, SampleRequest(context_ids, context_mask, one_each, rows=[2, 5]))

    Attributes:
        explicit_ends: ``False`` (the turn loop): a trajectory absent from a call has finished, its cache is dropped
            at that call. ``True`` (agent code, whose calls arrive out of step): a cache is kept until
            :meth:`finish` names its trajectory, or :meth:`close`.
        prefilled: Context tokens run through the model over the rollout (not decoding steps).
        reused: Context tokens read from the kept caches instead.
    """

    def __init__(self, *, explicit_ends: bool = False) -> None:
        self._kept: dict[int, _Kept] = {}
        self.explicit_ends = explicit_ends
        self.prefilled = 0
        self.reused = 0

    def __len__(self) -> int:
        return len(self._kept)

    @torch.no_grad()
    def sample(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, request: SampleRequest) -> Sampled:
        """Sample one turn, prefilling only what each trajectory's kept cache lacks; then keep the new caches.

        Args and return value as :meth:`RolloutSession.sample <lightning_grpo.rollout.session.RolloutSession.sample>`.
        Unless :attr:`explicit_ends`, trajectories not in ``request.rows`` are finished: their caches are dropped.
        """
        prompt_ids, prompt_mask, settings = request.prompt_ids, request.prompt_mask, request.settings
        rows, g = list(request.rows), settings.num_generations
        if not self.explicit_ends:
            self._kept = {row: self._kept[row] for row in rows if row in self._kept}  # finished trajectories leave
        contexts = [
            [t for t, m in zip(ids, mask, strict=True) if m]  # two host syncs, not two per row
            for ids, mask in zip(prompt_ids.tolist(), prompt_mask.tolist(), strict=True)
        ]
        if g > 1:  # a first turn whose groups share their prompt: each prompt prefilled once for its G rows
            state = self._prefill_shared(model, prompt_ids, prompt_mask, g)
            contexts = [context for context in contexts for _ in range(g)]
        else:
            state = self._resume(model, contexts, rows, prompt_ids.device)
        leaving: dict[int, tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]] = {}

        def leave(call_rows: torch.Tensor, batch_rows: torch.Tensor, mask: torch.Tensor) -> None:
            leaving.update(_take(state.cache, call_rows, batch_rows, mask))

        eos = eos_token_ids(tokenizer).to(prompt_ids.device)
        tokens, logprobs, margins = decode_steps(model, state, settings, eos, tokenizer.pad_token_id, on_leave=leave)
        leaving.update(_take(state.cache, state.alive, torch.arange(len(state.alive)), state.mask))
        sampled = tokens.tolist()
        for index, (count, layers) in leaving.items():
            self._kept[rows[index]] = _Kept((contexts[index] + sampled[index])[:count], layers)
        start = prompt_ids.repeat_interleave(g, dim=0) if g > 1 else prompt_ids
        return Sampled(torch.cat([start, tokens], dim=1), logprobs, margins)  # both cover the sampled tokens only

    def finish(self, rows: Iterable[int]) -> None:
        """Trajectories ``rows`` have ended: drop their caches (a row without one is skipped)."""
        for row in rows:
            self._kept.pop(row, None)

    def close(self) -> None:
        """Drop every kept cache."""
        self._kept = {}

    def _prefill_shared(self, model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, g: int) -> DecodeState:
        out = prefill(model, ids, mask)
        self.prefilled += int(mask.sum())
        cache = cache_of(out)
        cache.batch_repeat_interleave(g)
        logits = out.logits[:, -1].float().repeat_interleave(g, dim=0)
        return DecodeState(cache, logits, alive=ids.new_empty(0), mask=mask.repeat_interleave(g, dim=0))

    def _resume(
        self, model: nn.Module, contexts: list[list[int]], rows: list[int], device: torch.device
    ) -> DecodeState:
        """Prefill each context past the part its trajectory's cache holds (all of it for a trajectory without)."""
        reused = [self._reusable(row, context) for row, context in zip(rows, contexts, strict=True)]
        self.reused += sum(reused)
        self.prefilled += sum(len(c) for c in contexts) - sum(reused)
        ids, new_mask = left_pad([c[n:] for c, n in zip(contexts, reused, strict=True)], 0, device)
        positions = torch.tensor(reused, device=device)[:, None] + position_ids_from_mask(new_mask)
        kept, old_mask = self._batched(rows, reused, device)
        mask = torch.cat([old_mask, new_mask], dim=1)
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **with_cache(kept),
        )
        return DecodeState(cache_of(out), out.logits[:, -1].float(), alive=ids.new_empty(0), mask=mask)

    def _reusable(self, row: int, context: list[int]) -> int:
        """How many leading tokens of ``context`` the trajectory's cache holds (at least one token is left to run)."""
        kept = self._kept.get(row)
        if kept is None:
            return 0
        count = min(len(kept.tokens), len(context) - 1)
        if kept.tokens[:count] == context[:count]:  # the usual case, compared at C speed
            same = count
        else:
            same = next(i for i in range(count) if kept.tokens[i] != context[i])
        if same < len(kept.tokens):  # the context changed under the cache: keep only the common part
            kept.tokens = kept.tokens[:same]
            kept.layers = [(k[:, :same], v[:, :same]) for k, v in kept.layers]
        return same

    def _batched(
        self, rows: list[int], lengths: list[int], device: torch.device
    ) -> tuple[DynamicCache | None, torch.Tensor]:
        """The kept caches of ``rows`` right-aligned into one cache (``None`` if none holds a token) and its mask."""
        width = max(lengths)
        mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        if width == 0:
            return None, mask
        sample = next(self._kept[row].layers for row, n in zip(rows, lengths, strict=True) if n)
        layers = []
        for layer, (key, value) in enumerate(sample):
            keys = key.new_zeros((len(rows), key.shape[0], width, key.shape[-1]))
            values = value.new_zeros((len(rows), value.shape[0], width, value.shape[-1]))
            for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
                if n:
                    keys[i, :, width - n :], values[i, :, width - n :] = self._kept[row].layers[layer]
            layers.append((keys, values))
        for i, n in enumerate(lengths):
            if n:
                mask[i, width - n :] = 1
        return DynamicCache(ddp_cache_data=layers), mask


def _take(
    cache: DynamicCache, call_rows: torch.Tensor, batch_rows: torch.Tensor, mask: torch.Tensor
) -> dict[int, tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]]:
    """The compact cache of each row leaving the batch: ``{call row: (tokens held, per-layer keys and values)}``."""
    taken = {}
    for call_row, batch_row, row_mask in zip(call_rows.tolist(), batch_rows.tolist(), mask, strict=True):
        read = row_mask.nonzero().squeeze(-1)  # one host sync per row, not one per layer (a boolean index each)
        layers = [
            (layer.keys[batch_row].index_select(1, read), layer.values[batch_row].index_select(1, read))
            for layer in cache.layers
        ]
        taken[call_row] = (len(read), layers)
    return taken
