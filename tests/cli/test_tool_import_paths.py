"""Tools given as import paths in a config: resolved by the CLI, from the working directory too."""

from __future__ import annotations

import io
import os
import sys
from contextlib import redirect_stdout

import pytest

from lightning_grpo.cli import GRPOCLI, main
from tests.cli.conftest import TINY


def test_tools_given_as_import_paths_reach_the_module(tmp_path):
    cli = GRPOCLI(
        args=[
            "--config", str(TINY), "--model.init_args.tools=[examples.tool_calling.calc]",
            "--model.init_args.grpo.agents.max_turns=3", "--model.init_args.grpo.agents.tool_timeout=2.5",
            f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}",
        ],
        run=False,
    )  # fmt: skip
    agent = cli.model.agent
    assert agent.multi_turn and agent.max_turns == 3 and agent.executor.timeout == 2.5
    (schema,) = agent.tool_schemas
    assert schema["function"]["name"] == "calc"
    assert schema["function"]["parameters"]["required"] == ["expression"]


def test_the_console_script_resolves_import_paths_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "my_tools.py").write_text(
        "def double(x: int) -> int:\n"
        '    """Twice a number.\n\n    Args:\n        x: The number.\n    """\n'
        "    return 2 * x\n"
    )
    monkeypatch.chdir(tmp_path)
    # the `lightning-grpo` script's sys.path: its own folder first, neither "" nor the working directory
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    monkeypatch.delitem(sys.modules, "my_tools", raising=False)
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(TINY), "--model.init_args.tools=[my_tools.double]", "--print_config"])
    assert exit_info.value.code in (0, None)
    assert "- my_tools.double" in out.getvalue()
    assert sys.path[0] == str(tmp_path)
