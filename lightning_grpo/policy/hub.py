"""Loading from a local path or the Hugging Face hub, with one-line errors that say what went wrong.

transformers reports a missing local folder as "Repo id must be in the form 'repo_name' or 'namespace/repo_name'",
and an uncached hub id while offline as a chain of three tracebacks. :func:`from_pretrained` raises
:class:`ModelLoadError` instead: the path does not exist, or the id is not cached and the hub cannot be reached.
docs/troubleshooting.md lists the messages.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["ModelLoadError", "announce_model_load", "from_pretrained", "hub_endpoint", "hub_reachable"]

T = TypeVar("T")
_OFFLINE_HINTS = ("outgoing traffic has been disabled", "couldn't connect", "offline mode", "connection")


class ModelLoadError(OSError):
    """A model or tokenizer that could not be loaded; the message names it and says why, in one line."""


def from_pretrained(
    load: Callable[..., T], name: str | Path, what: str = "model", *, announce: bool = False, **kwargs: Any
) -> T:
    """``load(name, **kwargs)`` (e.g. ``AutoModelForCausalLM.from_pretrained``), with a clear error on failure.

    Args:
        load: The loader.
        name: A Hugging Face hub id (``"org/name"``) or a local folder.
        what: What is loaded, for the message (``"model"``, ``"tokenizer"``).
        announce: Say that it loads, and its size (:func:`announce_model_load`), once it is known to be there.
        **kwargs: Passed to ``load``.

    Raises:
        ModelLoadError: The folder does not exist, the id is not cached and the hub did not answer within 2 s
            (one connection, instead of the loaders' minute of retries), or the loader failed (its first line is
            quoted).
    """
    kwargs = {**_unless_the_hub_answers(str(name), what), **kwargs}
    if announce:
        announce_model_load(str(name))
    try:
        return load(str(name), **kwargs)
    except (OSError, ValueError) as error:  # huggingface_hub's HFValidationError is a ValueError
        raise ModelLoadError(load_error_message(str(name), what, error)) from error


def _unless_the_hub_answers(name: str, what: str, timeout: float = 2.0) -> dict[str, Any]:
    """``{}``, or ``{"local_files_only": True}`` for a cached hub id when the hub does not answer within ``timeout``.

    Raises:
        ModelLoadError: The id is not cached and the hub did not answer: the message gives the ``hf download`` lines.
    """
    if _is_offline() or Path(name).expanduser().exists() or _looks_like_a_path(name) or _hub_answers(timeout):
        return {}
    if _cached(name):
        return {"local_files_only": True}  # the loaders would retry for a minute before they fell back to the cache
    folder = f"models/{name.rsplit('/', 1)[-1]}"
    raise ModelLoadError(
        f"could not load the {what} {name!r}: the Hugging Face hub ({hub_endpoint()}) did not answer within "
        f"{timeout:g} s and it is not in the local cache. On a machine with network access, download it once: "
        f"hf download {name} (into the cache; then copy ~/.cache/huggingface over and set HF_HUB_OFFLINE=1), or "
        f"hf download {name} --local-dir {folder} and give that folder as the model"
    )


def announce_model_load(name: str) -> None:
    """Say (on the process of global rank zero) that the model ``name`` loads now, with its size where it is on disk.

    A local folder or a cached hub id: ``model: loading Qwen/Qwen2.5-0.5B-Instruct (0.99 GB of weights; typically
    1-4 s per GB from a local disk)``. A hub id not cached: that it downloads first. A path that does not exist, or an
    uncached id while offline, says nothing here: the error that follows says it.
    """
    from lightning.fabric.utilities.rank_zero import rank_zero_info

    size = _weights_bytes(name)
    if size:
        rank_zero_info(
            f"model: loading {name} ({size / 1e9:.2f} GB of weights; typically 1-4 s per GB from a local disk, more "
            "on a busy one)"
        )
    elif not _is_offline() and not _looks_like_a_path(name) and not Path(name).expanduser().exists():
        rank_zero_info(
            f"model: downloading {name} from the Hugging Face hub, then loading it (once: the download is cached; "
            "minutes for a model of several GB)"
        )


def _weights_bytes(name: str) -> int:
    """Bytes of the weight files of the model ``name`` on disk (a folder, or a cached hub id); 0 where unknown."""
    folder = Path(name).expanduser()
    if not folder.is_dir():
        if _looks_like_a_path(name):
            return 0
        from huggingface_hub import try_to_load_from_cache

        try:
            config = try_to_load_from_cache(name, "config.json")
        except ValueError:  # not a valid hub id
            return 0
        if not isinstance(config, str):
            return 0
        folder = Path(config).parent
    files = [path for path in folder.iterdir() if path.suffix in (".safetensors", ".bin", ".pt", ".pth")]
    return sum(path.stat().st_size for path in files if path.exists())


@functools.cache
def _hub_answers(timeout: float) -> bool:
    """:func:`hub_reachable`, asked once per process (the model and the tokenizer share the answer)."""
    return hub_reachable(timeout)


def _cached(name: str) -> bool:
    """Whether the hub id ``name`` has a ``config.json`` in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def load_error_message(name: str, what: str, error: BaseException) -> str:
    """One line that says which ``what`` could not be loaded from ``name``, and why."""
    path = Path(name).expanduser()
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if path.exists():
        return f"could not load the {what} from the folder {name}: {first_line}"
    if _looks_like_a_path(name):
        return (
            f"the {what} path {name!r} does not exist (and it is not a Hugging Face hub id, which looks like "
            "'org/name'); check the path, relative to the current folder " + str(Path.cwd())
        )
    if _is_offline() or any(hint in str(error).lower() for hint in _OFFLINE_HINTS):
        return (
            f"could not load the {what} {name!r}: it is not in the local Hugging Face cache and the hub cannot be "
            "reached (HF_HUB_OFFLINE=1 or no network); download it once with network access "
            f"(hf download {name}) or give a local folder"
        )
    return f"could not load the {what} {name!r}: {first_line}"


def _looks_like_a_path(name: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else (``./x``, ``/x``, ``~/x``, ``a/b/c``) is a path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def _is_offline() -> bool:
    return any(
        os.environ.get(var, "").lower() in ("1", "true", "yes") for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_endpoint() -> str:
    """The hub's address: ``HF_ENDPOINT`` if set, else ``https://huggingface.co``."""
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


def hub_reachable(timeout: float = 2.0, endpoint: str | None = None) -> bool:
    """Whether a TCP connection to the hub (or to the proxy the environment names for it) opens within ``timeout``.

    One connect, no request: it takes milliseconds online and at most ``timeout`` seconds without a network (name
    resolution included, since the connect runs in a thread that is abandoned at the timeout). transformers and
    datasets instead retry for close to a minute before they fall back or fail.

    Args:
        timeout: Seconds to wait.
        endpoint: The hub's URL; ``None``: :func:`hub_endpoint`.
    """
    url = urllib.parse.urlsplit(endpoint or hub_endpoint())
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(url.hostname or ""):
        url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    address = (url.hostname or "", url.port or (443 if url.scheme == "https" else 80))
    opened: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection(address, timeout=timeout).close()
            opened.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(opened)
