"""Each example in examples/ runs in-process with tiny settings (the tiny model, CPU, offline)."""

from __future__ import annotations

import importlib.util
import json
import random
import re
import socket
import time
from pathlib import Path
from types import ModuleType

import pytest

from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer
from tests.cli.conftest import REPO


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` by path (examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_custom_reward(tmp_path, warm_tiny_cache):
    example = load_example("custom_reward")
    assert example.sum_from_prompt(["2+3=", "hello"], ["5", "5"]) == [1.0, None]
    assert example.concise(["1+1="] * 2, ["2", "22222"], answer=["2", "2"], completion_lengths=[2, 6]) == [1.0, 1 / 3]
    args = ["--max-steps", "3", "--num-generations", "4", "--batch-size", "4", "--output-dir", str(tmp_path)]
    trainer = example.main([*args, "--no-progress-bar"])
    assert trainer.global_step == 3
    header = (Path(trainer.logger.log_dir) / "metrics.csv").read_text().splitlines()[0]
    assert "train/reward/sum_from_prompt" in header and "train/reward/concise" in header


def test_subclass_step(warm_tiny_cache):
    example = load_example("subclass_step")
    module = example.main(["--max-steps", "3", "--num-generations", "4", "--batch-size", "4", "--no-progress-bar"])
    assert isinstance(module, example.LengthPenaltyGRPO) and module.trainer.global_step == 3
    assert 0 < float(module.trainer.callback_metrics["train/length_penalty"]) <= 0.1


def test_gsm8k_lora_with_the_tiny_model_and_a_local_jsonl(tmp_path):
    pairs = [(1, 2), (3, 4)]
    rows = [{"question": f"What is {a} plus {b}?", "answer": f"{a}+{b}={a + b}\n#### {a + b}"} for a, b in pairs]
    data = tmp_path / "questions.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    model_dir = tmp_path / "tiny"  # a local model directory, as a user passes one
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    example = load_example("gsm8k_lora")
    trainer = example.main(
        [
            "--model", str(model_dir), "--train-data", str(data), "--val-data", str(data), "--no-chat-template",
            "--max-steps", "2", "--num-generations", "2", "--batch-size", "2", "--max-new-tokens", "4",
            "--micro-batch-size", "2", "--dtype", "float32", "--accelerator", "cpu", "--val-every", "2",
            "--save-every", "1", "--output-dir", str(tmp_path / "runs"), "--no-progress-bar",
        ]
    )  # fmt: skip
    assert trainer.global_step == 2
    assert "val/accuracy" in trainer.callback_metrics
    assert (Path(trainer.logger.log_dir) / "adapter").is_dir()  # beside the run: runs/gsm8k_lora/version_0/adapter
    assert trainer.lightning_module.rewards.names == ("math_answer", "format_reward")


def test_tool_calling_runs_and_prints_its_line(tmp_path, capsys):
    example = load_example("tool_calling")
    assert example.calc("(2+3)*4") == "20" and example.calc("7/2") == "3.5"
    args = ["--max-steps", "2", "--warmup-steps", "20", "--num-generations", "4", "--output-dir", str(tmp_path)]
    first, last, steps = example.main([*args, "--no-progress-bar"])
    assert steps == 2 and 0.0 <= first <= 1.0 and 0.0 <= last <= 1.0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"tool_calling: mean reward \d\.\d\d -> \d\.\d\d over 2 iterations \(\d+ s\)", line), line


def test_mcp_tools_starts_its_server_runs_and_closes_it(tmp_path, capsys):
    pytest.importorskip("mcp")
    example = load_example("mcp_tools")
    args = ["--max-steps", "2", "--warmup-steps", "20", "--num-generations", "4", "--output-dir", str(tmp_path)]
    first, last, steps = example.main([*args, "--no-progress-bar"])
    assert steps == 2 and 0.0 <= first <= 1.0 and 0.0 <= last <= 1.0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"mcp_tools: mean reward \d\.\d\d -> \d\.\d\d over 2 iterations \(\d+ s\)", line), line


def test_multi_turn_env_game_and_a_short_run(tmp_path, capsys):
    example = load_example("multi_turn_env")
    env = example.GuessEnv({"secret": 5})
    assert env.reset() is None
    assert example_step(env, "3") == ("higher", 0.0, False)
    assert example_step(env, "x") == ("a number 1-8", 0.0, False)
    assert example_step(env, "7") == ("lower", 0.0, False)
    assert example_step(env, "5") == (None, pytest.approx(0.7), True)  # right on the 4th guess: 1 - 3 * 0.1
    args = ["--max-steps", "2", "--warmup-steps", "10", "--num-generations", "4", "--output-dir", str(tmp_path)]
    _, _, steps = example.main([*args, "--no-progress-bar"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    pattern = r"multi_turn_env: mean reward \d\.\d\d -> \d\.\d\d over 2 iterations \(\d+ s\)"
    assert steps == 2 and re.fullmatch(pattern, line), line


@pytest.mark.parametrize("fraction", ["-0.1", "1.5"])
def test_multi_turn_env_refuses_a_follow_fraction_outside_0_1(fraction, capsys):
    with pytest.raises(SystemExit):
        load_example("multi_turn_env").parse(["--follow-fraction", fraction])
    assert "--follow-fraction must be in [0, 1]" in capsys.readouterr().err


def test_multi_turn_env_defaults_credit_each_turn_and_take_16_secrets_an_iteration():
    options = load_example("multi_turn_env").parse([])  # the settings the docstring says make every seed learn
    assert (options.advantage_estimator, options.batch_size, options.lr) == ("grpo_process", 16, 4e-3)
    assert options.follow_fraction == 0.15


def test_multi_turn_env_warm_up_games_that_follow_the_feedback_are_a_binary_search():
    example = load_example("multi_turn_env")
    tokenizer = build_tiny_tokenizer()
    for seed in range(6):
        ids, _ = example.warm_up_game(tokenizer, random.Random(seed), 4, follow_fraction=1.0)
        turns = re.findall(r"A:\n(\d+)<eos>(?:\nU:\n(\w+)<eos>)?", tokenizer.decode(ids))
        low, high = 1, 8
        for guess, feedback in turns:  # each guess is the middle of what the feedback so far leaves possible
            assert int(guess) == (low + high) // 2, turns
            low, high = (int(guess) + 1, high) if feedback == "higher" else (low, int(guess) - 1)
        assert turns and turns[-1][1] == ""  # the last guess was right (binary search finds 1-8 in 4)


def example_step(env, text: str) -> tuple[object, float, bool]:
    step = env.step({"role": "assistant", "content": text})
    return step.observation, step.reward, step.done


def test_gsm8k_lora_without_a_network_stops_at_once_naming_hf_download(monkeypatch, capsys):
    """No network and HF_HUB_OFFLINE unset: one connect to the (here closed) hub, then the download commands.

    Without the check, transformers and datasets retry for about a minute first (issue 40 measured 52 s).
    """
    with socket.socket() as probe:  # a local port nothing listens on: the connection is refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    example = load_example("gsm8k_lora")
    start = time.perf_counter()
    with pytest.raises(SystemExit) as stopped:
        example.main(["--output-dir", "unused"])
    assert time.perf_counter() - start < 15  # behaviour: stopped before any loader retried (52 s in issue 40)
    message = str(stopped.value.code)
    assert f"http://127.0.0.1:{port}" in message
    assert "needs model Qwen/Qwen2.5-0.5B-Instruct, dataset openai/gsm8k. " in message  # both splits, named once
    assert "hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir models/Qwen2.5-0.5B-Instruct" in message
    assert "huggingface-cli" not in message and "HF_HUB_OFFLINE=1" in message


def test_gsm8k_lora_checks_no_hub_when_offline_or_local(monkeypatch, tmp_path):
    example = load_example("gsm8k_lora")
    monkeypatch.setattr(example, "hub_reachable", lambda timeout: pytest.fail("the hub was checked"))
    local = example.parse(["--model", str(tmp_path), "--train-data", "a.jsonl", "--val-data", "none"])
    assert example.hub_sources(local) == []
    example.check_hub(local)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    example.check_hub(example.parse([]))
