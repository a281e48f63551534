"""The GRPO iteration of ``lightning_grpo``'s default path, in one file: the readable specification.

Plain torch + transformers + peft, in the spirit of cleanrl's ``ppo.py``: one line per term of the paper, with its
name in a comment (DeepSeekMath's GRPO, arXiv:2402.03300, §4.1; the notation of docs/math.md). It does exactly what
``GRPOModule`` does at ``GRPOConfig()`` on one CPU process: ``tests/docs/test_reference_grpo.py`` runs both on the
same tiny model for three iterations in float64 and requires the same sampled tokens, losses, gradients and adapters
(the package's fused output head computes the same log-probs tile by tile, in the model's dtype).

The default path, in the order of one iteration (one ``training_step``):

1. sample G completions per prompt (the prompt run once, its KV cache shared by its G samples), drawing each token
   as Hugging Face ``generate`` does (``torch.multinomial``) under a seed of (run seed, optimizer steps taken);
2. score every completion with a plain Python reward function ``fn(prompts, completions) -> list[float]``;
3. group advantages ``A_i = (r_i - mean_g) / (std_g + eps)`` (unbiased std; a constant group gives 0);
4. reference log-probs: the same model with its adapter disabled; no old log-probs pass (one optimizer step per
   rollout: ``π_old`` is ``π_θ`` detached, so the ratio is 1 but carries the policy gradient);
5. one optimizer step on the whole rollout (rows shuffled): clipped surrogate with dual clip, ``+ β·k3`` KL, both
   averaged over every loss token (token-mean; truncated completions included, no entropy bonus), gradient norm
   clipped at 1.0, AdamW(lr=1e-5) on the LoRA weights.

A run is ``optimizer = adapter_optimizer(policy)``, then ``grpo_iteration(..., optimizer, step=i)`` for the i-th
batch of prompts (one optimizer step per iteration, so ``i`` is also the count of optimizer steps taken).

Numerics as the package's: rewards, advantages and log-probs are float32 whatever the model's dtype (the
log-softmax of ``logits.float()``); the model, its gradients and the adapter keep the model's dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from peft import PeftModel
from torch import Tensor
from transformers import PreTrainedTokenizerBase

# The defaults of GRPOConfig() (lightning_grpo/config/*.py) that shape the algorithm; a change there moves these.
NUM_GENERATIONS = 8  # G: completions per prompt (sampling.num_generations)
MAX_NEW_TOKENS = 256  # longest completion (sampling.max_new_tokens)
TEMPERATURE = 1.0  # τ: sampling and log-prob temperature; top_p = 1, top_k = 0: no truncation
ADVANTAGE_EPS = 1e-6  # ε added to the group std (advantages.advantage_eps, scale "group")
CLIP_LOW, CLIP_HIGH = 0.2, 0.2  # ε_low, ε_high: the ratio is clipped to [1 - ε_low, 1 + ε_high]
DUAL_CLIP = 3.0  # c: dual clip for negative advantages (objective.dual_clip)
KL_COEF = 0.001  # β: weight of the k3 KL to the reference (objective.kl_coef, kl_estimator "k3")
MAX_LOG_RATIO = 20.0  # log-ratios are clamped to ±20 before exp (verl's bound)
MAX_GRAD_NORM = 1.0  # update.max_grad_norm
LR = 1e-5  # GRPOModule's default optimizer: AdamW(lr=1e-5) over the adapter's parameters

RewardFn = Callable[[list[str], list[str]], Sequence[float]]


def iteration_seed(seed: int, step: int) -> int:
    """The seed of an iteration on rank 0: it depends only on the run's seed and the optimizer steps taken before."""
    return (seed * 1_000_003 + step * 7_919) % 2**63


def adapter_optimizer(policy: PeftModel) -> torch.optim.Optimizer:
    """The default optimizer: AdamW over the LoRA weights only (the base model is frozen)."""
    return torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=LR)


def positions(mask: Tensor) -> Tensor:
    """Position ids that skip left padding: ``cumsum(mask) - 1``."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def sample(
    policy: PeftModel, prompt_ids: Tensor, prompt_mask: Tensor, eos_id: int, pad_id: int, g: int, max_new_tokens: int
) -> Tensor:
    """``(B*G, T)`` completion tokens, the G samples of a prompt consecutive; after a row's EOS, pad tokens."""
    out = policy(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask), use_cache=True)
    cache = out.past_key_values
    cache.batch_repeat_interleave(g)  # one prefill per prompt, shared by its G samples
    logits = out.logits[:, -1].float().repeat_interleave(g, dim=0)  # (N, V) next-token logits, float32 as generate's
    mask = prompt_mask.repeat_interleave(g, dim=0)  # (N, P)
    finished = torch.zeros(len(mask), dtype=torch.bool)
    tokens = []
    for _ in range(max_new_tokens):
        probs = torch.softmax(logits / TEMPERATURE, dim=-1)  # π_θ(· | q, o_<t) at temperature τ
        token = torch.multinomial(probs, num_samples=1).squeeze(1)  # every row draws, finished ones too
        token = torch.where(finished, pad_id, token)
        tokens.append(token)
        finished |= token == eos_id
        if finished.all():
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        inputs = dict(attention_mask=mask, position_ids=mask.sum(-1, keepdim=True) - 1, past_key_values=cache)
        logits = policy(input_ids=token[:, None], use_cache=True, **inputs).logits[:, -1].float()
    return torch.stack(tokens, dim=1)


def completion_mask(completion_ids: Tensor, eos_id: int) -> Tensor:
    """``(N, T)`` 1 up to and including the first EOS, 0 after it (a truncated row is all ones)."""
    is_eos = (completion_ids == eos_id).long()
    return ((is_eos.cumsum(-1) - is_eos) == 0).long()


