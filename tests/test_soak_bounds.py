"""What a long-lived daemon keeps per message is bounded (issue 40.4, the soak's findings)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from conftest import make_config, script_agent

from supervisor.host import lanes
from supervisor.host.supervisor import open_supervisor


async def test_the_seqs_a_host_knows_are_the_queued_and_a_bounded_tail_of_those_done(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lanes, "KNOWN_DONE_KEPT", 2)
    config = make_config(short_tmp, {"echo": script_agent("print('ok')")})
    async with open_supervisor(config) as sup:
        sent = [(await sup.send("c", f"message {i}")).seq for i in range(5)]
        with trio.fail_after(120):
            assert await sup.wait_idle("c", 120)
        # Five run: the two done last are still known, the three before them no longer.
        assert sup._lanes.known == set(sent[-2:])
        # A stop's dropped messages are done with too, once its record is stored (the first
        # of the three runs, the stop drops the other two): the two known are two of these.
        queued = [(await sup.send("d", f"queued {i}")).seq for i in range(3)]
        result = await sup.stop("d")
        assert result.ok and result.dropped == 2
        with trio.fail_after(120):
            assert await sup.wait_idle("d", 120)
        assert len(sup._lanes.known) == 2 and sup._lanes.known <= set(queued)
