"""Benchmark harness: one GRPO workload, our ``GRPOModule`` and (optionally) TRL's ``GRPOTrainer``, side by side.

Run ``python -m benchmarks.run --help``; ``docs/benchmarks.md`` records the figures and the commands behind them.
Each side runs in a fresh subprocess (:mod:`benchmarks.child`) so that its peak memory is its own.
"""
