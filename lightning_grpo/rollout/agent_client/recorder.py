"""One agent trajectory's calls, recorded token-exactly as branches; each branch becomes one training sequence.

A call whose messages equal a branch's messages (its history plus the assistant reply it sampled) followed by new
non-assistant messages (tool results, a user turn) **continues** that branch: its context is the branch's exact
tokens (the sampled ids, never re-tokenised) followed by the template's rendering of the new messages
(:func:`~lightning_grpo.rollout.chat.continuation_ids`). Any other call (an edited or shortened history, other
tools, a branch whose last turn was cut without an end-of-turn token, a template that renders the earlier turns
differently once messages are added) **starts a new branch** from the full rendering of its messages. Every sampled
token belongs to exactly one branch (mask 1, with its behaviour log-prob and, when the sampling truncates, its
kept-set margin); rendered and inserted tokens are context (mask 0).

The recorder changes only when a call's answer is delivered (:meth:`TrajectoryRecorder.record`): a call that timed
out or was cancelled leaves no trace, so a retried request neither forks nor duplicates the trajectory. It needs no
event loop or HTTP, so a server can share it (one recorder per trajectory key).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from lightning_grpo.rollout.agent_client.openai_messages import message_key
from lightning_grpo.rollout.chat import continuation_ids, render_messages

__all__ = ["Branch", "CallPlan", "TrajectoryRecorder"]


@dataclass
class Branch:
    """One training sequence of a trajectory: a rendered prompt, then sampled turns and inserted context.

    Attributes:
        row: Its number among all branches of the rollout (the session's ``rows``).
        prompt_ids: The tokens of the first call's rendered messages (with the generation prompt).
        prompt: The first call's messages.
        tools: The tool schemas rendered (``None``: none).
        tokens: Everything after the prompt: sampled turns (``sampled`` 1) and inserted context (0).
        sampled: 1 on tokens the policy sampled.
        logprobs: Behaviour log-prob of each sampled token (0 on context).
        margins: Kept-set margin of each sampled token (0 on context); ``None`` when the sampler records none (its
            sampling truncates nothing: every call of a rollout records margins, or none does).
        messages: The conversation so far, ending with the last sampled assistant reply.
        open: Whether the last turn ended with an end-of-turn token (a later call can continue the branch).
        calls: Calls sampled on this branch.
    """

    row: int
    prompt_ids: list[int]
    prompt: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tokens: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    margins: list[float] | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    open: bool = True
    calls: int = 0

    def extend(
        self,
        ids: Sequence[int],
        *,
        sampled: bool,
        logprobs: Sequence[float] | None = None,
        margins: Sequence[float] | None = None,
    ) -> None:
        """Append sampled tokens (with their log-probs and kept-set margins) or context tokens (log-prob and margin
        0). A branch keeps margins (:attr:`margins` not ``None``) from its creation on, or never."""
        self.tokens.extend(ids)
        self.sampled.extend([int(sampled)] * len(ids))
        self.logprobs.extend(list(logprobs)[: len(ids)] if logprobs is not None else [0.0] * len(ids))
        if self.margins is not None:
            self.margins.extend(list(margins)[: len(ids)] if margins is not None else [0.0] * len(ids))


@dataclass(frozen=True)
class CallPlan:
    """Where a call would be sampled: its context, token budget, row, and the branch it continues (``None``: new)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    context: list[int]
    budget: int
    row: int
    branch: Branch | None = None
    inserted: list[int] = field(default_factory=list)
    length_at_plan: int = 0


class TrajectoryRecorder:
    """The branches of one trajectory (see the module docstring).

    Args:
        tokenizer: The policy's tokenizer (its chat template renders the messages).
        max_tokens: Longest branch after its prompt (``GRPOConfig.sampling.max_new_tokens``): sampled plus inserted
            tokens.
        max_prompt_tokens: Longest rendered prompt of a new branch (``GRPOConfig.sampling.max_prompt_length``).
        next_row: Gives each new branch its row number (shared by the rollout's recorders).
        prompts: Token ids of rendered prompts by their messages and tools, shared by the rollout's recorders (the G
            runs of a row render their first call's messages once); ``None``: this recorder's own.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        max_tokens: int,
        max_prompt_tokens: int,
        next_row: Any,
        prompts: dict[str, list[int]] | None = None,
    ) -> None:
        self.tokenizer, self.max_tokens, self.max_prompt_tokens = tokenizer, max_tokens, max_prompt_tokens
        self.branches: list[Branch] = []
        self._next_row = next_row
        self._prompts = {} if prompts is None else prompts

    def plan(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> CallPlan:
        """The context of a call with these (normalised) messages; changes nothing.

        Raises:
            ValueError: The chat template cannot render the messages (the first one it fails on is named), or the
                rendered prompt of a new branch is longer than ``max_prompt_tokens``.
        """
        for branch in sorted(self.branches, key=lambda b: -len(b.messages)):
            if _continues(branch, messages, tools):
                new = messages[len(branch.messages) :]
                try:
                    inserted = continuation_ids(self.tokenizer, branch.messages, new, tools=tools)
                except ValueError:  # the template re-renders the history differently (it strips reasoning, ...)
                    continue  # so the call cannot continue the exact tokens: it starts a new branch
                budget = self.max_tokens - len(branch.tokens) - len(inserted)
                context = [*branch.prompt_ids, *branch.tokens, *inserted]
                return CallPlan(messages, tools, context, budget, branch.row, branch, inserted, len(branch.tokens))
        ids = self._prompt_ids(messages, tools)
        if len(ids) > self.max_prompt_tokens:
            raise ValueError(
                f"the call's messages render to {len(ids)} tokens, more than max_prompt_length={self.max_prompt_tokens}"
                " (a call that does not continue an earlier one starts a new sequence from its full rendering)"
            )
        return CallPlan(messages, tools, ids, self.max_tokens, self._next_row())

    def _prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The tokens of the messages' full rendering, rendered once per rollout for equal messages and tools."""
        try:
            key = json.dumps([messages, tools], sort_keys=True)
        except (TypeError, ValueError):  # a value JSON cannot hold: render without the cache
            key = None
        ids = self._prompts.get(key) if key is not None else None
        if ids is None:
            ids = self.tokenizer(_render(self.tokenizer, messages, tools), add_special_tokens=False)["input_ids"]
            if key is not None:
                self._prompts[key] = ids
        return list(ids)

    def record(
        self,
        plan: CallPlan,
        tokens: Sequence[int],
        logprobs: Sequence[float],
        ended: bool,
        reply: dict[str, Any],
        *,
        margins: Sequence[float] | None = None,
    ) -> Branch:
        """Add a delivered call: its sampled ``tokens`` (cut as sampled) with their log-probs and kept-set ``margins``
        (``None``: the sampler records none), ``ended`` with an end-of-turn token.

        A plan whose branch grew meanwhile (two concurrent calls of one trajectory) is recorded as a new branch.
        """
        branch = plan.branch
        if branch is not None and len(branch.tokens) != plan.length_at_plan:
            plan = self.plan(plan.messages, plan.tools)  # re-planned: now it cannot continue the grown branch
            branch = plan.branch
        if branch is None:
            branch = Branch(plan.row, list(plan.context), list(plan.messages), plan.tools)
            branch.margins = [] if margins is not None else None
            self.branches.append(branch)
        else:
            branch.extend(plan.inserted, sampled=False)
        branch.extend(tokens, sampled=True, logprobs=logprobs, margins=margins)
        branch.messages = [*plan.messages, reply]
        branch.open, branch.calls = ended, branch.calls + 1
        return branch


def _continues(branch: Branch, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> bool:
    """Whether ``messages`` are the branch's messages plus new non-assistant ones, with the same tools."""
    n = len(branch.messages)
    if not branch.open or tools != branch.tools or len(messages) <= n:
        return False
    if any(m["role"] == "assistant" for m in messages[n:]):
        return False
    return all(message_key(a) == message_key(b) for a, b in zip(branch.messages, messages[:n], strict=True))


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], tools: Any) -> str:
    """The prompt text of ``messages``; an error names the first message the template cannot render."""
    try:
        return render_messages(tokenizer, messages, tools=tools)
    except ValueError as err:
        if "no chat template" in str(err):
            raise
        failure: Exception = err
    except Exception as err:  # a template error of any kind: find the message it is about
        failure = err
    for index in range(len(messages)):
        try:
            render_messages(tokenizer, messages[: index + 1], tools=tools)
        except Exception as err:
            raise ValueError(
                f"the chat template cannot render messages[{index}] (role {messages[index]['role']!r}): "
                f"{type(err).__name__}: {err}"
            ) from err
    raise ValueError(f"the chat template cannot render the messages: {type(failure).__name__}: {failure}") from failure
