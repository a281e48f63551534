"""``IterationCounter``: the base of callbacks that act every n GRPO iterations."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback
from typing_extensions import override

__all__ = ["IterationCounter", "upgrade_state_keys"]

#: Until the glossary (docs/glossary.md) made "step" an optimizer step, the argument that counts iterations was named
#: after steps (the first name below); checkpoints saved then keep these callbacks' states under keys with that name.
_OLD_ARGUMENT, _ARGUMENT = "'every_n_steps':", "'every_n_iterations':"
_UPGRADED = ("SampleLogger{", "AdapterExport{")  # the state keys' starts (Callback._generate_state_key)


class IterationCounter(Callback):
    """Base of callbacks that act every n GRPO iterations; the count survives checkpoints.

    ``trainer.global_step`` counts optimizer steps, several per iteration, so the callback counts iterations itself.
    """

    def __init__(self) -> None:
        self.iterations = 0

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"iterations": self.iterations}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.iterations = state_dict["iterations"]


def upgrade_state_keys(checkpoint: dict[str, Any]) -> None:
    """Put the states of an older checkpoint's ``SampleLogger`` and ``AdapterExport`` under today's keys, in place.

    Called by ``GRPOModule.on_load_checkpoint``, before Lightning restores the callbacks, so a resumed run keeps the
    iteration count of each (and ``AdapterExport`` its folder) whether its checkpoint was saved before the rename of
    ``every_n_iterations`` or after.

    Example::

        >>> checkpoint = {"callbacks": {"SampleLogger{'key': 'train/samples', 'every_n_steps': 3}": {"iterations": 6}}}
        >>> upgrade_state_keys(checkpoint)
        >>> checkpoint["callbacks"]
        {"SampleLogger{'key': 'train/samples', 'every_n_iterations': 3}": {'iterations': 6}}
    """
    states = checkpoint.get("callbacks")
    if not isinstance(states, dict):
        return
    for key in list(states):
        if isinstance(key, str) and key.startswith(_UPGRADED) and _OLD_ARGUMENT in key:
            states.setdefault(key.replace(_OLD_ARGUMENT, _ARGUMENT), states.pop(key))
