"""Data-parallel glue: strategy checks, FSDP2 sharding of the policy, gradient scale, adapter export, checkpoints.

Two multi-process strategies are supported (``docs/distributed.md`` shows how to launch them):

* ``DDPStrategy`` (``strategy: ddp``): every rank holds the whole model; adapter gradients are all-reduced.
* FSDP2 through ``ModelParallelStrategy(data_parallel_size=N, tensor_parallel_size=1)``: :func:`shard_policy`
  applies ``fully_shard`` to each decoder layer, then to the Hugging Face model under the ``PeftModel``. Sampling
  runs with ``synced_gpus=True``, so ranks whose completions end early keep stepping with the others.

Lightning's FSDP1 ``FSDPStrategy`` cannot run manual optimization (Lightning issue #19685) and is refused by
:func:`check_strategy`.

Both strategies *average* gradients over ranks, while the module's micro-batch loss is ``local sum / global count``
(docs/math.md), whose gradient over the whole batch is the *sum* of the ranks' gradients. :func:`grad_scale` is the
factor (the world size) that turns the average back into that sum.

:func:`set_up` also bounds every collective's wait (``GRPOConfig.faults.collective_timeout_s``,
:func:`set_collective_timeout`): the ranks agree on a failed rollout before their next collective
(:mod:`lightning_grpo.rollout.rank_agreement`), and the timeout ends the waits no agreement can prevent, such as a
peer killed by the OS (docs/distributed.md).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy, ParallelStrategy, Strategy
from peft import PeftModel
from torch import nn

__all__ = [
    "FSDP2_STRATEGY_CONFIG",
    "check_strategy",
    "decoder_layers",
    "export_sharded_adapter",
    "fsdp_units",
    "full_adapter_state_dict",
    "gathered_parameters",
    "grad_scale",
    "gradient_sync",
    "is_fsdp2",
    "is_sharded",
    "keep_trainable_in_state_dict",
    "set_collective_timeout",
    "set_up",
    "shard_module",
    "shard_policy",
]

#: The Lightning config of the supported FSDP (FSDP2) set-up, quoted in error messages and docs.
FSDP2_STRATEGY_CONFIG = (
    "strategy: {class_path: lightning.pytorch.strategies.ModelParallelStrategy, "
    "init_args: {data_parallel_size: N, tensor_parallel_size: 1}}"
)

_FSDP1_ERROR = (
    "GRPOModule does not support Lightning's FSDPStrategy (`strategy: fsdp`, FSDP1): GRPO uses manual optimization "
    "(several optimizer steps per rollout), and FSDP1 cannot run it because Lightning calls training_step, and so "
    "backward, inside the FSDP root's forward (Lightning issue #19685, "
    "https://github.com/Lightning-AI/pytorch-lightning/issues/19685). Use FSDP2 instead, with N the number of "
    f"processes (devices x nodes):\n  {FSDP2_STRATEGY_CONFIG}\nor in Python: "
    "Trainer(strategy=ModelParallelStrategy(data_parallel_size=N, tensor_parallel_size=1))."
)

# After ``fully_shard``, decoder layers free their gathered weights after each forward; the root keeps them
# (backward needs them again at once). :func:`gathered_parameters` restores these values when it exits.
_LAYER_RESHARD_AFTER_FORWARD = True
_ROOT_RESHARD_AFTER_FORWARD = False


def _fsdp2() -> Any:
    """The FSDP2 module, ``torch.distributed.fsdp`` (``fully_shard``, ``FSDPModule``), imported lazily."""
    from torch.distributed import fsdp

    return fsdp


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` (itself included) to which ``fully_shard`` was applied, outermost first."""
    if not torch.distributed.is_available():
        return []
    fsdp_module = _fsdp2().FSDPModule
    return [module for module in model.modules() if isinstance(module, fsdp_module)]


def is_fsdp2(strategy: Strategy | None) -> bool:
    """Whether ``strategy`` is Lightning's ``ModelParallelStrategy`` (our FSDP2 path)."""
    return isinstance(strategy, ModelParallelStrategy)


def is_sharded(policy: PeftModel) -> bool:
    """Whether :func:`shard_policy` has been applied to ``policy``."""
    model = policy.get_base_model()
    return torch.distributed.is_available() and isinstance(model, _fsdp2().FSDPModule)


def check_strategy(strategy: Strategy) -> None:
    """Refuse strategies GRPO cannot run correctly, with an error that names the supported configuration.

    Args:
        strategy: The trainer's strategy (its process group and device mesh already set up).

    Raises:
        ValueError: For FSDP1 (``FSDPStrategy``), and for a ``ModelParallelStrategy`` whose tensor-parallel size is not
            1 (its ``"auto"`` default puts every device of a node in the tensor-parallel dimension).
    """
    if isinstance(strategy, FSDPStrategy):
        raise ValueError(_FSDP1_ERROR)
    if is_fsdp2(strategy):
        tensor_parallel = strategy.device_mesh["tensor_parallel"].size()
        if tensor_parallel != 1:
            raise ValueError(
                f"ModelParallelStrategy has tensor_parallel_size={tensor_parallel}; GRPOModule shards the policy with "
                "FSDP2 over the data-parallel dimension only. Put every process in that dimension:\n  "
                f"{FSDP2_STRATEGY_CONFIG}"
            )


