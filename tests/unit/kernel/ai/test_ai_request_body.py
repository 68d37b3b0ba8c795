"""What a model request hands the ai-provider sandbox: the body ``ai.next`` returns."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fluffy.ipc.ai_types import AIResponse, Message, ProviderConfig, ScriptedCall, ScriptedTurn
from fluffy.kernel.ai.provider import AiResultParams, ProviderSession

pytestmark = pytest.mark.unit


async def _bodies(session: ProviderSession, providers: list[ProviderConfig]) -> list[Any]:
    """Each provider's request as the sandbox receives it, answered at once."""
    bodies = []

    async def ignore(event: Any) -> None:
        return None

    for provider in providers:
        asked = asyncio.create_task(
            session.request(provider, [Message(role="user", content="hi")], [], ignore)
        )
        job = await session.queue.get()
        assert job is not None
        bodies.append(job.body)
        job.future.set_result(AiResultParams(job_id=job.job_id, ok=True, response=AIResponse()))
        assert (await asked).text == ""
    return bodies


def test_a_turns_provider_is_converted_once_and_a_new_one_again(tmp_path: Path) -> None:
    """A turn's rounds name the same provider: its plain form (a script can be long) is
    made once and sent again; another provider (a new turn, a key removed) is converted
    anew, and what is sent is always the provider's own plain form."""
    script = [ScriptedTurn(say="hi", calls=[ScriptedCall(tool="fs.read", args={"path": "a"})])]
    first = ProviderConfig(name="scripted", turns=script * 3)
    other = msgspec.structs.replace(first, model="another")
    session = ProviderSession(runner=None, binding="ai-test", folder=tmp_path)  # type: ignore[arg-type]
    bodies = asyncio.run(_bodies(session, [first, first, other, other, first]))
    sent = [body["provider"] for body in bodies]
    assert sent[0] is sent[1] and sent[2] is sent[3]
    assert sent[1] is not sent[2] and sent[3] is not sent[4]
    for body, provider in zip(bodies, [first, first, other, other, first], strict=True):
        assert body["provider"] == msgspec.to_builtins(provider)
    assert len({body["job_id"] for body in bodies}) == 5
