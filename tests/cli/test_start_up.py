"""The command line's first line comes before any library loads: ``--help``, ``-h`` and no arguments are answered
from a static text that lists LightningCLI's subcommands; any other command says on stderr what it loads, and its
first error is the next line. The package's public names are imported when first used (PEP 562)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from lightning.pytorch.cli import LightningCLI

import lightning_grpo
import lightning_grpo.cli
from lightning_grpo.cli import GRPOCLI
from lightning_grpo.cli.argument_checks import SUBCOMMANDS
from lightning_grpo.cli.before_loading import announce_loading, help_text
from tests.cli.conftest import FIT_LOADING, REPO, TINY
from tests.conftest import repo_pythonpath

LIBRARIES = ("torch", "lightning", "transformers", "peft")
#: ``python -m lightning_grpo <args>`` for each of ``sys.argv[1]`` (JSON lists), then what it had imported.
_AFTER_ANSWERS = """
import json, logging, runpy, sys
for args in json.loads(sys.argv[1]):
    sys.argv = ["lightning_grpo", *args]
    try:
        runpy.run_module("lightning_grpo", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        print("exit", stop.code, file=sys.stderr)
loaded = [name for name in {libraries} if name in sys.modules]
filters = [getattr(f, "__name__", "") for name in ("lightning.pytorch.utilities.rank_zero",
           "bitsandbytes.backends.cpu.ops") for f in logging.getLogger(name).filters]
print(json.dumps({{"loaded": loaded, "filters": filters}}), file=sys.stderr)
"""


def _python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": repo_pythonpath()}
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _listed_subcommands(text: str) -> list[str]:
    section = text.split("Available subcommands:", 1)[1]
    return [match.group(1) for line in section.splitlines() if (match := re.match(r"^ {4}(\w+) ", line))]


def test_the_static_help_lists_lightning_clis_subcommands_and_the_demo():
    assert tuple(LightningCLI.subcommands()) == SUBCOMMANDS
    assert _listed_subcommands(help_text("lightning-grpo")) == ["demo", *LightningCLI.subcommands()]


def test_the_static_help_lists_what_the_parsers_own_help_lists(capsys):
    with pytest.raises(SystemExit) as stop:
        GRPOCLI(args=["--help"])  # the parser itself: lightning_grpo.cli.main answers from the static text
    assert stop.value.code == 0
    assert _listed_subcommands(capsys.readouterr().out) == _listed_subcommands(help_text("lightning-grpo"))


def test_help_and_no_arguments_load_no_library_and_the_log_filters_are_on():
    cases = [["--help"], ["-h"], [], ["--debug", "--help"]]
    result = _python("-c", _AFTER_ANSWERS.format(libraries=LIBRARIES), json.dumps(cases))
    *answers, report = result.stderr.strip().splitlines()
    assert json.loads(report) == {"loaded": [], "filters": ["_drop_lightning_tips", "_drop_hub_kernel_hint"]}, report
    assert result.stdout.count("Available subcommands:") == 3, result.stdout  # --help, -h, --debug --help
    assert [line for line in answers if line.startswith("exit")] == ["exit 0", "exit 0", "exit 2", "exit 0"]
    assert "python -m lightning_grpo: error: no subcommand given: choose one of demo, fit," in result.stderr


def test_a_config_error_is_the_first_line_after_the_loading_line():
    result = _python("-m", "lightning_grpo", "fit", "--config", str(TINY), "--trainer.max_step=2")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines()[:2] == [
        FIT_LOADING,
        "python -m lightning_grpo fit: error: unknown setting 'trainer.max_step': did you mean 'trainer.max_steps'? "
        "Fix the name and run again.",
    ], result.stderr


def test_print_config_keeps_stdout_clean_for_a_file():
    result = _python("-m", "lightning_grpo", "fit", "--config", str(TINY), "--print_config")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.splitlines()[0] == FIT_LOADING
    assert "loading" not in result.stdout and yaml.safe_load(result.stdout)["trainer"]["max_steps"] > 0


def test_the_loading_line_goes_to_stderr_only_while_a_library_is_missing(capsys, monkeypatch):
    announce_loading(["fit", "--config", "x.yaml"], "lightning-grpo")
    assert capsys.readouterr().err == ""  # all four are loaded in this process: nothing to say
    monkeypatch.delitem(sys.modules, "peft")
    announce_loading(["fit", "--config", "x.yaml"], "lightning-grpo")
    announce_loading(["--config", "x.yaml"], "lightning-grpo")
    printed = capsys.readouterr()
    assert printed.out == ""
    assert printed.err.splitlines() == [
        "lightning-grpo fit: loading torch, Lightning, transformers and peft (10-20 s on 2 cores)...",
        "lightning-grpo: loading torch, Lightning, transformers and peft (10-20 s on 2 cores)...",
    ]


@pytest.mark.parametrize("package", [lightning_grpo, lightning_grpo.cli])
def test_the_lazy_names_resolve_and_are_listed(package):
    assert set(package.__all__) == {*package._EXPORTS, *(["__version__"] if package is lightning_grpo else [])}
    for name in package.__all__:
        assert getattr(package, name) is not None
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="has no attribute 'GRPOModul'"):
        package.GRPOModul  # noqa: B018 - the attribute access is the test


def test_the_lazy_names_are_the_modules_own():
    from lightning_grpo import GRPOModule, __version__
    from lightning_grpo.module import GRPOModule as defined

    assert GRPOModule is defined and __version__ == "0.1.0"
    assert lightning_grpo.__getattr__("testing").__name__ == "lightning_grpo.testing"  # a subpackage, when named


def _stderr_lines_ticking(script: str) -> list[str]:
    """The stderr lines of ``python -c script`` with a "still loading" line every 0.3 s."""
    env = {**os.environ, "LIGHTNING_GRPO_LOADING_TICK": "0.3"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    return done.stderr.splitlines()


def test_a_slow_import_says_it_is_still_loading_until_the_module_is_defined():
    script = (
        "import sys, time\nfrom lightning_grpo.cli.before_loading import announce_libraries\n"
        "announce_libraries('x')\ntime.sleep(1.0)\nimport lightning_grpo.module\n"
        "print('loaded', file=sys.stderr, flush=True)\ntime.sleep(1.0)\n"
    )
    lines = _stderr_lines_ticking(script)
    assert lines[0] == "x: loading torch, Lightning, transformers and peft (10-20 s on 2 cores)...", lines
    ticks = [line for line in lines[1 : lines.index("loaded")] if line.startswith("x: still loading (")]
    assert len(ticks) >= 2, lines  # every 0.3 s while loading
    assert lines[lines.index("loaded") + 1 :] == []  # and never after GRPOModule is defined


def test_the_command_line_says_it_is_still_loading_until_it_builds_what_the_config_names():
    script = (
        "import sys, time\nfrom lightning_grpo.cli.before_loading import announce_loading, building_started\n"
        "announce_loading(['fit'], 'p')\nimport lightning_grpo.module\ntime.sleep(1.0)\n"
        "print('defined', file=sys.stderr, flush=True)\nbuilding_started()\n"
        "print('building', file=sys.stderr, flush=True)\ntime.sleep(1.0)\n"
    )
    lines = _stderr_lines_ticking(script)
    parsing = lines[lines.index("defined") - 3 : lines.index("defined")]
    assert len(parsing) == 3 and all(line.startswith("p fit: still loading (") for line in parsing), lines
    assert lines[lines.index("building") + 1 :] == []  # the build says what it does from here
