"""What a new user reads first: the CPU build before ``pip install .``, the memory advice as commands, and the
GSM8K range to expect (a peer's figure, labelled so)."""

from __future__ import annotations

import re

from tests.cli.conftest import REPO

CPU_WHEEL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def test_the_readme_installs_the_cpu_build_before_the_package():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert CPU_WHEEL in readme
    assert readme.index(CPU_WHEEL) < readme.index("pip install .  ")
    index = (REPO / "docs" / "index.md").read_text(encoding="utf-8")
    assert "pip install torch --index-url\nhttps://download.pytorch.org/whl/cpu" in index


def test_first_run_gives_the_24_gb_advice_as_a_command():
    page = (REPO / "docs" / "first-run.md").read_text(encoding="utf-8")
    block = re.search(r"# 24 GB card.*\n(lightning-grpo fit [^\n]*)", page)
    assert block and block.group(1).endswith("--model.grpo.update.micro_batch_size 8")


def test_first_run_names_a_gsm8k_range_from_a_labelled_peer_figure():
    page = (REPO / "docs" / "first-run.md").read_text(encoding="utf-8")
    assert "a peer's published figure, not measured here" in page
    assert "https://verl.readthedocs.io/en/latest/algo/baseline.html" in page
    assert "**36.4%**" in page and "**54.3%**" in page and "0.45-0.55" in page


def test_no_install_line_names_the_package_on_the_index():
    """``pip install "lightning-grpo[x]"`` does not resolve (the package is not on the index); only docs/vllm.md
    quotes it, to say so."""
    pattern = re.compile(r"pip install ['\"]?lightning-grpo\[")
    folders = ("lightning_grpo", "docs", "examples", "configs", "benchmarks")
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for folder in folders
        for path in sorted((REPO / folder).rglob("*"))
        if path.suffix in (".py", ".md", ".yaml") and path.name != "vllm.md"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if pattern.search(line)
    ]
    assert found == [] and pattern.search((REPO / "README.md").read_text(encoding="utf-8")) is None, found
