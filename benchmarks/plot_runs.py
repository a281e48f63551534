"""Plot runs' metrics side by side: the picture of a healthy and a stuck run in ``docs/first-run.md``.

``python -m benchmarks.plot_runs LABEL=metrics.csv ... --out docs/img/healthy-vs-stuck.png`` draws, per run, the mean
reward, the token entropy and the share of groups without signal (``train/zero_std_frac``) against the iteration.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

__all__ = ["PANELS", "main", "series"]

#: The metrics drawn, one panel each, with their axis labels.
PANELS = {
    "train/reward_mean": "mean reward",
    "train/entropy": "token entropy (nats)",
    "train/zero_std_frac": "groups without signal",
}


def series(path: Path, metric: str) -> list[float]:
    """The values of ``metric`` in a CSVLogger ``metrics.csv``, one per logged step (empty cells skipped)."""
    with path.open(newline="") as handle:
        return [float(row[metric]) for row in csv.DictReader(handle) if row.get(metric)]


def main(argv: list[str] | None = None) -> Path:
    """Draw the panels for every ``LABEL=metrics.csv`` and save them as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parser = argparse.ArgumentParser(prog="python -m benchmarks.plot_runs", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="LABEL=path/to/metrics.csv")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    figure, axes = plt.subplots(1, len(PANELS), figsize=(10, 3))
    for run in args.runs:
        label, _, path = run.partition("=")
        for axis, (metric, name) in zip(axes, PANELS.items(), strict=True):
            values = series(Path(path), metric)
            axis.plot(range(1, len(values) + 1), values, label=label)
            axis.set(xlabel="GRPO iteration", title=name)
    axes[0].legend(loc="upper left", fontsize=8)
    figure.suptitle(args.title, fontsize=10)
    figure.tight_layout()
    figure.savefig(args.out, dpi=80)
    plt.close(figure)
    print(f"saved {args.out}")
    return args.out


if __name__ == "__main__":
    main()
