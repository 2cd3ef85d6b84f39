"""Reading a server's connection handling from the client side: shared by the service's and the rank servers' tests."""

from __future__ import annotations

import re
import socket


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """The server ended the connection (EOF or reset) within ``within`` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except OSError:
        return False


def sample(text: str, name: str) -> float:
    """One unlabelled-or-fully-labelled sample's value from a text exposition (``name`` may carry its labels)."""
    m = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    assert m, f"{name} not in the exposition"
    return float(m.group(1))
