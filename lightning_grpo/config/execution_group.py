"""The execution settings of ``GRPOConfig``: how a rollout is split into updates and passes (``grpo.update``), how
agents run (``grpo.agents``), what samples (``grpo.backend``) and what a failure does (``grpo.faults``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from lightning_grpo.algorithms.catalogue import is_import_path
from lightning_grpo.config.checks import COUNT, OPTIONAL_COUNT, OPTIONAL_POSITIVE, POSITIVE, NumberRules, check_group
from lightning_grpo.rewards._validation import check_timeouts
from lightning_grpo.settings_checks import SettingError

__all__ = ["AgentConfig", "BackendConfig", "FaultConfig", "UpdateConfig"]


@dataclass
class UpdateConfig:
    """How one rollout is split and passed over: epochs, mini-batches (one optimizer step each), micro-batches (one
    backward each), and the memory of the log-prob passes. Sizes count completions (rows) per device."""

    owner: ClassVar[str] = "GRPOConfig.update"
    rules: ClassVar[NumberRules] = {
        "ppo_epochs": COUNT,
        "mini_batch_size": OPTIONAL_COUNT,
        "micro_batch_size": OPTIONAL_COUNT,
        "micro_batch_tokens": OPTIONAL_COUNT,
        "max_grad_norm": OPTIONAL_POSITIVE,
        "logprob_chunk_size": COUNT,
        "fused_head_tile_mib": OPTIONAL_COUNT,
    }

    ppo_epochs: int = 1
    """Passes over each rollout (a count; verl ``ppo_epochs``, TRL ``num_iterations``)."""
    mini_batch_size: int | None = None
    """Rows per optimizer step; ``None`` uses the whole rollout (one optimizer step per pass)."""
    micro_batch_size: int | None = None
    """Rows per forward/backward; ``None`` uses the whole mini-batch."""
    micro_batch_tokens: int | None = None
    """Token budget of a micro-batch (prompt and completion tokens, padding excluded; verl
    ``ppo_max_token_len_per_gpu``): the fewest balanced micro-batches within it, every rank running the same number;
    ``micro_batch_size``, if set too, caps their rows. ``None``: by ``micro_batch_size`` alone."""
    max_grad_norm: float | None = 1.0
    """Clip the adapter's gradient norm to this before each optimizer step; ``None`` disables it."""
    packing: bool | Literal["auto"] = "auto"
    """Run the log-prob passes and the update on packed rows (no padding, attention kept inside each sequence;
    docs/configuration.md, "Packing"): ``"auto"`` packs a rollout whose completion positions are at least 20 %
    padding where the attention implementation takes packed rows; ``True`` always (an error where it cannot);
    ``False`` never. Exact: the same per-token log-probs within float rounding."""
    logprob_chunk_size: int = 1024
    """Positions per chunk of the log-softmax (memory versus kernel launches)."""
    fused_head: bool = True
    """Compute log-probs inside the output head, tile by tile, so no ``(N, T, V)`` logits tensor exists."""
    fused_head_tile_mib: int | None = None
    """Float32 MiB of one tile of the fused head; ``None``: 512 on a GPU, on the CPU about an eighth of the final
    hidden states (docs/benchmarks.md, "GPU readiness")."""

    def minibatches(self, rows: int) -> int:
        """Mini-batches in one pass over ``rows`` rows: ``ceil(rows / mini_batch_size)`` (the last one may be short),
        one with ``mini_batch_size=None`` or no rows. The one count every path uses (the update, the old log-prob
        decision, the rollout sampled ahead)."""
        return -(-rows // self.mini_batch_size) if self.mini_batch_size and rows else 1

    def updates(self, rows: int) -> int:
        """Optimizer steps one rollout of ``rows`` rows serves: ``ppo_epochs`` passes of :meth:`minibatches`."""
        return self.ppo_epochs * self.minibatches(rows)

    def __post_init__(self) -> None:
        with check_group(self):
            mini, micro = self.mini_batch_size, self.micro_batch_size
            if self.micro_batch_tokens is None and mini is not None and micro is not None and mini % micro:
                raise ValueError(f"mini_batch_size={mini} must be a multiple of micro_batch_size={micro}")


@dataclass
class AgentConfig:
    """Multi-turn trajectories with tools, environments or your own agent code (docs/agents.md)."""

    owner: ClassVar[str] = "GRPOConfig.agents"
    rules: ClassVar[NumberRules] = {
        "max_turns": COUNT,
        "tool_timeout": POSITIVE,
        "agent_call_timeout": POSITIVE,
        "agent_timeout": POSITIVE,
        "agent_batch_window": {"minimum": 0.0},
        "agent_http_port": {"integer": True, "minimum": 0, "maximum": 65535},
    }

    max_turns: int = 4
    """Most policy turns of a trajectory with tools or an environment (a count); ``sampling.max_new_tokens`` is the
    token budget of the whole trajectory. A trajectory cut by either is truncated."""
    tool_timeout: float = 10.0
    """Seconds a tool call may run; a call past it becomes an error message the model sees."""
    env_reward: Literal["sum", "last"] = "sum"
    """How per-turn environment rewards become the ``env_reward`` keyword of reward functions."""
    turn_cache: bool | None = None
    """Keep each trajectory's KV cache from one turn to the next, so a turn prefills only the inserted tokens.
    ``None`` (auto): on for every multi-turn run with a backend that keeps it (``hf``), on one process and under
    DDP; off under FSDP2, with ``sampling.static_cache`` and other backends; it wins over ``sampling.decode:
    compiled`` for agent turns. ``True``: also single-turn, an error where it cannot be kept; ``False``: every turn
    re-prefills its context."""
    agent_call_timeout: float = 60.0
    """Seconds one chat call of ``GRPOModule(agent=...)`` may wait for its answer (then ``APITimeoutError``; the
    call leaves no trace)."""
    agent_timeout: float = 600.0
    """Seconds one execution of the agent code (``agent(client, row)``) may take; past it, cancelled and skipped
    (``rollout/agent_failed``)."""
    agent_batch_window: float = 0.01
    """Seconds the agents' calls are gathered before a batch is sampled while some agent is busy with its own work."""
    agent_transport: Literal["in_process", "http"] = "in_process"
    """How agent code reaches the policy: an in-process ``AsyncOpenAI`` (``"in_process"``), or a loopback
    ``/v1/chat/completions`` server (``"http"``, for agent programs in other processes; docs/agents.md)."""
    agent_http_port: int = 0
    """Port of the ``"http"`` server on 127.0.0.1; 0 picks a free one each rollout; rank r listens on
    ``agent_http_port + r``."""

    def __post_init__(self) -> None:
        with check_group(self):
            pass


@dataclass
class BackendConfig:
    """What samples the rollouts, with its own settings, and whether it samples one iteration ahead."""

    owner: ClassVar[str] = "GRPOConfig.backend"
    rules: ClassVar[NumberRules] = {}

    rollout_backend: str = "hf"
    """``"hf"`` (Hugging Face ``generate``, or our own loop), ``"vllm"`` (a colocated vLLM engine, docs/vllm.md; TRL
    ``vllm_mode="colocate"``), ``"vllm_server"`` (a vLLM server elsewhere; TRL ``vllm_mode="server"``), or the import
    path of your own ``RolloutBackend`` class (docs/backends.md)."""
    rollout_backend_args: dict[str, Any] | None = None
    """The backend's own settings (its ``settings_class``' fields: ``VLLMConfig``, ``VLLMServerConfig``); an unknown
    key is an error naming the allowed ones. A resume with other values logs them and uses them."""
    async_rollout: bool = False
    """Sample one iteration ahead: the next rollout is sampled in the background, with the adapter of the iteration
    before, while this one updates (``rollout/staleness``). Needs ``rollout_backend: vllm_server``; not with a
    ``generate`` override, dynamic sampling, tools, environments, agent code or FSDP2 (docs/vllm.md)."""

    def __post_init__(self) -> None:
        with check_group(self):
            backend, args = self.rollout_backend, self.rollout_backend_args
            if backend not in ("hf", "vllm", "vllm_server") and not is_import_path(backend):
                raise ValueError(
                    f"rollout_backend={backend!r} is not valid; choose one of 'hf', 'vllm', 'vllm_server', or the "
                    "import path of a RolloutBackend class such as 'my_project.backends.MyBackend'"
                )
            if args is not None and not (isinstance(args, dict) and all(isinstance(key, str) for key in args)):
                raise TypeError(f"rollout_backend_args must be a mapping of setting names to values, got {args!r}")
            self.rollout_backend_args = None if args is None else dict(args)


@dataclass
class FaultConfig:
    """What a slow reward, a non-finite value or a silent rank does (docs/troubleshooting.md)."""

    owner: ClassVar[str] = "GRPOConfig.faults"
    rules: ClassVar[NumberRules] = {
        "max_skipped_steps": {"integer": True, "minimum": 0},
        "collective_timeout_s": {"minimum": 1.0, "maximum": 604800.0, "allow_none": True},
    }

    reward_timeout: float | dict[str, float | None] | None = None
    """Seconds each reward function may take per iteration: one number, a mapping from reward name to seconds
    (``{"judge": 30}``), or ``None`` for no limit. Past it the run stops with an error naming the function."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """A non-finite loss, KL, ratio or gradient norm: ``"stop"`` the run with an error naming the optimizer step and
    the quantity, or ``"skip"`` the optimizer step (a warning), at most ``max_skipped_steps`` times."""
    max_skipped_steps: int = 3
    """Most optimizer steps ``on_nonfinite="skip"`` may skip in a run before it stops."""
    collective_timeout_s: float | None = 900.0
    """Seconds any collective of a run of several processes may wait for the other ranks (1 to 604800); then it
    raises instead of hanging. Must exceed ``agents.agent_timeout``. ``None`` keeps the strategy's (docs/
    distributed.md, "When a rank fails")."""

    def __post_init__(self) -> None:
        with check_group(self):
            timeout = self.reward_timeout
            try:
                check_timeouts(timeout, tuple(timeout) if isinstance(timeout, dict) else ("every reward",))
            except SettingError as error:  # timeout['judge'] -> reward_timeout['judge']; one number: reward_timeout
                key = error.setting.removeprefix("timeout")
                raise error.renamed("reward_timeout" + ("" if key == "['every reward']" else key)) from None
