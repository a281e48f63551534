"""The sampling settings of ``GRPOConfig``: how a rollout is sampled (``grpo.sampling``) and validated
(``grpo.validation``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from lightning_grpo.config.checks import COUNT, OPTIONAL_POSITIVE, POSITIVE, NumberRules, check_group
from lightning_grpo.rollout.buckets import DecodePath, check_decode_lengths
from lightning_grpo.rollout.sampling_settings import Sampler, SamplingSettings

__all__ = ["SamplingConfig", "ValidationConfig"]


@dataclass
class SamplingConfig:
    """How a training rollout is sampled: group size, lengths, the distribution and the decode path.

    The decode switches interact (``decode``, ``sampler``, ``drop_finished``, ``static_cache``) and are checked
    here; the turn cache of agent turns is ``grpo.agents.turn_cache``.
    """

    owner: ClassVar[str] = "GRPOConfig.sampling"
    rules: ClassVar[NumberRules] = {
        "num_generations": COUNT,
        "max_prompt_length": COUNT,
        "max_new_tokens": COUNT,
        "temperature": POSITIVE,
        "top_p": {"minimum": 0.0, "maximum": 1.0, "exclusive_minimum": True},
        "top_k": {"integer": True, "minimum": 0},
        "min_p": {"minimum": 0.0, "maximum": 1.0, "exclusive_maximum": True},
    }

    num_generations: int = 8
    """Completions sampled per prompt (G, a count); group estimators need G >= 2. 8 is a good default."""
    max_prompt_length: int = 512
    """Longest prompt (tokens); the data module drops longer ones."""
    max_new_tokens: int = 256
    """Longest completion (tokens); longer ones are cut and flagged as truncated."""
    temperature: float = 1.0
    """Sampling temperature (> 0); log-probs are computed at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold in (0, 1]; 1.0 disables it."""
    top_k: int = 0
    """Sample among the k most likely tokens (a count); 0 disables it."""
    min_p: float = 0.0
    """Sample among the tokens at least ``min_p`` times as likely as the most likely one (a fraction in [0, 1)); 0
    disables it. With top-k, top-p or min-p, behaviour log-probs are over the kept tokens (docs/math.md)."""
    sampler: Sampler = "multinomial"
    """``"multinomial"`` (Hugging Face ``generate``'s draws) or ``"inverse_cdf"`` (same distribution, other draws,
    much cheaper on CPU; our own decoding loop)."""
    drop_finished: bool = False
    """Drop finished samples from the batch and KV cache while sampling (our own decoding loop)."""
    static_cache: bool = False
    """Sample with ``generate`` over a static KV cache (transformers compiles it on CUDA only); the prefill is not
    shared and ``sampler``/``drop_finished`` are ignored."""
    decode: DecodePath = "auto"
    """``"eager"`` (``generate``, or our own loop as ``sampler``/``drop_finished`` choose), ``"compiled"`` (one
    compiled step per decode step over a static KV cache per shape bucket; exact against the eager loop; not with
    ``drop_finished`` or ``static_cache``), or ``"auto"`` (eager on CUDA; on CPU compiled where measured faster,
    ``lightning_grpo.rollout.buckets.CPU_PREFERS_COMPILED``). A model that cannot compile: an error with
    ``"compiled"``, eager with ``"auto"``. The ``hf`` backend only."""
    decode_lengths: list[int] | None = None
    """Static KV cache lengths (positions, prompt + completion) of the compiled path, one graph each; ``None``: one,
    ``max_prompt_length + max_new_tokens`` rounded up to a multiple of 64. Each holds at least that much."""
    sampling_adapter: Literal["as_trained", "base_dtype", "merged"] = "as_trained"
    """How the adapter samples on the ``hf`` backend: ``"as_trained"`` (exact), ``"base_dtype"`` (a copy in the base
    dtype) or ``"merged"`` (merged into the base weights while sampling; not with a quantized base). The last two
    sample a policy rounded to the base dtype (``train/rollout_logprob_diff_*``; docs/benchmarks.md)."""
    share_prompt: bool = True
    """Run each prompt once for its G samples, in the prefill and in the log-prob passes (same results; under FSDP2
    the log-prob passes share it only on packed rows)."""
    fsdp_gather_for_generation: bool = True
    """Under FSDP2, all-gather the weights once per sampling call (memory for one full copy) instead of once per
    decode step."""

    def __post_init__(self) -> None:
        with check_group(self):
            check_decode_lengths(self.decode_lengths, self.max_prompt_length, self.max_new_tokens)
            if self.decode_lengths is not None:
                self.decode_lengths = [int(n) for n in self.decode_lengths]
            clash = [name for name in ("drop_finished", "static_cache") if getattr(self, name)]
            if self.decode == "compiled" and clash:
                raise ValueError(
                    f"decode='compiled' cannot be combined with {clash[0]}=True: the compiled path keeps every row "
                    "in a fixed-shape batch (finished rows masked) over its own static cache; set "
                    f"{clash[0]} to false, or decode to 'eager' or 'auto'"
                )

    def settings(
        self, num_generations: int | None = None, temperature: float | None = None, *, synced_gpus: bool = False
    ) -> SamplingSettings:
        """The sampling settings of training (``None`` arguments take this group's), or of validation."""
        names = (
            "max_new_tokens",
            "top_p",
            "top_k",
            "min_p",
            "share_prompt",
            "sampler",
            "drop_finished",
            "static_cache",
        )
        return SamplingSettings(
            num_generations=num_generations or self.num_generations,
            temperature=temperature or self.temperature,
            synced_gpus=synced_gpus,
            **{name: getattr(self, name) for name in names},
        )


@dataclass
class ValidationConfig:
    """How validation samples and what counts as solved (``val/reward_mean``, ``val/accuracy``, ``val/pass@k``)."""

    owner: ClassVar[str] = "GRPOConfig.validation"
    rules: ClassVar[NumberRules] = {
        "num_generations": COUNT,
        "temperature": OPTIONAL_POSITIVE,
        "success_threshold": {},
    }

    num_generations: int = 1
    """Samples per validation prompt (a count: the k of ``val/pass@k``)."""
    temperature: float | None = None
    """Validation sampling temperature; ``None`` uses ``sampling.temperature``."""
    success_threshold: float = 1.0
    """A sample counts as solved when its reward is at least this (a reward); 1.0 suits 0/1 rewards."""

    def __post_init__(self) -> None:
        with check_group(self):
            pass
