"""Docs that match what runs: metric names, snippets without undefined names, the install."""

from __future__ import annotations

import re
from pathlib import Path

import lightning_grpo
from tests.cli.run_process import REPO

DOCS = REPO / "docs"


def test_troubleshooting_names_only_metrics_that_are_logged():
    text = (DOCS / "troubleshooting.md").read_text()
    watched = text[text.index("Watch instead") : text.index("!!! note")]
    assert "train/zero_std_frac" in watched and "zero_var_frac" not in watched


def test_the_first_agents_snippet_runs_as_written(monkeypatch):
    built = {}

    def module(model, **kwargs):  # records the arguments instead of downloading Qwen
        built.update(model=model, **kwargs)

    monkeypatch.setattr(lightning_grpo, "GRPOModule", module)
    snippet = re.search(r"```python\n(.*?)```", (DOCS / "agents.md").read_text(), flags=re.DOTALL).group(1)
    exec(compile(snippet, "docs/agents.md", "exec"), {})
    reward = built["reward_funcs"][0]
    messages = [[{"role": "assistant", "content": "The answer is 85"}]]
    assert reward(["37+48?"], messages, answer=["85"]) == [1.0]


def test_readme_shows_a_plain_install_and_the_plot_extra():
    readme = (REPO / "README.md").read_text()
    assert "pip install .  " in readme and 'pip install ".[plot]"' in readme and ".whl" in readme
    assert "plot" in (REPO / "pyproject.toml").read_text()


def test_every_new_message_is_in_troubleshooting():
    text = (DOCS / "troubleshooting.md").read_text()
    for start in ("Stopped by SIGTERM after step", "non-finite loss", "refusing to write a checkpoint",
                  "did not finish within its timeout", "could not write checkpoint", "did you mean",
                  "prompt file 'x.jsonl' not found", "needs keyword(s)", "settings are grouped"):  # fmt: skip
        assert start in text, start
    assert Path(lightning_grpo.__file__).parent.joinpath("demo", "tiny.yaml").exists()
