"""Token counts, as session.usage, session.list and a turn's ``turn_end`` event carry them."""

from __future__ import annotations

from fluffy.ipc.results import Part


class UsageCounts(Part):
    """Token sums over some model requests (the provider's counts)."""

    requests: int
    #: requests whose provider reported usage at all (the others count zeros)
    reported: int
    input_tokens: int
    output_tokens: int
    cached_tokens: int


class UsageTally(UsageCounts):
    """Token sums, and the same sums per model (for prices)."""

    models: dict[str, UsageCounts]
