"""The parts a :class:`~lightning_grpo.module.GRPOModule` is made of, built from its arguments by :func:`build_parts`.

The module's ``__init__`` hands its arguments here and keeps what comes back: the settings, the agent wiring (agent
code, tools, environments) and the weighted reward functions, the tokenizer and the policy, the record a checkpoint
keeps of that policy, the rollout backend (which samples one iteration ahead with ``async_rollout``), the entropy
control, the validation metrics and the hyperparameters Lightning saves. They are built in the order the module
always built them, so a bad argument fails with the same error, and the agent and reward checks fail before the model
loads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from peft import PeftModel
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lightning_grpo.agents import EnvironmentFactory, ToolCallParser
from lightning_grpo.algorithms.entropy import entropy_controller
from lightning_grpo.backends import BackendSpec, RolloutBackend, VLLMConfig, build_backend
from lightning_grpo.backends.ahead import ahead_of
from lightning_grpo.checkpoint import describe_policy
from lightning_grpo.config import GRPOConfig
from lightning_grpo.iteration.function_rewards import check_function_rewards
from lightning_grpo.metrics import ValidationMetrics
from lightning_grpo.policy import PolicyConfig, load_policy, load_tokenizer
from lightning_grpo.rewards import RewardFunctions
from lightning_grpo.rollout import agent_client, agent_wiring
from lightning_grpo.rollout.agent import AgentSettings

__all__ = ["ModuleParts", "build_parts"]


@dataclass(frozen=True)
class ModuleParts:
    """What a ``GRPOModule`` is made of; the module keeps each under its own attribute.

    Attributes:
        config: The algorithm settings (``grpo=``, or the defaults).
        policy_config: The loading and LoRA settings (``policy=``, or the defaults).
        agent_fn: The agent code of ``agent=``, checked (an import path imported); ``None`` without one.
        rewards: The weighted reward functions (the agents' own reward, or an environment's, when they give it).
        tokenizer: The tokenizer; one without a pad token got EOS as pad.
        policy: The policy with its LoRA adapter, in training mode.
        trained_on: What the policy is (model, adapter, tokenizer): a checkpoint records it, a resume compares it.
        agent: How a conversational rollout runs its turns (tools, tool parser, environments).
        agent_limits: Agent code's time limits and transport.
        rollout_backend: The sampling backend; with ``async_rollout``, one that also samples one iteration ahead.
        entropy_control: The module's own entropy control (its state is checkpointed).
        val_metrics: The validation metrics (reward mean, accuracy, pass@k), exact over ranks.
        hparams: The hyperparameters Lightning saves: plain values only, so checkpoints load with
            ``torch.load(weights_only=True)``.
    """

    config: GRPOConfig
    policy_config: PolicyConfig
    agent_fn: Callable[..., Any] | None
    rewards: RewardFunctions
    tokenizer: PreTrainedTokenizerBase
    policy: PeftModel
    trained_on: dict[str, Any]
    agent: AgentSettings
    agent_limits: agent_client.AgentLimits
    rollout_backend: RolloutBackend
    entropy_control: Callable[[float | None], float]
    val_metrics: ValidationMetrics
    hparams: dict[str, Any]


def build_parts(
    model: str | PreTrainedModel | PeftModel,
    reward_funcs: agent_wiring.RewardFuncs | None,
    *,
    reward_weights: Sequence[float] | None,
    tokenizer: str | PreTrainedTokenizerBase | None,
    policy: PolicyConfig | None,
    grpo: GRPOConfig | None,
    seed: int,
    tools: Sequence[dict[str, Any] | Callable[..., Any]] | None,
    environment_factory: str | Mapping[str, str | Callable[[], Any]] | EnvironmentFactory | None,
    tool_parser: ToolCallParser | None,
    vllm: VLLMConfig | None,
    agent: Callable[..., Any] | str | None,
    generate_overridden: bool,
) -> ModuleParts:
    """Build a ``GRPOModule``'s parts from its arguments (their meaning: the class's docstring).

    Args:
        model: The module's ``model``.
        reward_funcs: The module's ``reward_funcs``.
        reward_weights: The module's ``reward_weights``.
        tokenizer: The module's ``tokenizer``.
        policy: The module's ``policy``.
        grpo: The module's ``grpo``.
        seed: The module's ``seed`` (it seeds the adapter's initialisation).
        tools: The module's ``tools``.
        environment_factory: The module's ``environment_factory``.
        tool_parser: The module's ``tool_parser``.
        vllm: The module's ``vllm``.
        agent: The module's ``agent``.
        generate_overridden: Whether the module's class overrides ``generate`` (the backend checks what it allows).

    Raises:
        SettingError: A setting the rewards, the agents or the backend refuse (the message names it).
        ValueError: Arguments that cannot be combined (e.g. ``agent`` with ``tools``).
    """
    cfg = grpo or GRPOConfig()
    policy_config = policy or PolicyConfig()
    dynamic_sampling = cfg.advantages.dynamic_sampling
    agent_fn = agent_wiring.agent_code(agent, tools, environment_factory, dynamic_sampling=dynamic_sampling)
    factory, rewards = agent_wiring.agent_rewards(
        agent_fn, environment_factory, reward_funcs, reward_weights, timeout=cfg.faults.reward_timeout
    )
    check_function_rewards(cfg, rewards, agent=agent_fn is not None)  # gdpo: two functions or more
    name = model if isinstance(model, str | Path) else None
    tokenizer = load_tokenizer(tokenizer, name, trust_remote_code=policy_config.trust_remote_code)
    loaded_policy = load_policy(model, policy_config, seed=seed).train()
    trained_on = describe_policy(loaded_policy, tokenizer, model)
    agent_settings = AgentSettings.build(
        tokenizer,
        tools=tools,
        tool_parser=tool_parser,
        environment_factory=factory,
        max_turns=cfg.agents.max_turns,
        tool_timeout=cfg.agents.tool_timeout,
        env_reward=cfg.agents.env_reward,
    )
    limits = agent_client.AgentLimits.of(cfg)
    spec = BackendSpec(
        cfg,
        policy_config,
        None if name is None else str(name),
        generate_overridden=generate_overridden,
        multi_turn=(agent_settings.multi_turn and cfg.agents.max_turns > 1) or bool(agent_fn),
    )
    # always one backend; with async_rollout, one that also samples ahead
    backend = ahead_of(build_backend(spec, vllm), cfg, tokenizer, agent_settings, limits)
    objective = cfg.objective
    control = entropy_controller(
        objective.entropy_control, objective.entropy_control_args, objective.entropy_coef, shared=False
    )
    val_metrics = ValidationMetrics(cfg.validation.num_generations, cfg.validation.success_threshold)
    hparams = {"model": str(name), "grpo": asdict(cfg), "policy": asdict(policy_config), "seed": seed}
    return ModuleParts(
        config=cfg,
        policy_config=policy_config,
        agent_fn=agent_fn,
        rewards=rewards,
        tokenizer=tokenizer,
        policy=loaded_policy,
        trained_on=trained_on,
        agent=agent_settings,
        agent_limits=limits,
        rollout_backend=backend,
        entropy_control=control,
        val_metrics=val_metrics,
        hparams=hparams,
    )
