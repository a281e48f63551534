"""CompletionStats: lengths and truncation against the sampled tokens of the same step."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.callbacks import CompletionStats
from tests.callbacks.helpers import fit
from tests.conftest import tiny_sampling


def test_lengths_and_truncation_match_the_sampled_tokens(make_module, tokenizer):
    # With max_new_tokens=3 the untrained model rarely emits EOS: most completions are truncated.
    module = make_module(sampling=tiny_sampling(max_new_tokens=3, num_generations=8))
    _, recorder = fit(module, [CompletionStats()], iterations=2)
    for out, logged in zip(recorder.outputs, recorder.metrics, strict=True):
        ids = out["rollout"].completion_ids.tolist()
        # By hand: a completion's length is its tokens up to and including the first EOS; no EOS -> truncated.
        lengths = [row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row) for row in ids]
        truncated = [tokenizer.eos_token_id not in row for row in ids]
        torch.testing.assert_close(logged["train/completion/length_mean"], torch.tensor(sum(lengths) / len(lengths)))
        assert logged["train/completion/length_min"] == min(lengths)
        assert logged["train/completion/length_max"] == max(lengths)
        torch.testing.assert_close(logged["train/completion/truncated_frac"], torch.tensor(sum(truncated) / 16))
        torch.testing.assert_close(logged["train/completion/eos_frac"], torch.tensor(1 - sum(truncated) / 16))


def test_bad_prefix_is_refused():
    with pytest.raises(TypeError, match="prefix must be a string such as 'train/', got 3"):
        CompletionStats(prefix=3)
