#!/usr/bin/env bash
# The GPU session's commands (docs/benchmarks.md, "GPU"): run from the repository root on a CUDA machine.
#   bash benchmarks/gpu_run.sh PARTS [OUT]    PARTS: comma-separated tests, retest, bench, decode, compiled, profile,
#                                             smoke, memory; or all
# The machine needs torch, transformers, peft, lightning, pytest(-xdist); wheels of what it lacks (jsonargparse,
# trl, datasets, bitsandbytes, ...) in .whl/ are installed into /tmp/site first. Logs and JSON go to OUT.
set -uo pipefail
part=${1:-all}
out=${2:-${OUT:-build/gpu}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ] && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$PWD || export PYTHONPATH=$PWD

env_info() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/env.txt" 2>&1
  python3 -c "import torch, transformers, peft, lightning, trl, bitsandbytes as b; print(torch.__version__, torch.version.cuda,
transformers.__version__, peft.__version__, lightning.__version__, trl.__version__, b.__version__)" >> "$out/env.txt" 2>&1
  nproc >> "$out/env.txt"
}

tests() {  # the CPU suite (no GPU) beside the CUDA tests (GPU)
  (CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 timeout "${SUITE_S:-170}" python3 -m pytest -v -n 14 -p no:cacheprovider \
    -m "not learning and not gpu" --timeout 120 --tb=short -rfE tests > "$out/suite.log" 2>&1; echo "exit $?" >> "$out/suite.log") &
  local suite=$!
  { timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests -k "not test_world_size_one" -rfEs
    for s in ddp fsdp2; do timeout 40 python3 -m pytest -q -p no:cacheprovider tests/gpu -k "test_world_size_one and $s" -rfEs; done
  } > "$out/gpu_tests.log" 2>&1
  wait $suite
}

bench() {  # item 2: ours and TRL's GRPOTrainer on one workload, each in its own process
  timeout "${BENCH_S:-170}" python3 -m benchmarks.run --model ${BENCH_MODEL:-qwen2.5-0.5b} --dtype bfloat16 --prompts 32 --G 8 \
    --prompt-length ${BENCH_P:-256} --max-new-tokens ${BENCH_P:-256} --micro-batch-size 32 --steps 2 --warmup-steps 1 ${BENCH_FLAGS:-} \
    --compare trl --json "$out/bench.json" > "$out/bench.log" 2>&1
}

decode() {  # every decode path on the same workload, the compiled ones first: one process and timeout per path,
             # each figure printed as it ends (the full log in decode.log), so a call cut short keeps what it timed
  local paths=("compiled (inverse_cdf), merged adapter" "compiled (inverse_cdf)" "compiled (multinomial)" "generate"
    "own loop (inverse_cdf)" "own loop (multinomial, drop finished)" "generate, merged adapter"
    "generate, static cache" "generate, static cache, merged adapter")
  local i=0 p
  for p in "${paths[@]}"; do
    i=$((i + 1))
    timeout "${DECODE_PATH_S:-45}" python3 -m benchmarks.decode_paths --model qwen2.5-0.5b --prompts 32 --G 8 \
      --prompt-length 256 --max-new-tokens 256 --repeats 1 --paths "$p" --json "$out/decode-$i.json" 2>&1 \
      | tee -a "$out/decode.log" | grep --line-buffered "tok/s" || echo "decode: $p did not finish (see decode.log)"
  done
}

compiled() {  # issue 50 item 4 on the GPU: compiled vs eager loop per sampler, compile time, aten:: events per step
  timeout "${COMPILED_S:-150}" python3 -m benchmarks.compiled_decode --model qwen2.5-0.5b --dtype bfloat16 \
    --prompts 32 --G 8 --prompt-length 256 --max-new-tokens 256 --repeats 1 --adapters as_trained merged \
    --json "$out/compiled_decode.json" 2>&1 | tee "$out/compiled_decode.log" | grep --line-buffered -E "tok/s|x warmed|aten"
}

retest() {  # the CPU tests that failed on that machine (torch 2.11), one process, with their tracebacks
  CUDA_VISIBLE_DEVICES= timeout "${RETEST_S:-120}" python3 -m pytest -q -p no:cacheprovider --tb=short -rfE \
    ${RETEST:-tests/module/test_foreign_device.py tests/module/test_generation.py tests/policy/test_weights.py \
    tests/rewards/test_reward_functions.py tests/rewards/test_trl_parity.py tests/rollout/test_sampling.py \
    tests/testing/test_model.py} > "$out/retest.log" 2>&1
}

profile() {  # where the time goes: decode steps and one update micro-batch under torch.profiler
  timeout "${PROFILE_S:-60}" python3 -m benchmarks.profile_step --model qwen2.5-0.5b --rows 256 --prompt-length 256 \
    --decode-tokens 32 > "$out/profile.log" 2>&1
}

smoke() {  # item 5: the 3- and 5-turn tool rollouts at the 0.5B shape, default settings (the turn cache on), each
            # against its 1-turn baseline; one process and timeout per task, so a cut keeps the 3-turn figures (35 s
            # cut even the 3-turn task alone; each is ~3 rollouts x 2 kinds x 159 or 301 decode steps, plus the model
            # build). NCCL strategies are in the tests part
  local turns
  for turns in 3 5; do
    timeout "${SMOKE_S:-120}" python3 -m benchmarks.multi_turn --hidden-size 896 --layers 24 --repeats 2 --turns $turns \
      >> "$out/multi_turn.log" 2>&1 || echo "smoke: $turns turns did not finish (see multi_turn.log)" | tee -a "$out/multi_turn.log"
  done
}

memory() {  # item 4: peak memory and step time per shape, bf16 and NF4 base, gradient checkpointing on and off
  for model in ${MEM_MODELS:-qwen2.5-0.5b}; do for q in ${MEM_QUANT:-none nf4}; do for gc in ${MEM_GC:-gradient-checkpointing}; do
    timeout "${MEM_S:-90}" python3 -m benchmarks.run --model "$model" --dtype bfloat16 --quantization "$q" --prompts 8 --G 8 \
      --prompt-length 512 --max-new-tokens 512 --micro-batch-size 16 --steps 1 --warmup-steps 1 "--$gc" \
      --json "$out/mem-$model-$q-$gc.json" >> "$out/memory.log" 2>&1
  done; done; done
}

env_info
case $part in
  all) tests; bench; decode; smoke; memory ;;
  *) for p in ${part//,/ }; do $p; done ;;
esac
ls -la "$out"
