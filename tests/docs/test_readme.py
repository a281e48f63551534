"""README's Python usage sketch runs as written (it uses the tiny model, so it runs offline on CPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


@pytest.mark.learning
def test_readme_usage_sketch_runs_and_learns_what_it_says(tmp_path, monkeypatch, capsys, warm_tiny_cache):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(_python_blocks()[0], str(README), "exec"), namespace)
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
    assert namespace["trainer"].global_step == 60
    printed = re.search(r"mean reward (\d\.\d\d) -> (\d\.\d\d)", capsys.readouterr().out)
    shown = re.search(r"`mean reward (\d\.\d\d) -> (\d\.\d\d)`", README.read_text())
    # the README shows what this run prints, give or take what another CPU's kernels change (docs/benchmarks.md,
    # "Learning": `python -m benchmarks.learning --cases readme`)
    for run, readme in zip(printed.groups(), shown.groups(), strict=True):
        assert abs(float(run) - float(readme)) <= 0.05, (printed.group(0), shown.group(0))
    assert namespace["last"] > namespace["first"] + 0.3
    steps = [line.split(",")[-1] for line in (tmp_path / "runs/lightning_logs/version_0/metrics.csv").open()]
    assert len(steps) == 61  # a header and one row per step


def test_readme_subclass_sketch_overrides_one_step(tokenizer):
    from lightning_grpo import GRPOModule
    from lightning_grpo.testing import build_tiny_model
    from tests.module.helpers import fixed_rollout

    namespace = {"GRPOModule": GRPOModule}
    exec(_python_blocks()[1], namespace)
    module = namespace["LengthPenalised"](
        build_tiny_model(tokenizer), [lambda p, c: [0.0] * len(c)], tokenizer=tokenizer
    )
    rollout = fixed_rollout(tokenizer, ["1+1="] * 2, ["2", "2222"], group_size=2)
    import torch

    advantages = module.compute_advantages(torch.zeros(2), rollout)
    assert advantages[0] > 0 > advantages[1]  # the shorter completion wins once lengths are penalised


def test_the_layout_section_lists_the_package_tree():
    import lightning_grpo

    package = Path(lightning_grpo.__file__).resolve().parent
    (layout,) = re.findall(r"## Layout\n.*?```\nlightning_grpo/\n(.*?)```", README.read_text(), flags=re.DOTALL)
    listed = set(re.findall(r"^  (\S+)", layout, flags=re.MULTILINE))
    tree = {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").exists()}
    tree |= {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    assert listed == tree
