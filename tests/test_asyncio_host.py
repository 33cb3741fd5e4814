"""Hosting the supervisor in an asyncio program (Trio guest mode)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conftest import make_config

from supervisor import open_asyncio_supervisor


def test_an_asyncio_program_sends_follows_and_stops(short_tmp: Path) -> None:
    config = make_config(short_tmp)

    async def main() -> tuple[list[str], bool, bool, int]:
        ticks = 0

        async def heartbeat() -> None:  # the host loop keeps running its own work meanwhile
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        beat = asyncio.create_task(heartbeat())
        async with open_asyncio_supervisor(config) as sup:
            accepted = await sup.send("bot", "hello from asyncio")
            seen = []
            async for entry in sup.follow("bot", after=accepted.seq):
                seen.append(entry.text)
                if entry.kind == "message" and entry.author == "agent:demo":
                    break
            idle = await asyncio.wait_for(sup.wait_idle("bot"), 30)
            long = await sup.send("bot", "long 60")
            async for entry in sup.follow("bot", after=long.seq):
                if "tool running" in entry.text:
                    break
            result = await sup.stop("bot")
            status = await sup.status()
        beat.cancel()
        return seen, idle and result.ok and bool(result.swept), status["channels"]["bot"]["turn"] is None, ticks

    seen, stopped, idle_after, ticks = asyncio.run(asyncio.wait_for(main(), 60))
    assert "You said: hello from asyncio\nThis is the start of conversation" in "\n".join(seen)
    assert stopped and idle_after
    assert ticks > 0


def test_errors_reach_the_asyncio_caller(short_tmp: Path) -> None:
    from supervisor import UsageError

    async def main() -> str:
        async with open_asyncio_supervisor(make_config(short_tmp)) as sup:
            try:
                await sup.send("bot", "hi", agent="nobody")
            except UsageError as exc:
                return str(exc)
        return "no error"

    assert "unknown agent 'nobody'" in asyncio.run(main())
