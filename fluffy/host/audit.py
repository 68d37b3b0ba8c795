"""The audit log at rest: verify the chain, read and export entries, the witness's head."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fluffy.host import lazy

if TYPE_CHECKING:
    from fluffy.kernel.audit.query import (
        Filters,
        entries,
        export_jsonl,
        parse_since,
    )
    from fluffy.kernel.audit.store import (
        connect_ro,
        db_path,
        read_head,
    )
    from fluffy.kernel.audit.verify import verify

_FROM = {
    "connect_ro": "fluffy.kernel.audit.store",
    "db_path": "fluffy.kernel.audit.store",
    "entries": "fluffy.kernel.audit.query",
    "export_jsonl": "fluffy.kernel.audit.query",
    "Filters": "fluffy.kernel.audit.query",
    "parse_since": "fluffy.kernel.audit.query",
    "read_head": "fluffy.kernel.audit.store",
    "verify": "fluffy.kernel.audit.verify",
}
__all__ = [
    "Filters",
    "connect_ro",
    "db_path",
    "entries",
    "export_jsonl",
    "parse_since",
    "read_head",
    "verify",
]
__getattr__ = lazy(__name__, _FROM)
