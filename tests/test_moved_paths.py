"""Every import path that moved still imports: the old path gives the same object as the new one and warns once
(``DeprecationWarning``) naming the new path (:mod:`lightning_grpo._moved`, one helper for every shim)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from lightning_grpo import _moved

REPO = Path(__file__).resolve().parents[1]

#: Old dotted path of a name -> its new one (names that moved out of a module that stays, or with their module).
MOVED_NAMES = {
    "lightning_grpo.step.StepContext": "lightning_grpo.iteration.StepContext",
    "lightning_grpo.step.UpdateBatch": "lightning_grpo.iteration.UpdateBatch",
    "lightning_grpo.step.LossCounts": "lightning_grpo.iteration.LossCounts",
    "lightning_grpo.step.StepOutput": "lightning_grpo.iteration.StepOutput",
    "lightning_grpo.step.PhaseTimer": "lightning_grpo.iteration.PhaseTimer",
    "lightning_grpo.step.Rollout": "lightning_grpo.rollout.Rollout",
    "lightning_grpo.step.TokenLogProbs": "lightning_grpo.rollout.TokenLogProbs",
    "lightning_grpo.rollout.multi_turn.sample_rollout": "lightning_grpo.rollout.sampling.sample_rollout",
    "lightning_grpo.iteration.update.MetricSums": "lightning_grpo.metrics.MetricSums",
    "lightning_grpo.step.rollout_engine.VLLMRollout": "lightning_grpo.backends.vllm.VLLMBackend",
    "lightning_grpo.callbacks.rollout_engine.CloseRolloutEngine": (
        "lightning_grpo.callbacks.close_rollout_backend.CloseRolloutBackend"
    ),
}

#: Public names that did not move: they import without a warning.
UNCHANGED = (
    "lightning_grpo.StepContext",
    "lightning_grpo.StepOutput",
    "lightning_grpo.UpdateBatch",
    "lightning_grpo.LossCounts",
    "lightning_grpo.testing.TinyModel",
    "lightning_grpo.testing.TinyTaskDataModule",
    "lightning_grpo.testing.build_tiny_model",
    "lightning_grpo.rewards.StepRewards",
    "lightning_grpo.rewards.ProcessRewardModel",
)

_CHECK = """
import importlib, json, sys, warnings
import lightning_grpo
from lightning_grpo import _moved
report = {}
for old, new in sorted(_moved.MOVED_MODULES.items()):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = importlib.import_module(old)
        second = importlib.import_module(old)
    ours = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning) and old in str(w.message)]
    same = first is second is importlib.import_module(new)
    report[old] = {"warnings": ours, "same": same, "spec": first.__spec__.name, "name": first.__name__}
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def old_module_imports() -> dict[str, dict]:
    """What importing each old module path did, in one fresh interpreter (a warning is once per process, and another
    test may have imported an old path already; no old module is imported before the loop)."""
    result = subprocess.run([sys.executable, "-c", _CHECK], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("old", "new"), sorted(_moved.MOVED_MODULES.items()))
def test_an_old_module_path_imports_the_new_module_warning_once(old_module_imports, old, new):
    assert old_module_imports[old] == {
        "warnings": [f"{old} moved to {new}; import it from there"],
        "same": True,
        "spec": new,
        "name": new,
    }


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_NAMES.items()))
def test_an_old_name_gives_the_same_object_warning_once_with_the_new_path(old, new):
    module_name, name = old.rsplit(".", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the old module's own warning, if the module moved too
        module = importlib.import_module(module_name)
    _moved.WARNED.discard(old)
    with pytest.warns(DeprecationWarning, match=rf"^{old} moved to {new}\b") as caught:
        first = getattr(module, name)
    assert len([w for w in caught if old in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(module, name) is first  # once
    assert first is _moved.resolve(new)


def test_the_old_path_of_a_moved_module_gives_its_names_too():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from lightning_grpo.rewards.steps import StepRewards
        from lightning_grpo.step.update import run_updates
        from lightning_grpo.testing.demo import DEFAULT_CONFIG
    from lightning_grpo.demo import DEFAULT_CONFIG as new_config
    from lightning_grpo.iteration.update import run_updates as new_run_updates
    from lightning_grpo.rewards import StepRewards as new_step_rewards

    assert (StepRewards, run_updates, DEFAULT_CONFIG) == (new_step_rewards, new_run_updates, new_config)


@pytest.mark.parametrize("path", UNCHANGED)
def test_the_public_names_that_stayed_import_without_a_warning(path):
    module_name, name = path.rsplit(".", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        module = importlib.import_module(module_name)
        assert getattr(module, name) is not None


def test_an_unknown_name_of_a_shim_is_an_attribute_error():
    import lightning_grpo.step

    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        lightning_grpo.step.nothing  # noqa: B018


def test_every_new_module_exists_and_no_old_module_file_is_left():
    package = REPO / "lightning_grpo"
    for old, new in _moved.MOVED_MODULES.items():
        importlib.import_module(new)
        assert not (REPO / (old.replace(".", "/") + ".py")).exists(), f"{old} is both moved and present"
        assert not (package.parent / old.replace(".", "/") / "__init__.py").exists()


def test_the_package_itself_imports_no_moved_path():
    code = (
        "import warnings\nwarnings.simplefilter('always')\nwith warnings.catch_warnings(record=True) as caught:\n"
        "    import lightning_grpo, lightning_grpo.cli, lightning_grpo.backends\n"
        "print([str(w.message) for w in caught if 'moved to' in str(w.message)])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "[]"
