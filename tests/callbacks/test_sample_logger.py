"""SampleLogger: the sample table reaches the CSV file, text-capable and table-capable loggers, and the console."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from lightning.pytorch.loggers import CSVLogger

import lightning_grpo.callbacks.sample_logger as sample_logger_module
from lightning_grpo.callbacks import SampleLogger
from tests.callbacks.helpers import ListLogger, first_char_code, fit


class _Writer:
    """What ``TensorBoardLogger.experiment`` (a ``SummaryWriter``) offers for text."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str, int]] = []

    def add_text(self, tag: str, text_string: str, global_step: int | None = None) -> None:
        self.texts.append((tag, text_string, global_step))


class TextLogger(ListLogger):
    """Duck-typed like ``TensorBoardLogger``: ``experiment.add_text``."""

    def __init__(self) -> None:
        super().__init__()
        self.writer = _Writer()

    @property
    def experiment(self) -> _Writer:
        return self.writer


class TableLogger(ListLogger):
    """Duck-typed like ``WandbLogger``: ``log_table(key, columns, data, dataframe, step)``."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict[str, Any]] = []

    def log_table(self, key, columns=None, data=None, dataframe=None, step=None) -> None:
        self.tables.append({"key": key, "columns": columns, "data": data, "step": step})


def _shown(text: str, max_chars: int) -> str:
    """How a text appears in a Markdown cell: cut to ``max_chars``, on one line, pipes escaped."""
    text = text if len(text) <= max_chars else text[:max_chars] + "..."
    return text.replace("\r", "").replace("\n", "↵").replace("|", "\\|")


def test_every_logger_kind_and_the_console_get_the_samples(make_module, tmp_path, monkeypatch):
    printed: list[str] = []
    monkeypatch.setattr(sample_logger_module, "rank_zero_info", printed.append)
    loggers = [CSVLogger(tmp_path), TextLogger(), TableLogger(), ListLogger()]
    callback = SampleLogger(every_n_iterations=2, num_samples=3, max_chars=4)
    _, recorder = fit(make_module((first_char_code,)), [callback], iterations=4, logger=loggers)
    # Logged at iterations 2 and 4, whose metrics the loggers receive at steps 1 and 3: tables line up with curves.
    assert [step for _, step in loggers[3].logged] == [0, 1, 2, 3]
    expected = []
    for step, out in ((1, recorder.outputs[1]), (3, recorder.outputs[3])):
        rollout, rewards, adv = out["rollout"], out["rewards"].rewards, out["advantages"]
        expected += [
            [step, rollout.prompts[i], rollout.completions[i], rewards[i].item(), adv[i].item()] for i in range(3)
        ]

    with open(Path(loggers[0].log_dir) / "samples.csv", newline="", encoding="utf-8") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["step", "prompt", "completion", "reward", "advantage"]
    assert [[int(r[0]), r[1], r[2], float(r[3]), float(r[4])] for r in rows[1:]] == expected  # full texts

    texts = loggers[1].writer.texts
    assert [(tag, step) for tag, _, step in texts] == [("train/samples", 1), ("train/samples", 3)]
    for (_, text, _), rows_of_step in zip(texts, (expected[:3], expected[3:]), strict=True):
        assert text.startswith("| step | prompt | completion | reward | advantage |\n| --- |")
        for row in rows_of_step:
            assert f"| {row[0]} | {row[1]} | {_shown(row[2], 4)} | {row[3]:.4f} | {row[4]:.4f} |" in text

    tables = loggers[2].tables
    assert [t["step"] for t in tables] == [1, 3] and tables[0]["key"] == "train/samples"
    assert tables[0]["columns"] == ["step", "prompt", "completion", "reward", "advantage"]
    assert tables[0]["data"] + tables[1]["data"] == expected

    assert len(printed) == 2 and printed[0].startswith("Samples of iteration 1 (global_step 2):\n| step |")
    assert all(_shown(row[2], 4) in printed[0] for row in expected[:3])
    assert max(len(line) for line in printed[1].splitlines()) < 80  # texts cut to max_chars


def test_only_rank_zero_sends_but_every_rank_counts():
    logger = TableLogger()
    callback = SampleLogger(every_n_iterations=1, console=False)
    trainer = SimpleNamespace(is_global_zero=False, loggers=[logger], global_step=0)
    callback.on_train_batch_end(trainer, None, None, {}, 0)  # outputs are not even read off rank zero
    assert logger.tables == [] and callback.iterations == 1


def test_the_iteration_count_is_saved_in_checkpoints():
    callback = SampleLogger(every_n_iterations=3)
    callback.iterations = 7
    restored = SampleLogger(every_n_iterations=3)
    restored.load_state_dict(callback.state_dict())
    assert restored.iterations == 7


def test_nan_rewards_show_as_nan():
    table = sample_logger_module.markdown_table(["reward"], [[math.nan]])
    assert table.endswith("| nan |")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every_n_iterations": 0}, "every_n_iterations must be an integer >= 1, got 0"),
        ({"num_samples": 2.5}, "num_samples must be an integer >= 1, got 2.5"),
        ({"max_chars": True}, "max_chars must be an integer >= 1, got True"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SampleLogger(**kwargs)


def test_conversations_are_shown_whole_with_their_roles(tmp_path):
    import torch

    from lightning_grpo.rollout.batch import Rollout

    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    prompt = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "2+3?"}]
    completion = [
        {"role": "assistant", "content": "Let me add.", "tool_calls": [call]},
        {"role": "tool", "name": "add", "content": "5"},
        {"role": "assistant", "content": "5"},
    ]
    rollout = Rollout(
        prompt_ids=torch.ones(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1, dtype=torch.long),
        completion_ids=torch.ones(2, 3, dtype=torch.long), completion_mask=torch.ones(2, 3, dtype=torch.long),
        truncated=torch.tensor([False, False]), group_ids=torch.tensor([0, 0]),
        prompts=[prompt, prompt], completions=[completion, [{"role": "assistant", "content": "7"}]],
    )  # fmt: skip
    outputs = {"rollout": rollout, "rewards": SimpleNamespace(rewards=torch.tensor([1.0, 0.0])),
               "advantages": torch.tensor([0.5, -0.5])}  # fmt: skip
    table, csv_logger = TableLogger(), CSVLogger(tmp_path)
    trainer = SimpleNamespace(is_global_zero=True, loggers=[table, csv_logger], global_step=0)
    SampleLogger(every_n_iterations=1, num_samples=2, console=False).on_train_batch_end(trainer, None, outputs, {}, 0)
    shown_prompt = "[system] Use tools.\n[user] 2+3?"
    shown = '[assistant] Let me add. add({"a": 2, "b": 3})\n[tool] 5\n[assistant] 5'
    assert table.tables[0]["data"] == [
        [0, shown_prompt, shown, 1.0, 0.5],
        [0, shown_prompt, "[assistant] 7", 0.0, -0.5],
    ]
    with (Path(csv_logger.log_dir) / "samples.csv").open(encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert [row["completion"] for row in rows] == [shown, "[assistant] 7"] and rows[0]["prompt"] == shown_prompt
    assert sample_logger_module.conversation_text("plain text") == "plain text"  # string prompts are unchanged


def test_token_advantages_are_averaged_over_the_sampled_tokens_only():
    """Tool and environment tokens carry no advantage: they do not pull a row's mean toward zero."""
    import torch

    from lightning_grpo.rollout.batch import Rollout

    rollout = Rollout(
        prompt_ids=torch.ones(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1, dtype=torch.long),
        completion_ids=torch.ones(2, 4, dtype=torch.long), completion_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
        truncated=torch.tensor([False, False]), group_ids=torch.tensor([0, 0]), prompts=["p", "p"],
        completions=["a", "b"], sampled_mask=torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0]]),
    )  # fmt: skip
    advantages = torch.tensor([[1.0, 0.0, 3.0, 0.0], [-2.0, -4.0, 0.0, 0.0]])  # zeros on inserted tokens and padding
    step = {"rollout": rollout, "rewards": SimpleNamespace(rewards=torch.tensor([1.0, 0.0])), "advantages": advantages}
    rows = sample_logger_module.sample_rows(step, 2)
    assert [row[3] for row in rows] == [2.0, -3.0]  # not 4/3 and -1.5, the means over every completion token
