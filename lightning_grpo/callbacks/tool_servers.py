"""End the module's MCP tool-server sessions when a fit ends, whether it finished or failed."""

from __future__ import annotations

from lightning.pytorch import LightningModule
from typing_extensions import override

from lightning_grpo.callbacks._close_at_fit_end import CloseAtFitEnd

__all__ = ["CloseToolServers"]


class CloseToolServers(CloseAtFitEnd):
    """Close the MCP tool servers of ``pl_module.agent`` (``docs/agents.md``, "MCP tool servers") at the end of fit
    and on an exception, so no server subprocess outlives the run. A later fit reopens them on first use.

    ``GRPOModule`` adds it itself when ``tools=`` names a server (``configure_callbacks``).

    Example::

        from lightning import Trainer
        Trainer(callbacks=[CloseToolServers()])  # not needed with GRPOModule: it adds one
    """

    @override
    def close(self, pl_module: LightningModule) -> None:
        agent = getattr(pl_module, "agent", None)
        if agent is not None and hasattr(agent, "close"):
            agent.close()
