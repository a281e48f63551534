"""``agent:`` given as an import path in a config reaches GRPOModule as the coroutine function."""

from __future__ import annotations

from lightning_grpo.cli import GRPOCLI
from tests.cli.conftest import TINY
from tests.rollout.test_agent_client import _async_agent


def test_an_agent_given_as_an_import_path_reaches_the_module(tmp_path):
    cli = GRPOCLI(
        args=[
            "--config", str(TINY), "--model.init_args.agent=tests.rollout.test_agent_client._async_agent",
            "--model.init_args.grpo.agents.agent_timeout=30", "--model.init_args.reward_funcs=null",
            f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}",
        ],
        run=False,
    )  # fmt: skip
    assert cli.model.agent_fn is _async_agent and cli.model.config.agents.agent_timeout == 30
    assert [name for name in cli.model.rewards.names] == ["agent_reward"]
