"""The benchmark workload: every knob both sides share, the fixed prompts, and the synthetic reward."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

import torch
from transformers import PreTrainedTokenizerBase

__all__ = ["Workload", "add_workload_arguments", "fraction_of_sevens", "make_prompts"]

DTypeName = Literal["float32", "bfloat16", "float16"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUANTIZATIONS = ["none", "nf4", "fp4", "int8"]


@dataclass(frozen=True)
class Workload:
    """One GRPO benchmark workload; both sides get exactly these settings.

    Attributes:
        model: ``"tiny"``, ``"small-30m"``, ``"qwen2.5-0.5b"`` or a local model directory.
        dtype: Weight dtype of the base model (the LoRA adapter stays float32 on both sides).
        quantization: ``"none"``, or the base's linear layers in ``"nf4"``, ``"fp4"`` or ``"int8"`` (bitsandbytes,
            QLoRA; both sides load the same files with the same ``BitsAndBytesConfig``).
        lora_r: LoRA rank; ``lora_alpha`` is ``2 * lora_r`` when 0.
        lora_alpha: LoRA alpha.
        prompts: Prompts per step (B).
        num_generations: Completions per prompt (G).
        prompt_length: Tokens per prompt (every prompt has exactly this many).
        max_new_tokens: Longest completion.
        fixed_length: Suppress EOS (``min_new_tokens = max_new_tokens``) so that every completion on both sides has
            exactly ``max_new_tokens`` tokens; off, completions end at EOS (for ``drop_finished``).
        length_dist: ``"none"``, or ``"lognormal"``: scripted uneven lengths forced on both sides by an EOS hook
            (:mod:`benchmarks.uneven`; needs ``fixed_length`` off), drawn once from ``seed``.
        length_min: Shortest scripted length; the longest is ``max_new_tokens``.
        length_median: Median of the scripted lengths' lognormal (before clipping).
        length_sigma: Standard deviation of the scripted lengths' logarithm.
        kl_coef: β of the KL loss (0 skips the reference forward on both sides).
        ppo_epochs: Updates per rollout (TRL ``num_iterations``).
        micro_batch_size: Completions per forward/backward; 0 means the whole rollout.
        micro_batch_tokens: Ours only: ``GRPOConfig.update.micro_batch_tokens`` (token-budget micro-batches, at most
            ``micro_batch_size`` rows each); 0: micro-batches by ``micro_batch_size`` alone.
        steps: Measured steps.
        warmup_steps: Steps run first and left out of the medians.
        threads: ``torch.set_num_threads`` in each side's process, pinned through ``OMP_NUM_THREADS`` before torch
            starts; 0: nothing chosen (no thread variable, no ``torch.set_num_threads`` call): PyTorch's own count,
            one thread per core, and our side applies its default (``lightning_grpo.iteration.cpu_threads``).
        device: ``"cpu"``, ``"cuda"`` or ``"auto"`` (CUDA when available).
        packing: Ours only: ``GRPOConfig.update.packing`` (``"auto"``, ``"true"``, ``"false"``).
        gradient_checkpointing: Recompute activations in the update pass (both sides).
        share_prompt: Ours only: prefill each prompt once for its G samples.
        share_prompt_logprobs: Ours only: one forward per distinct prompt in the log-prob passes.
        fused_head: Ours only: log-probs computed inside the output head, tile by tile (no logits tensor).
        sampler: Ours only: ``"multinomial"`` (as ``generate``) or ``"inverse_cdf"`` (our decoding loop).
        drop_finished: Ours only: our decoding loop drops finished rows (needs EOS, so not with fixed lengths).
        static_cache: Ours only: static KV cache and compiled decode step (CUDA).
        decode: Ours only: ``GRPOConfig.sampling.decode`` (``"auto"``, ``"eager"`` or ``"compiled"``).
        old_logprobs: Ours only: ``"recompute"`` (a forward before the first update) or ``"rollout"`` (the sampled
            log-probs); matters with several updates per rollout.
        temperature: Sampling temperature.
        lr: Learning rate of AdamW (no weight decay) on both sides.
        seed: Seed of the weights, the prompts and sampling.
    """

    model: str = "tiny"
    dtype: DTypeName = "float32"
    quantization: str = "none"
    lora_r: int = 16
    lora_alpha: int = 0
    prompts: int = 4
    num_generations: int = 4
    prompt_length: int = 16
    max_new_tokens: int = 16
    fixed_length: bool = True
    length_dist: str = "none"
    length_min: int = 8
    length_median: float = 64.0
    length_sigma: float = 1.0
    kl_coef: float = 0.0
    ppo_epochs: int = 1
    micro_batch_size: int = 0
    micro_batch_tokens: int = 0
    steps: int = 2
    warmup_steps: int = 1
    threads: int = 1
    device: str = "auto"
    gradient_checkpointing: bool = False
    share_prompt: bool = True
    share_prompt_logprobs: bool = True
    fused_head: bool = True
    sampler: str = "multinomial"
    drop_finished: bool = False
    static_cache: bool = False
    packing: str = "auto"
    decode: str = "auto"
    old_logprobs: str = "recompute"
    temperature: float = 1.0
    lr: float = 1e-5
    seed: int = 0

    @property
    def rows(self) -> int:
        """Completions per step (B * G)."""
        return self.prompts * self.num_generations

    @property
    def micro(self) -> int:
        """Completions per forward/backward."""
        return self.micro_batch_size or self.rows

    @property
    def alpha(self) -> int:
        """The LoRA alpha in effect."""
        return self.lora_alpha or 2 * self.lora_r

    @property
    def torch_dtype(self) -> torch.dtype:
        """The weight dtype as a ``torch.dtype``."""
        return _DTYPES[self.dtype]

    def resolved_device(self) -> str:
        """``"cuda"`` or ``"cpu"``."""
        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def scripted_lengths(self) -> list[int] | None:
        """The scripted completion length of each row (``None`` without ``length_dist``)."""
        if self.length_dist == "none":
            return None
        from benchmarks.uneven import draw_lengths

        return draw_lengths(
            self.rows, self.length_min, self.max_new_tokens, self.length_median, self.length_sigma, self.seed
        )

    def to_json(self) -> str:
        """The workload as JSON (read back with :meth:`from_json`)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Workload:
        """The workload written by :meth:`to_json`."""
        return cls(**json.loads(text))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Workload:
        """The workload from parsed :func:`add_workload_arguments` flags."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    def check(self) -> None:
        """Refuse settings the two sides cannot share."""
        if self.rows % self.micro:
            raise ValueError(f"micro_batch_size={self.micro} must divide prompts*G={self.rows}")
        if self.num_generations < 2 or self.steps < 1 or self.warmup_steps < 0:
            raise ValueError("need G >= 2, steps >= 1 and warmup_steps >= 0")
        if self.length_dist not in ("none", "lognormal"):
            raise ValueError(f"length_dist={self.length_dist!r}: choose 'none' or 'lognormal'")
        if self.length_dist != "none" and self.fixed_length:
            raise ValueError("scripted lengths (length_dist) need EOS: add --no-fixed-length")


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per :class:`Workload` field (``--prompt-length``, ``--G``, ``--no-share-prompt``, ...)."""
    defaults = Workload()
    for f in fields(Workload):
        flag = "--G" if f.name == "num_generations" else "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default)
        else:
            choices = {
                "dtype": list(_DTYPES),
                "sampler": ["multinomial", "inverse_cdf"],
                "quantization": QUANTIZATIONS,
                "old_logprobs": ["recompute", "rollout"],
                "packing": ["auto", "true", "false"],
                "decode": ["auto", "eager", "compiled"],
                "length_dist": ["none", "lognormal"],
            }
            choices = choices.get(f.name)
            parser.add_argument(flag, dest=f.name, type=type(default), default=default, choices=choices)


def make_prompts(tokenizer: PreTrainedTokenizerBase, count: int, length: int, seed: int) -> list[str]:
    """``count`` prompt texts that encode to exactly ``length`` tokens each (random non-special tokens, seeded).

    Raises:
        RuntimeError: A decoded prompt does not re-encode to ``length`` tokens.
    """
    special = set(tokenizer.all_special_ids)
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    usable = [i for i, piece in enumerate(pieces) if i not in special and piece and not any(c.isspace() for c in piece)]
    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor(usable)[torch.randint(len(usable), (count, length), generator=generator)]
    prompts = [tokenizer.decode(row.tolist()) for row in ids]
    for text in prompts:
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) != length:
            raise RuntimeError(f"a prompt did not re-encode to {length} tokens: {text[:60]!r}")
    return prompts


def fraction_of_sevens(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """Synthetic reward: the fraction of the completion's characters that are ``"7"`` (cheap; same on both sides)."""
    return [completion.count("7") / max(len(completion), 1) for completion in completions]