def token_logprobs(model: PeftModel, input_ids: Tensor, attention_mask: Tensor, completion_ids: Tensor) -> Tensor:
    """``(N, T)`` log π(o_t | q, o_<t) of every completion token at temperature τ, in float32."""
    t = completion_ids.shape[1]
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions(attention_mask))
    logits = out.logits[:, -t - 1 : -1].float() / TEMPERATURE  # position P-1+t predicts completion token t
    return logits.gather(-1, completion_ids[..., None]).squeeze(-1) - logits.logsumexp(-1)


def group_advantages(rewards: Tensor, g: int) -> Tensor:
    """GRPO's outcome advantages (DeepSeekMath §4.1.2): each reward standardised within its group of G."""
    r = rewards.double().view(-1, g)  # (B, G), statistics in float64
    mean = r.sum(-1, keepdim=True) / g  # μ_g
    std = ((r - mean) ** 2).sum(-1, keepdim=True).div(g - 1).sqrt()  # σ_g, unbiased (n - 1)
    a = (r - mean) / (std + ADVANTAGE_EPS)  # A_i = (r_i - μ_g) / (σ_g + ε)
    a = torch.where(r.amax(-1, keepdim=True) > r.amin(-1, keepdim=True), a, 0.0)  # equal rewards: no signal
    return a.view(-1).to(rewards.dtype)  # (N,)


def grpo_loss(logprobs: Tensor, ref_logprobs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Agg(ℓ^pg) + β·Agg(ℓ^KL), each the mean over every loss token of the mini-batch (token-mean)."""
    old_logprobs = logprobs.detach()  # π_old = sg(π_θ): one optimizer step per rollout
    ratio = torch.exp((logprobs - old_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))  # r_t = π_θ / π_old
    a = advantages[:, None]  # (N, 1): A_i on every token of completion i
    surrogate = torch.maximum(-a * ratio, -a * ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH))  # PPO's clipped surrogate
    pg = torch.where((a < 0) & (surrogate > -a * DUAL_CLIP), -a * DUAL_CLIP, surrogate)  # dual clip (A < 0)
    d = (ref_logprobs - logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # log π_ref/π_θ
    kl = (d.exp() - d - 1).clamp(-10.0, 10.0)  # k3: π_ref/π_θ - log(π_ref/π_θ) - 1 (DeepSeekMath eq. 4)
    m = mask.float()  # M: 1 on the loss tokens

    def agg(per_token: Tensor) -> Tensor:  # token-mean: every loss token of the mini-batch weighs the same
        return (per_token * m).sum() / m.sum()

    return agg(pg) + KL_COEF * agg(kl)  # L = Agg(ℓ^pg) + β·Agg(ℓ^KL)


def grpo_iteration(
    policy: PeftModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    reward_fn: RewardFn,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    seed: int = 0,
    num_generations: int = NUM_GENERATIONS,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> dict[str, Tensor]:
    """One GRPO iteration on ``prompts``: sample, score, advantages, reference, one optimizer step.

    Args:
        policy: The causal LM with its LoRA adapter; the adapter disabled is the reference policy.
        tokenizer: Its tokenizer (with a pad and an EOS token).
        prompts: The B prompts of this iteration.
        reward_fn: ``fn(prompts, completions) -> rewards``, one per completion, prompts repeated G times.
        optimizer: Over the adapter's parameters (:func:`adapter_optimizer`).
        step: Optimizer steps taken before this iteration (``trainer.global_step``): the iteration's seed.
        seed: The run's seed (``GRPOModule(seed=...)``).
        num_generations: G.
        max_new_tokens: Longest completion.

    Returns:
        The iteration's ``completion_ids`` ``(N, T)``, ``rewards`` and ``advantages`` ``(N,)`` and ``loss``.
    """
    g, eos_id, pad_id = num_generations, tokenizer.eos_token_id, tokenizer.pad_token_id
    seed = iteration_seed(seed, step)
    # 1. sample: G completions per prompt, eval mode (dropout off), under the iteration's seed
    enc = tokenizer(prompts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt")
    policy.eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        completion_ids = sample(policy, enc.input_ids, enc.attention_mask, eos_id, pad_id, g, max_new_tokens)
    mask = completion_mask(completion_ids, eos_id)  # (N, T): M, truncated rows included
    completion_ids = completion_ids.masked_fill(mask == 0, pad_id)
    input_ids = torch.cat([enc.input_ids.repeat_interleave(g, dim=0), completion_ids], dim=1)  # (N, P+T)
    attention_mask = torch.cat([enc.attention_mask.repeat_interleave(g, dim=0), mask], dim=1)
    # 2. score: one reward per completion, float32
    completions = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    rewards = torch.tensor(reward_fn([p for p in prompts for _ in range(g)], completions), dtype=torch.float32)
    # 3. advantages within each group
    advantages = group_advantages(rewards, g)  # (N,)
    # 4. reference log-probs: the same weights with the adapter disabled, no gradient
    with torch.no_grad(), policy.disable_adapter():
        ref_logprobs = token_logprobs(policy, input_ids, attention_mask, completion_ids)  # log π_ref
    # 5. one optimizer step on one mini-batch: the whole rollout, its rows shuffled under the iteration's seed
    rows = torch.randperm(len(input_ids), generator=torch.Generator().manual_seed(seed))
    policy.train()
    logprobs = token_logprobs(policy, input_ids[rows], attention_mask[rows], completion_ids[rows])  # log π_θ
    loss = grpo_loss(logprobs, ref_logprobs[rows], advantages[rows], mask[rows])
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in policy.parameters() if p.requires_grad], MAX_GRAD_NORM)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"completion_ids": completion_ids, "rewards": rewards, "advantages": advantages, "loss": loss.detach()}
