"""The kernel's network gate: restricted sandboxes reach the outside only through here.

:mod:`.allowlist` parses policy.yaml's ``network_whitelist``; :mod:`.proxy` is the
CONNECT proxy that enforces it on per-sandbox Unix sockets and audits every request.
"""

from fluffy.kernel.net.allowlist import AllowList, Rule, Target
from fluffy.kernel.net.proxy import ConnectProxy, ProxyRecord

__all__ = ["AllowList", "ConnectProxy", "ProxyRecord", "Rule", "Target"]
