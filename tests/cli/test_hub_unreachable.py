"""With the hub unreachable, ``lightning-grpo fit`` stops within seconds, naming the ``hf download`` commands."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.cli.conftest import REPO, TINY, quiet_run_args
from tests.conftest import repo_pythonpath


def test_an_uncached_model_with_the_hub_unreachable_fails_fast_with_the_download_command(tmp_path):
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"),
           "PYTHONPATH": repo_pythonpath(), "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("TRANSFORMERS_OFFLINE", None)
    args = ["fit", "--config", str(TINY), "--model.init_args.model=someone/not-cached-model", *quiet_run_args(tmp_path)]
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "lightning_grpo", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)  # fmt: skip
    seconds = time.perf_counter() - start
    assert result.returncode == 1, result.stdout[-3000:]
    message = result.stdout.strip().splitlines()[-1]
    assert "the Hugging Face hub (http://127.0.0.1:9) did not answer within 2 s" in message, result.stdout[-3000:]
    assert "hf download someone/not-cached-model --local-dir models/not-cached-model" in message
    assert "Traceback" not in result.stdout and seconds < 120  # an import, a build and one connection attempt