def set_up(strategy: Strategy, config: Any, *, agents: bool) -> None:
    """At the module's ``setup``: refuse what GRPO cannot run (:func:`check_strategy`), then bound every collective's
    wait (:func:`set_collective_timeout`) to ``config.faults.collective_timeout_s``.

    Args:
        strategy: The trainer's strategy (its process groups already made).
        config: The module's ``GRPOConfig``.
        agents: Whether the rollouts run agent code (``agent=``): the timeout must then exceed ``agent_timeout``.
    """
    check_strategy(strategy)
    agent_timeout = config.agents.agent_timeout if agents else None
    set_collective_timeout(strategy, config.faults.collective_timeout_s, agent_timeout=agent_timeout)


def set_collective_timeout(strategy: Strategy, seconds: float | None, *, agent_timeout: float | None = None) -> None:
    """Make every process group of the run give up on a collective after ``seconds`` (then the process raises).

    The process groups exist before any hook of the module runs (Lightning makes them in its strategy's
    ``setup_environment``), so their timeout is changed in place (``torch.distributed``'s ``_set_pg_timeout``): the
    default group and the sub-groups of a device mesh alike. A collective that outwaits it raises (gloo), or NCCL's
    watchdog ends the process. Nothing happens on one process or with ``seconds=None``.

    Args:
        strategy: The trainer's strategy.
        seconds: ``GRPOConfig.faults.collective_timeout_s``; ``None`` keeps the strategy's own (``timeout=``, else 30
            min).
        agent_timeout: With agent code, ``GRPOConfig.agents.agent_timeout``: one rank may wait that long for another's
            rollout, so ``seconds`` must exceed it.

    Raises:
        ValueError: The strategy was given a ``timeout=`` of its own that differs from ``seconds``, or ``seconds``
            does not exceed ``agent_timeout``.
    """
    if seconds is None or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    timeout, own = timedelta(seconds=seconds), getattr(strategy, "_timeout", None)
    if own is not None and own not in (default_pg_timeout, timeout):
        raise ValueError(
            f"{type(strategy).__name__}(timeout={own}) and GRPOConfig.faults.collective_timeout_s={seconds:g} "
            "disagree: set "
            f"collective_timeout_s={own.total_seconds():g} (or None to keep the strategy's), or drop timeout="
        )
    if agent_timeout is not None and seconds <= agent_timeout:
        raise ValueError(
            f"GRPOConfig.faults.collective_timeout_s={seconds:g} must exceed agent_timeout={agent_timeout:g}: a rank "
            "may wait "
            "that long for another rank's agents before their next collective; raise collective_timeout_s"
        )
    from torch.distributed import distributed_c10d

    for group in list(distributed_c10d._world.pg_map):  # the default group and every sub-group (device meshes)
        distributed_c10d._set_pg_timeout(timeout, group)


def grad_scale(strategy: Strategy | None, world_size: int) -> float:
    """Factor applied to the loss before backward so that averaged gradients become the global loss's gradient.

    DDP all-reduces and FSDP2 reduce-scatters gradients with an *average* over ranks (as do Lightning's other
    parallel strategies). The module's per-rank loss is ``local sum / global count``, whose gradient over the whole
    batch is the *sum* over ranks; multiplying each rank's loss by the world size makes the average equal that sum
    (verl scales its loss the same way). Only the backward is scaled, never the logged loss.

    Args:
        strategy: The trainer's strategy, or ``None`` without a trainer.
        world_size: Number of processes.

    Returns:
        ``world_size`` under a parallel (data-parallel) strategy, else 1.
    """
    return float(world_size) if isinstance(strategy, ParallelStrategy) else 1.0


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a Hugging Face model: the outermost modules whose class is in ``_no_split_modules``.

    Raises:
        ValueError: The model declares no such class, or none is found in it.
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    found = [module for module in model.modules() if type(module).__name__ in names]
    inner = {id(sub) for module in found for sub in module.modules() if sub is not module}
    layers = [module for module in found if id(module) not in inner]
    if not layers:
        raise ValueError(
            f"cannot find the decoder layers of {type(model).__name__} to shard: it lists _no_split_modules="
            f"{sorted(names)}, none of which is in the model"
        )
    return layers


