"""Exact-answer reward for math problems: the final answer of a completion against a reference (GSM8K, MATH).

The final answer is taken from the last ``\\boxed{...}``, else a ``#### X`` line, else ``<answer>X</answer>``, else
the last number in the text. Answers compare as numbers (commas, ``$`` and a trailing ``.`` ignored; ``3/4`` and
``\\frac{3}{4}`` allowed) with a relative tolerance of 1e-6. Answers that are not numbers compare as text and, when
the optional ``math-verify`` package is installed, symbolically (the ``math`` extra:
``pip install ".[math]"`` in a clone).
"""

from __future__ import annotations

import functools
import math
import numbers
import re
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from lightning_grpo.rewards._text import completion_text

__all__ = ["REL_TOL", "answers_match", "extract_answer", "math_answer", "parse_number"]

REL_TOL = 1e-6
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_INT = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
_LAST_NUMBER = re.compile(rf"(?<![\d.])(?:(?<!\w)-)?(?:{_INT}(?:\.\d+)?|\.\d+)(?:/{_INT})?")
_DECIMAL = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_FRACTION = re.compile(r"([-+]?)(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)")
_LATEX_FRAC = re.compile(r"([-+]?)\\[dt]?frac\{([-+]?\d+(?:\.\d+)?)\}\{([-+]?\d+(?:\.\d+)?)\}")
_ASSIGNMENT = re.compile(r"[A-Za-z]\w*\s*=\s*(.+)", re.DOTALL)
_UNITS = re.compile(r"\\(?:text|mbox|mathrm)\{[^{}]*\}|\\?%|\^\{?\\circ\}?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_SPACED = re.compile(r"(?<=[-+/])\s+|\s+(?=/)")
_NOISE = re.compile(r"\\[$!,;: ]|\\left|\\right|\$")


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` whose braces balance (nested braces allowed), else ``None``."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth, start = 1, match.end()
        for index in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            if depth == 0:
                return text[start:index]
    return None


def _last_match(pattern: re.Pattern[str], text: str) -> str | None:
    """The last match of ``pattern`` in ``text`` (its first group if it has one), else ``None``."""
    found = pattern.findall(text)
    return found[-1] if found else None


def extract_answer(text: str) -> str | None:
    """The final answer written in ``text``, or ``None`` when there is none.

    The first of these that is present decides: the last ``\\boxed{...}`` (nested braces handled), the last
    ``#### X`` line, the last ``<answer>X</answer>``, the last number. Empty content counts as no answer.

    Args:
        text: A completion, or a reference solution such as GSM8K's ``"...reasoning...\\n#### 72"``.

    Returns:
        The answer text, stripped, or ``None``.
    """
    finders = (_last_boxed, *(functools.partial(_last_match, p) for p in (_HASHES, _ANSWER_TAG, _LAST_NUMBER)))
    for find in finders:
        found = find(text)
        if found is not None:
            return found.strip() or None
    return None


def _clean(text: str) -> str:
    """``text`` without ``$``, LaTeX spacing and ``\\left``/``\\right``, stripped, trailing ``.`` removed."""
    return _NOISE.sub("", text).strip().rstrip(".").strip()


def _number(text: str) -> float | None:
    """``text`` as a float if it is a decimal, ``a/b`` or ``\\frac{a}{b}`` (thousands commas ignored), else ``None``."""
    text = _SPACED.sub("", _THOUSANDS.sub("", text))
    if _DECIMAL.fullmatch(text):
        return float(text)
    match = _FRACTION.fullmatch(text) or _LATEX_FRAC.fullmatch(text)
    if match is None or float(match.group(3)) == 0:
        return None
    value = float(match.group(2)) / float(match.group(3))
    return -value if match.group(1) == "-" else value


def parse_number(text: str) -> float | None:
    """The number ``text`` states, reading through ``x = ``, units in ``\\text{}``, ``%`` and degrees; or ``None``."""
    text = _clean(text)
    assignment = _ASSIGNMENT.fullmatch(text)
    candidates = [text, _UNITS.sub("", text)]
    if assignment:
        candidates += [assignment.group(1), _UNITS.sub("", assignment.group(1))]
    for candidate in candidates:
        value = _number(candidate.strip().rstrip("."))
        if value is not None:
            return value
    return None


@functools.lru_cache(maxsize=1)
def _math_verify() -> ModuleType | None:
    """The ``math_verify`` module if installed (imported on first use: it pulls in sympy), else ``None``."""
    try:
        import math_verify
    except ImportError:
        return None
    return math_verify


def _symbolic_match(predicted: str, reference: str) -> bool:
    """Whether math-verify finds the two answers equivalent; ``False`` without math-verify or when parsing fails."""
    math_verify = _math_verify()
    if math_verify is None:
        return False
    # math-verify's timeout uses signal.alarm, which works only in the main thread.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold = math_verify.parse(f"${reference}$", parsing_timeout=timeout)
        guess = math_verify.parse(f"${predicted}$", parsing_timeout=timeout)
        return bool(gold and guess and math_verify.verify(gold, guess, timeout_seconds=timeout))
    except Exception:  # a prediction math-verify cannot read is simply not a match
        return False


def answers_match(predicted: str | None, reference: str | float) -> bool:
    """Whether a predicted final answer equals the reference.

    Numbers compare with a relative tolerance of 1e-6; otherwise the cleaned texts compare exactly, then (with
    math-verify installed) symbolically.

    Args:
        predicted: An answer from :func:`extract_answer`; ``None`` never matches.
        reference: The reference answer, as text or as a number.
    """
    if predicted is None:
        return False
    expected = float(reference) if isinstance(reference, numbers.Real) else parse_number(reference)
    got = parse_number(predicted)
    if expected is not None and got is not None:
        return math.isclose(got, expected, rel_tol=REL_TOL)
    reference = str(reference)
    if _clean(predicted).replace(" ", "") == _clean(reference).replace(" ", "") != "":
        return True
    return _symbolic_match(predicted, reference)


def _reference(answer: Any) -> str | float:
    """A dataset's reference answer, reduced to its final answer when it is a worked solution."""
    if isinstance(answer, numbers.Real) and not isinstance(answer, bool):
        return float(answer)
    if not isinstance(answer, str):
        raise TypeError(
            f"reference answers must be str, int, float or None; got {type(answer).__name__} {answer!r:.80}"
        )
    if "####" not in answer and "\\boxed" not in answer:
        return answer
    final = extract_answer(answer)
    if final is None:
        raise ValueError(f"reference answer {answer[-80:]!r} has a '####' or '\\boxed' marker but no answer after it")
    return final


def math_answer(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any
) -> list[float | None]:
    r"""1.0 where the completion's final answer equals the reference answer, else 0.0; ``None`` without a reference.

    Args:
        prompts: The prompts (unused).
        completions: The completions (strings, or message lists: the last assistant message counts); the final
            answer is found with :func:`extract_answer`.
        answer: The reference answers, one per completion: numbers, answer texts, or worked solutions ending in
            ``#### X`` or containing ``\boxed{X}`` (reduced with :func:`extract_answer`); ``None`` skips the row.
        **kwargs: Other columns (unused).

    Returns:
        One reward per completion.

    Example::

        >>> completions = [r"48 / 2 = 24, and 48 + 24 = \boxed{72}", "<answer>70</answer>", "#### 3"]
        >>> math_answer(["q1", "q2", "q3"], completions, ["...\n#### 72", 72, None])
        [1.0, 0.0, None]
    """
    if len(answer) != len(completions):
        raise ValueError(f"answer must have one entry per completion ({len(completions)}); got {len(answer)}")
    return [
        None if ref is None else float(answers_match(extract_answer(completion_text(completion)), _reference(ref)))
        for completion, ref in zip(completions, answer, strict=True)
    ]
