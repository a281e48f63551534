"""Conversational rollouts: chat-message prompts, tool calls and environments, several turns per trajectory.

The turn loop of the running trajectories (:class:`~lightning_grpo.rollout.trajectory.Trajectory`, their state) lives
here, one home: the loop starts them, samples, runs tools and environment steps, and appends to them; only settings
are read from :class:`~lightning_grpo.rollout.agent.AgentSettings`.

A trajectory is one token sequence: the rendered prompt, then policy turns interleaved with tool or environment turns.
Each turn, every trajectory still running samples in one batched call (the first turn shares each prompt's prefill
across its G samples); the tool calls of all trajectories run concurrently; the environment steps run concurrently;
the messages they return are turned into tokens by the chat template (:func:`~lightning_grpo.rollout.chat.
continuation_ids`) and appended as context. Sampled tokens are kept as sampled, never re-tokenized. See
``docs/agents.md`` for the masking and the semantics of ``max_turns`` and the token budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.agents import EnvironmentEpisode, ParsedTurn, assistant_message, step_episodes
from lightning_grpo.agents.trl_environment import EMPTY_PROMPT
from lightning_grpo.rewards._text import DATASET_INDEX
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.batch import Rollout, TurnStats, left_pad
from lightning_grpo.rollout.chat import continuation_ids, render_messages
from lightning_grpo.rollout.generation import eval_mode, sample_tokens, tokenize_prompts
from lightning_grpo.rollout.sampling_settings import SampleFn, SampleRequest, SamplingSettings, eos_token_ids
from lightning_grpo.rollout.session import RolloutSession, draw
from lightning_grpo.rollout.trajectory import SampledTurn, Trajectory, sampled_turns

__all__ = ["Trajectory", "generate_conversations"]

_ERRORS = ("error", "unknown_tool", "parse_error")


@torch.no_grad()
def generate_conversations(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[list[dict[str, Any]]],
    settings: SamplingSettings,
    agent: AgentSettings,
    *,
    max_prompt_length: int,
    columns: dict[str, Sequence[Any]] | None = None,
    any_rank_active: Callable[[bool], bool] | None = None,
    sample: SampleFn | RolloutSession | None = None,
) -> Rollout:
    """Sample ``settings.num_generations`` trajectories for each conversational prompt.

    Args:
        model: A causal LM with ``generate``.
        tokenizer: Its tokenizer, with a chat template (one that renders tools when tools are set).
        prompts: ``B`` prompts, each a list of chat messages.
        settings: Sampling settings; ``max_new_tokens`` is the token budget of a whole trajectory.
        agent: Tools, parser, environment factory and ``max_turns``.
        max_prompt_length: Longest rendered prompt in tokens.
        columns: Dataset row fields, one list of ``B`` values each.
        any_rank_active: Under FSDP, whether any rank still has a running trajectory (a collective); a rank with none
            keeps joining the sampling calls of the others until all are done. ``None`` on one process.
        sample: The sampler of every turn (:data:`~lightning_grpo.rollout.sampling_settings.SampleFn` or a
            :class:`~lightning_grpo.rollout.session.RolloutSession`); ``None``:
            :func:`~lightning_grpo.rollout.generation.sample_tokens`.

    Returns:
        A :class:`Rollout` of ``B * G`` trajectories with ``sampled_mask`` and :class:`TurnStats`.
    """
    columns = {k: list(v) for k, v in (columns or {}).items()}
    trajectories = _start(prompts, columns, settings.num_generations, agent)
    texts = [render_messages(tokenizer, t.prompt, tools=t.tool_schemas(agent)) for t in trajectories]
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, texts, max_prompt_length, device)
    sample = sample_tokens if sample is None else sample  # a session may be falsy (a TurnCache has a length)
    with eval_mode(model):
        for turn in range(agent.max_turns):
            active = [i for i, t in enumerate(trajectories) if not t.done]
            if not (any_rank_active(bool(active)) if any_rank_active is not None else active):
                break
            if not active:  # other ranks still sample: join their synchronised calls
                one = replace(settings, num_generations=1)
                draw(sample, model, tokenizer, SampleRequest(prompt_ids[:1], prompt_mask[:1], one, rows=[]))
                continue
            sampled = _sample_turn(
                sample, (model, tokenizer), prompt_ids, prompt_mask, trajectories, active, settings, turn
            )
            _react(tokenizer, [trajectories[i] for i in active], sampled, settings.max_new_tokens, agent)
    return _rollout(tokenizer, prompt_ids, prompt_mask, trajectories, settings, columns, agent)


def _start(
    prompts: Sequence[list[dict[str, Any]]], columns: dict[str, list[Any]], g: int, agent: AgentSettings
) -> list[Trajectory]:
    """``B * G`` trajectories; with an environment, each gets its own instance and its first observation."""
    if agent.trl_environments is not None:
        return _trl_trajectories(prompts, columns, g, agent)
    trajectories = []
    dataset_index = columns.get(DATASET_INDEX)  # PromptDataModule's: errors name the dataset row
    label = "dataset row" if dataset_index is not None else "batch row"
    for b, prompt in enumerate(prompts):
        row = {"prompt": prompt, **{name: values[b] for name, values in columns.items()}}
        for _ in range(g):
            if agent.environment_factory is None:
                trajectories.append(Trajectory(prompt=list(prompt)))
                continue
            index = dataset_index[b] if dataset_index is not None else b
            episode = EnvironmentEpisode(agent.environment_factory, row, index=index, row_label=label)
            trajectories.append(Trajectory(prompt=[*prompt, *episode.reset()], episode=episode))
    return trajectories


def _trl_trajectories(
    prompts: Sequence[list[dict[str, Any]]], columns: dict[str, list[Any]], g: int, agent: AgentSettings
) -> list[Trajectory]:
    """``B * G`` trajectories of TRL-style environments: an instance from the pool each, ``reset`` with the row first.

    A row without a prompt starts from one empty user message, which ``reset`` fills (TRL's behaviour).
    """
    environments, trajectories = agent.trl_environments, []
    assert environments is not None
    environments.start_batch()
    dataset_index = columns.get(DATASET_INDEX)  # PromptDataModule's: errors name the dataset row
    for b, prompt in enumerate(prompts):
        row = {name: values[b] for name, values in columns.items()}
        if prompt:
            row = {"prompt": prompt, **row}
        name = environments.environment_of(row, dataset_index[b] if dataset_index is not None else b)
        for _ in range(g):
            instance = environments.draw(name)
            start = environments.reset(instance, row, list(prompt) or list(EMPTY_PROMPT))
            trajectories.append(Trajectory(prompt=start, environment=instance, tools=environments.toolset(instance)))
    return trajectories


def _sample_turn(
    sample: SampleFn | RolloutSession,
    policy: tuple[nn.Module, PreTrainedTokenizerBase],
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    trajectories: list[Trajectory],
    active: list[int],
    settings: SamplingSettings,
    turn: int,
) -> list[SampledTurn]:
    """One batched sampling call over the running trajectories; the raw new tokens of each, their log-probs and
    kept-set margins."""
    (model, tokenizer), g = policy, settings.num_generations
    if turn == 0 and _groups_share_prompt(prompt_ids, prompt_mask, g):
        rows = torch.arange(0, len(prompt_ids), g, device=prompt_ids.device)  # the first of each group: G samples each
        request = SampleRequest(prompt_ids[rows], prompt_mask[rows], settings)  # rows: every trajectory, 0 .. N-1
        out = draw(sample, model, tokenizer, request)
        return sampled_turns(out, prompt_ids.shape[1])
    contexts = [prompt_ids[i][prompt_mask[i].bool()].tolist() + trajectories[i].tokens for i in active]
    budget = max(settings.max_new_tokens - len(trajectories[i].tokens) for i in active)
    ids, mask = left_pad(contexts, tokenizer.pad_token_id, prompt_ids.device)
    call = replace(settings, num_generations=1, max_new_tokens=budget)
    out = draw(sample, model, tokenizer, SampleRequest(ids, mask, call, rows=active))
    return sampled_turns(out, ids.shape[1])


def _groups_share_prompt(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, g: int) -> bool:
    """Whether the G rows of every group have the same prompt (not so when environments observe differently)."""
    rows = torch.cat([prompt_ids, prompt_mask.long()], dim=1).view(-1, g, 2 * prompt_ids.shape[1])
    return bool((rows == rows[:, :1]).all())


def _react(
    tokenizer: PreTrainedTokenizerBase,
    running: list[Trajectory],
    sampled: list[SampledTurn],
    budget: int,
    agent: AgentSettings,
) -> None:
    """Record each policy turn, then run its tool calls or environment step and insert what they return."""
    eos = set(eos_token_ids(tokenizer).tolist())
    calls, stepping = {}, {}
    for index, (trajectory, new) in enumerate(zip(running, sampled, strict=True)):
        turn = _take_turn(tokenizer, trajectory, new, eos, budget, agent)
        if turn is not None and turn.tool_calls:
            calls[index] = turn
        elif turn is not None:
            stepping[index] = trajectory.messages[-1]
    observations = _run_tools(running, calls, agent)
    observations.update(_step_environments(running, stepping, agent))
    for index, messages in observations.items():
        _insert(tokenizer, running[index], messages, budget, agent)


def _take_turn(
    tokenizer: PreTrainedTokenizerBase,
    trajectory: Trajectory,
    new: SampledTurn,
    eos: set[int],
    budget: int,
    agent: AgentSettings,
) -> ParsedTurn | None:
    """Append the sampled turn (cut at its first EOS and at the budget); the parsed turn if the episode goes on."""
    remaining, tokens = budget - len(trajectory.tokens), new.tokens
    end = next((i + 1 for i, token in enumerate(tokens[:remaining]) if token in eos), None)
    trajectory.extend(tokens[: end or remaining], sampled=True, logprobs=new.logprobs, margins=new.margins)
    trajectory.turns += 1
    text = tokenizer.decode(tokens[: end or remaining], skip_special_tokens=True)
    turn = agent.parser.parse(text) if agent.executor is not None else ParsedTurn(content=text)
    trajectory.messages.append(assistant_message(turn) if turn.tool_calls else {"role": "assistant", "content": text})
    trajectory.tool_calls += len(turn.tool_calls) if agent.executor is not None else 0
    if end is None:  # the budget ran out inside the turn
        trajectory.stop(truncated=True)
    elif turn.tool_calls and trajectory.turns >= agent.max_turns:  # no turn left to read the tools' answers
        trajectory.stop(truncated=True, max_turns=True)
    elif not turn.tool_calls and trajectory.episode is None:  # answered without a call: the episode is over
        trajectory.stop()
    return None if trajectory.done else turn  # an environment still judges the last turn (and may end it)


def _run_tools(
    running: list[Trajectory], turns: dict[int, ParsedTurn], agent: AgentSettings
) -> dict[int, list[dict[str, Any]]]:
    """Every tool call of the turn, concurrently; the tool messages of each trajectory."""
    if not turns:
        return {}
    flat = [(index, call) for index, turn in turns.items() for call in turn.tool_calls]
    toolsets = [running[index].tools for index, _ in flat]  # a TRL-style environment's own tools, or None
    results = agent.executor.run([call for _, call in flat], toolsets)  # type: ignore[union-attr]
    messages: dict[int, list[dict[str, Any]]] = {index: [] for index in turns}
    for (index, _), result in zip(flat, results, strict=True):
        messages[index].append(result.to_message())
        running[index].tool_errors += result.status in _ERRORS
        running[index].tool_timeouts += result.status == "timeout"
    return messages


def _step_environments(
    running: list[Trajectory], messages: dict[int, dict[str, Any]], agent: AgentSettings
) -> dict[int, list[dict[str, Any]]]:
    """Every environment step of the turn, concurrently; the observations of the episodes that go on."""
    if not messages:
        return {}
    indices = list(messages)
    steps = step_episodes([running[i].episode for i in indices], [messages[i] for i in indices])  # type: ignore[misc]
    observations = {}
    for index, step in zip(indices, steps, strict=True):
        trajectory = running[index]
        trajectory.reward_ends.append(len(trajectory.tokens) - 1)  # the last token of the turn it judged
        if step.done or not step.observation:
            trajectory.stop()
        elif trajectory.turns >= agent.max_turns:
            trajectory.stop(truncated=True, max_turns=True)
        else:
            observations[index] = step.observation
    return observations


def _insert(
    tokenizer: PreTrainedTokenizerBase,
    trajectory: Trajectory,
    messages: list[dict[str, Any]],
    budget: int,
    agent: AgentSettings,
) -> None:
    """Append tool/environment messages as context tokens; a trajectory without room left for a turn is cut.

    A cut trajectory keeps neither the messages nor their tokens: its messages and tokens always agree, so a reward
    function never sees a tool result the policy did not read.
    """
    history = [*trajectory.prompt, *trajectory.messages]
    ids = continuation_ids(tokenizer, history, messages, tools=trajectory.tool_schemas(agent))
    if len(trajectory.tokens) + len(ids) >= budget:
        trajectory.stop(truncated=True)
        return
    trajectory.messages.extend(messages)
    trajectory.extend(ids, sampled=False)


def _rollout(
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    trajectories: list[Trajectory],
    settings: SamplingSettings,
    columns: dict[str, list[Any]],
    agent: AgentSettings,
) -> Rollout:
    """The :class:`Rollout` of finished trajectories: right-padded tokens, masks, log-probs, kept-set margins (when
    the sampling truncates and the sampler recorded them), messages and turn counts."""
    device, g = prompt_ids.device, settings.num_generations
    width = max(1, *(len(t.tokens) for t in trajectories))
    padded = lambda name, value, dtype: torch.tensor(  # noqa: E731
        [getattr(t, name) + [value] * (width - len(t.tokens)) for t in trajectories], dtype=dtype, device=device
    )
    lengths = torch.tensor([len(t.tokens) for t in trajectories], device=device)
    with_margins = settings.truncates and all(t.margins_recorded for t in trajectories)
    margins = padded("margins", 0.0, torch.float32) if with_margins else None
    count = lambda name: torch.tensor([getattr(t, name) for t in trajectories], device=device)  # noqa: E731
    turn_rewards = [list(t.episode.rewards) if t.episode is not None else [] for t in trajectories]
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=padded("tokens", tokenizer.pad_token_id, torch.long),
        completion_mask=(torch.arange(width, device=device) < lengths[:, None]).long(),
        truncated=count("truncated"),
        group_ids=torch.arange(len(trajectories) // g, device=device).repeat_interleave(g),
        prompts=[t.prompt for t in trajectories],
        completions=[t.messages for t in trajectories],
        columns={**_repeat_columns(columns, g), **_environment_columns(trajectories, columns, agent)},
        sampled_mask=padded("sampled", 0, torch.long),
        turns=TurnStats(
            num_turns=count("turns"),
            tool_calls=count("tool_calls"),
            tool_errors=count("tool_errors"),
            tool_timeouts=count("tool_timeouts"),
            max_turns_reached=count("max_turns_reached"),
            turn_rewards=turn_rewards,
            turn_ends=[list(t.reward_ends) for t in trajectories],
        ),
        logprobs=padded("logprobs", 0.0, torch.float32),
        kept_margins=margins,
    )


def _repeat_columns(columns: dict[str, list[Any]], g: int) -> dict[str, list[Any]]:
    return {name: [v for v in values for _ in range(g)] for name, values in columns.items()}


def _environment_columns(
    trajectories: list[Trajectory], columns: dict[str, list[Any]], agent: AgentSettings
) -> dict[str, list[Any]]:
    """``turn_rewards`` and ``env_reward`` for reward functions when an environment ran; ``environments`` for TRL's."""
    if agent.trl_environments is not None:
        if "environments" in columns:
            raise ValueError("dataset column 'environments' clashes with the environments keyword; rename it")
        return {"environments": [t.environment for t in trajectories]}  # completion order, as TRL passes them
    if agent.environment_factory is None:
        return {}
    clash = sorted({"turn_rewards", "env_reward"} & set(columns))
    if clash:
        raise ValueError(f"dataset column(s) {clash} clash with the environment's reward keywords; rename them")
    return {
        "turn_rewards": [list(t.episode.rewards) for t in trajectories],  # type: ignore[union-attr]
        "env_reward": [t.episode.reward(agent.env_reward) for t in trajectories],  # type: ignore[union-attr]
    }
