"""Host corral in an asyncio program (a discord.py or aiohttp bot, say): the supervisor runs
in a Trio guest loop on top of asyncio's, in the same thread."""

import asyncio

from supervisor import CorralError, load_config, open_asyncio_supervisor


async def main() -> None:
    async with open_asyncio_supervisor(load_config("corral.toml")) as sup:
        accepted = await sup.send("general", "Hello from asyncio!")
        async for entry in sup.follow("general", after=accepted.seq):
            print(entry.author, entry.kind, entry.text)
            if entry.author.startswith("agent:") and entry.kind in ("message", "error"):
                break

        accepted = await sup.send("general", "Please do a long task")
        async for entry in sup.follow("general", after=accepted.seq):
            if "tool running" in entry.text:
                break
        result = await sup.stop("general")
        print(f"stopped in {result.elapsed_ms:.1f} ms: killed {result.killed}, swept {result.swept}")


try:
    asyncio.run(main())
except CorralError as exc:  # a store another corral is using, a bad config: the message says the fix
    raise SystemExit(f"corral: {exc}") from None
