"""A new user's first ten minutes, timed: each command's first output, its longest silence, its end.

Runs, from the repository root and with an empty warm-up cache (as on a fresh machine), what the README and the docs
tell a newcomer to run: ``--help``, the demo, a config mistake, an agent example with and without its extra, an own
environment from YAML, Ctrl-C and the resume command it prints. For each it records the seconds to the first byte of
output, the longest gap between two outputs (a progress bar's redraw counts: it is what the user sees), the total, the
exit status and the first and last lines; it prints a markdown table (docs/benchmarks.md, "A new user's first ten
minutes")::

    python -m benchmarks.first_contact              # every step, about 8 minutes alone on 2 cores
    python -m benchmarks.first_contact --steps help demo
"""

from __future__ import annotations

import argparse
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_BLOCKED_RUN = (  # python -m <example> with a module made unimportable, as if its extra were never installed
    "import runpy, sys\nsys.modules[sys.argv[2]] = None\nexample = sys.argv[1]\nsys.argv = [example]\n"
    "runpy.run_module(example, run_name='__main__')\n"
)
_ONE_GENERATION = "--model.init_args.grpo.sampling.num_generations=1"  # a typical mistake: GRPO needs G >= 2
_RESUME = re.compile(r"--ckpt_path \S+")


@dataclass
class Timed:
    """What one command showed: seconds to its first output, longest silence, total; status; first and last line."""

    first: float
    silence: float
    total: float
    status: int
    text: str
    after_silence: str = ""

    def row(self, name: str) -> str:
        """One markdown table row."""
        lines = [line for line in re.split(r"[\r\n]+", self.text) if line.strip()]
        ends = f"`{lines[0][:90]}` … `{lines[-1][:90]}`" if lines else ""
        return f"| {name} | {self.first:.2f} | {self.silence:.1f} | {self.total:.1f} | {self.status} | {ends} |"


def timed(command: list[str], env: dict[str, str], interrupt_after: float | None = None) -> Timed:
    """Run ``command``, stdout and stderr together; SIGINT once after ``interrupt_after`` seconds of output."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    chunks, stamps, interrupted = [], [], False
    while True:
        ready, _, _ = select.select([process.stdout], [], [], 0.2)
        now = time.perf_counter() - start
        if interrupt_after is not None and not interrupted and stamps and now > stamps[0] + interrupt_after:
            process.send_signal(signal.SIGINT)
            interrupted = True
        if ready:
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                break
            chunks.append(chunk)
            stamps.append(now)
    status = process.wait()
    total = time.perf_counter() - start
    gaps = [b - a for a, b in zip([0.0, *stamps], [*stamps, total], strict=True)]
    longest = max(range(len(gaps)), key=gaps.__getitem__)
    after = chunks[longest].decode(errors="replace")[:120] if longest < len(chunks) else "(the end)"
    text = b"".join(chunks).decode(errors="replace")
    return Timed(stamps[0] if stamps else total, gaps[longest], total, status, text, after)


def steps(out: Path) -> dict[str, list[str]]:
    """The newcomer's commands by name (``ctrl_c`` and ``resume`` are run by :func:`main`)."""
    python, run = sys.executable, [sys.executable, "-m", "lightning_grpo"]
    where = [f"--trainer.default_root_dir={out}", f"--trainer.logger.init_args.save_dir={out}"]
    return {
        "help": [*run, "--help"],
        "demo": [*run, "demo", "--output-dir", str(out)],
        "config_mistake": [*run, "fit", "--config", "configs/debug/tiny.yaml", _ONE_GENERATION],
        "example": [python, "examples/tool_calling.py", "--output-dir", str(out)],
        "example_without_extra": [python, "-c", _BLOCKED_RUN, "examples.mcp_tools", "mcp"],
        "own_environment": [*run, "fit", "--config", "examples/own_environment/fit.yaml", *where],
        "ctrl_c": [*run, "fit", "--config", "configs/debug/tiny.yaml", *where],
    }


def main(argv: list[str] | None = None) -> None:
    """Run the steps alone, one after the other, and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", nargs="*", help="a subset, by name (default: all)")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "LIGHTNING_GRPO_CACHE": str(out / "cache")}
        rows = ["| step | first output (s) | longest silence (s) | total (s) | status | first … last line |"]
        rows.append("| --- | --- | --- | --- | --- | --- |")
        for name, command in steps(out).items():
            if options.steps and name not in options.steps:
                continue
            result = timed(command, env, interrupt_after=25.0 if name == "ctrl_c" else None)
            print(result.text[-1500:], f"\nlongest silence ended by: {result.after_silence!r}", file=sys.stderr)
            rows.append(result.row(name))
            print(rows[-1], flush=True)
            if name == "ctrl_c" and (resume := _RESUME.search(result.text)):
                again = timed([*command, *resume.group().split()], env)
                print(f"longest silence ended by: {again.after_silence!r}", file=sys.stderr)
                rows.append(again.row("resume"))
                print(rows[-1], flush=True)
        print("\n".join(rows))


if __name__ == "__main__":
    main()