def shard_policy(policy: PeftModel, mesh: Any, *, gather_for_generation: bool = True) -> nn.Module:
    """Apply FSDP2: ``fully_shard`` each decoder layer, then the Hugging Face model under the ``PeftModel``.

    The ``PeftModel`` wrapper itself is not sharded: its ``generate`` calls the inner model's ``generate``, which
    enters the inner model's ``__call__`` (and so the FSDP root's hooks) at every decoding step, as
    ``PeftModel.forward`` does. Calling this again does nothing.

    Args:
        policy: The LoRA policy.
        mesh: The data-parallel device mesh (``module.device_mesh["data_parallel"]``).
        gather_for_generation: Make the inner model's ``generate`` all-gather every weight once and keep them until
            it returns (:func:`gathered_parameters`) instead of gathering each layer at every decoding step: much
            faster sampling, for the memory of one full copy of the weights.

    Returns:
        The sharded Hugging Face model (the FSDP root).
    """
    model = policy.get_base_model()
    if is_sharded(policy):
        return model
    fully_shard = _fsdp2().fully_shard
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=_LAYER_RESHARD_AFTER_FORWARD)
    fully_shard(model, mesh=mesh, reshard_after_forward=_ROOT_RESHARD_AFTER_FORWARD)
    if gather_for_generation:
        generate = model.generate

        @functools.wraps(generate)
        def generate_gathered(*args: Any, **kwargs: Any) -> Any:
            with gathered_parameters(model):
                return generate(*args, **kwargs)

        model.generate = generate_gathered  # an instance attribute: PeftModel.generate reaches it through LoraModel
    return model


def shard_module(module: nn.Module, mesh: Any, gather_for_generation: bool = True) -> None:
    """Shard a ``GRPOModule``'s ``policy`` with FSDP2 (:func:`shard_policy`) and keep only its trainable parameters
    in its state dict (:func:`keep_trainable_in_state_dict`: adapter-only checkpoints in
    ``torch.distributed.checkpoint`` too)."""
    shard_policy(module.policy, mesh, gather_for_generation=gather_for_generation)  # type: ignore[arg-type]
    keep_trainable_in_state_dict(module)


@contextmanager
def gathered_parameters(model: nn.Module) -> Iterator[None]:
    """All-gather every FSDP2 unit of ``model`` once and keep the full weights until the block exits.

    Every rank must enter the block (the all-gathers are collectives); forwards inside it run none.
    """
    units = fsdp_units(model)
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            keep = _ROOT_RESHARD_AFTER_FORWARD if unit is model else _LAYER_RESHARD_AFTER_FORWARD
            unit.set_reshard_after_forward(keep, recurse=False)
            unit.reshard()


@contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Under FSDP2, skip the gradient reduce-scatter of the backwards in the block unless ``enabled``.

    Gradients then accumulate unsharded on each rank, and the next backward with ``enabled`` (the mini-batch's last
    micro-batch) reduces their sum once: the FSDP2 analogue of DDP's ``no_sync``. Without FSDP2 this does nothing.
    """
    units = [] if enabled else fsdp_units(model)
    for unit in units:
        unit.set_requires_gradient_sync(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.set_requires_gradient_sync(True, recurse=False)


def keep_trainable_in_state_dict(module: nn.Module) -> Any:
    """Make ``module.state_dict()`` hold only parameters that require a gradient (the adapter).

    ``ModelParallelStrategy`` saves and loads checkpoints with ``torch.distributed.checkpoint`` from
    ``get_model_state_dict(module)``, and a load fails on any key the checkpoint lacks: the frozen base weights,
    which an adapter-only checkpoint leaves out, must not be in that state dict either.

    Returns:
        The hook's removable handle.
    """

    def drop_frozen(mod: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
        trainable = {prefix + name for name, param in mod.named_parameters() if param.requires_grad}
        for key in [key for key in state_dict if key not in trainable]:
            del state_dict[key]

    return module.register_state_dict_post_hook(drop_frozen)


def full_adapter_state_dict(policy: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable (adapter) weights in full, on CPU, keyed like ``policy.state_dict()``.

    Under FSDP2 each sharded weight is all-gathered (a collective: every rank must call this); frozen weights are
    never gathered.
    """
    state = {}
    for name, param in policy.named_parameters():
        if param.requires_grad:
            value = param.full_tensor() if hasattr(param, "full_tensor") else param  # a DTensor shard under FSDP2
            state[name] = value.detach().to("cpu", copy=True)
    return state


def export_sharded_adapter(policy: PeftModel, path: str | Path, *, is_global_zero: bool) -> Path:
    """Write the FSDP2-sharded adapter in PEFT format, exactly as a single-process ``save_pretrained`` of it would.

    A collective: every rank must call it. Every rank gathers the (small) adapter; rank zero writes
    ``adapter_config.json`` and ``adapter_model.safetensors``, and the others wait until it has.

    Args:
        policy: The sharded LoRA policy.
        path: Output directory.
        is_global_zero: Whether this process is rank zero.

    Returns:
        ``path`` as a ``Path``.
    """
    path = Path(path)
    state_dict = full_adapter_state_dict(policy)
    if is_global_zero:
        path.mkdir(parents=True, exist_ok=True)
        policy.save_pretrained(str(path), state_dict=state_dict)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    return path
