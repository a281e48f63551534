"""The hub check of ``lightning_grpo.policy.hub``: one connect, bounded by its timeout, proxies followed."""

from __future__ import annotations

import socket
import time

from lightning_grpo.policy import hub
from lightning_grpo.policy.hub import hub_endpoint, hub_reachable, load_error_message


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_listening_endpoint_is_reachable_and_a_closed_port_is_not(monkeypatch):
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        assert hub_reachable(2.0, f"http://127.0.0.1:{server.getsockname()[1]}")
    assert not hub_reachable(2.0, f"http://127.0.0.1:{closed_port()}")


def test_a_connect_that_hangs_is_abandoned_at_the_timeout(monkeypatch):
    """A name lookup or connect that never returns (no network, a silent firewall) costs the timeout, not more."""

    def hang(*args: object, **kwargs: object) -> None:
        time.sleep(30)
        raise OSError("timed out")

    monkeypatch.setattr(hub.socket, "create_connection", hang)
    start = time.perf_counter()
    assert not hub_reachable(0.2, "https://huggingface.co")
    assert time.perf_counter() - start < 10  # behaviour (abandoned, not awaited), far from the 30 s hang


def test_the_endpoint_and_its_proxy_come_from_the_environment(monkeypatch):
    seen = []

    def record(address: tuple[str, int], timeout: float) -> socket.socket:
        seen.append(address)
        return socket.socket()  # closed at once by the check

    monkeypatch.setattr(hub.socket, "create_connection", record)
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example:8443")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    for name in ("HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert hub_endpoint() == "https://mirror.example:8443"
    hub_reachable(1.0)
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    hub_reachable(1.0)
    assert seen == [("mirror.example", 8443), ("proxy.example", 3128)]


def test_the_offline_message_names_hf_download(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    message = load_error_message("org/name", "model", OSError("offline mode is enabled"))
    assert "hf download org/name" in message and "huggingface-cli" not in message
