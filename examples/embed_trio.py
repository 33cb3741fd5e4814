"""Embed corral in a Trio program: send a message, print the reply, stop a long task."""

import trio

from supervisor import CorralError, load_config, open_supervisor


async def main() -> None:
    async with open_supervisor(load_config("corral.toml")) as sup:
        accepted = await sup.send("general", "Hello! Who are you?")
        async for entry in sup.follow("general", after=accepted.seq):
            print(entry.author, entry.kind, entry.text)
            if entry.author.startswith("agent:") and entry.kind in ("message", "error"):
                break  # the reply (or the reason there is none)

        accepted = await sup.send("general", "Please do a long task")
        async for entry in sup.follow("general", after=accepted.seq):
            if "tool running" in entry.text:  # the demo agent's tool runs: stop it mid-tool
                break
        result = await sup.stop("general")  # returns once nothing of the turn is alive
        print(f"stopped in {result.elapsed_ms:.1f} ms: killed {result.killed}, swept {result.swept}")


try:
    trio.run(main)
except CorralError as exc:  # a store another corral is using, a bad config: the message says the fix
    raise SystemExit(f"corral: {exc}") from None
