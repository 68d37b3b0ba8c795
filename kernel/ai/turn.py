"""One turn of a session: what it runs with and how far it got.

A turn is ``session.message``'s task: the user's text, the provider it talks to, its
status (running, waiting_review, done, failed, cancelled, quarantined), the review it
waits for, and the usage the providers reported.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from fluffy.ipc.ai_types import ProviderConfig
from fluffy.ipc.results.events import TurnStatus
from fluffy.kernel.ai.instructions import Instructions
from fluffy.kernel.ai.provider import ProviderSession
from fluffy.kernel.ai.usage import Tally


class Turn(msgspec.Struct):
    turn_id: str
    session_id: str
    text: str
    provider: ProviderConfig
    auto_approve: bool
    max_rounds: int
    task: asyncio.Task[None] | None = None
    status: TurnStatus = "running"
    review: asyncio.Future[dict[str, Any]] | None = None
    final_text: str = ""
    provider_session: ProviderSession | None = None
    ended: bool = False
    started: float = msgspec.field(default_factory=time.monotonic)
    #: the id of the tool call waiting for the user's yes (one at a time: review_lock)
    tool_review: str | None = None
    tool_shown: dict[str, Any] | None = None  # what the user is asked about it
    review_lock: asyncio.Lock = msgspec.field(default_factory=asyncio.Lock)
    usage: Tally = msgspec.field(default_factory=Tally)  # the providers' reported token counts
    #: the project's instructions, read once at the start of the turn
    instructions: Instructions | None = None
