"""Several agents in one channel: addressing, lanes, hand-offs, hops, and the channel-wide Stop.

Every test runs a real supervisor with two (or four) script agents, ``ann`` and ``bob``.
Races are driven at exact points (the ``took`` hook, gates, ``wait_all_tasks_blocked``);
nothing sleeps to let things settle.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import make_config, script_agent, turn_processes
from test_stop_contract import SLOW, Gate, Park, SpawnRecorder, tree_pids, wait_entry

from supervisor.config.settings import parse_config
from supervisor.core.errors import UsageError
from supervisor.host.supervisor import STOP_NOTICE, Supervisor, open_supervisor
from supervisor.store.store import Entry
from supervisor.testing import Hooks

pytestmark = pytest.mark.usefixtures("kill_mechanism")

# The agent reads the answered message (the prompt's last line) and acts on its words:
#   gate=FIFO   print "ready", then wait for the gate
#   flush       on SIGINT print a hand-off to its peer ("@PEER over") and exit
#   handoff     answer "@PEER please review" (once)
#   pingpong    answer "@PEER pingpong" (its peer does the same: a chain)
# otherwise it answers "NAME done". Every prompt is appended to $PROMPTS as a JSON line.
AGENT = r"""
import json, os, signal, sys
prompt = sys.argv[-1]
me, peer = os.environ["ME"], os.environ.get("PEER", "")
with open(os.environ["PROMPTS"], "a") as log:
    log.write(json.dumps({"me": me, "prompt": prompt}) + "\n")
last = prompt.splitlines()[-1] if prompt else ""
words = last.split()
opts = dict(w.split("=", 1) for w in words if "=" in w)

def emit(kind, **fields):
    print(json.dumps({"type": kind, **fields}), flush=True)

if "flush" in words:
    def flush(*_):
        emit("result", text=f"@{peer} over, take it from here")
        os._exit(0)
    signal.signal(signal.SIGINT, flush)
else:
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
if "gate" in opts:
    print("ready", flush=True)
    os.read(os.open(opts["gate"], os.O_RDONLY), 1)
if "pingpong" in words:
    emit("result", text=f"@{peer} pingpong")
elif "handoff" in words:
    emit("result", text=f"@{peer} please review")
else:
    emit("result", text=f"{me} done")
"""


@pytest.fixture
def gates(short_tmp: Path) -> Iterator[Callable[[], Gate]]:
    """Make gates (FIFOs an agent waits on) in the test's folder; all closed at the end."""
    made: list[Gate] = []

    def make() -> Gate:
        made.append(Gate(short_tmp / f"gate{len(made)}"))
        return made[-1]

    yield make
    for gate in made:
        gate.close()


def _agent(folder: Path, me: str, peer: str) -> dict[str, Any]:
    return script_agent(AGENT, env={"ME": me, "PEER": peer, "PROMPTS": str(folder / "prompts.jsonl")})


def two_agents(folder: Path, **defaults: Any) -> Any:
    return make_config(folder, {"ann": _agent(folder, "ann", "bob"), "bob": _agent(folder, "bob", "ann")},
                       agent="ann", **defaults)


@asynccontextmanager
async def running(
    folder: Path, *, took: Any = None, **defaults: Any
) -> AsyncIterator[tuple[Supervisor, SpawnRecorder]]:
    recorder = SpawnRecorder()
    async with open_supervisor(two_agents(folder, **defaults), hooks=Hooks(took=took, spawn=recorder)) as sup:
        yield sup, recorder


def prompts(folder: Path) -> list[dict[str, str]]:
    path = folder / "prompts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def ready(sup: Supervisor, channel: str, author: str, after: int) -> Entry:
    return await wait_entry(
        sup, channel, lambda e: e.seq > after and e.author == author and e.kind == "message" and e.text == "ready"
    )


async def entries(sup: Supervisor, channel: str) -> list[Entry]:
    await sup.flush()
    return await sup.entries(channel)


# ---------------------------------------------------------------- addressing


async def test_send_goes_to_to_then_mentions_then_the_default_agent(short_tmp: Path) -> None:
    async with running(short_tmp) as (sup, _):
        explicit = await sup.send("ch", "hello @bob", to=["ann"])
        mentioned = await sup.send("ch", "hello (@bob) and @ann, @bob again")
        default = await sup.send("ch", "mail me@bob.dev or @bobby")
        both = await sup.send("ch", "hi", agent="bob", to=["ann"])
        assert explicit.to == ("ann",)
        assert mentioned.to == ("bob", "ann")
        assert default.to == ("ann",)
        assert both.to == ("bob", "ann")
        with trio.fail_after(SLOW):
            assert await sup.wait_idle("ch")


async def test_to_naming_an_unknown_agent_is_refused_with_the_closest_name(short_tmp: Path) -> None:
    async with running(short_tmp) as (sup, _):
        with pytest.raises(UsageError, match="unknown agent 'bobb'; did you mean 'bob'"):
            await sup.send("ch", "hi", to=["bobb"])
        with pytest.raises(UsageError, match="names no configured agent; did you mean 'agent:bob'"):
            await sup.send("ch", "hi", author="agent:bobby")
        with pytest.raises(UsageError, match="author must be"):
            await sup.send("ch", "hi", author="root")


async def test_a_configured_channel_admits_only_its_members(short_tmp: Path) -> None:
    config = parse_config(
        {
            "server": {"socket": "corral.sock", "cgroup": "off"},
            "agents": {"ann": _agent(short_tmp, "ann", "bob"), "bob": _agent(short_tmp, "bob", "ann")},
            "defaults": {"agent": "ann"},
            "channels": {"review": {"agents": ["bob"]}},
        },
        base=short_tmp,
    )
    async with open_supervisor(config) as sup:
        with pytest.raises(UsageError, match="'ann' is not a member of this channel"):
            await sup.send("review", "hi", to=["ann"])
        accepted = await sup.send("review", "hi @ann")  # a mention of a non-member is plain text
        assert accepted.to == ("bob",)
        with trio.fail_after(SLOW):
            assert await sup.wait_idle("review")


# ---------------------------------------------------------------- lanes and the channel-wide stop


async def test_two_agents_work_at_once_and_one_stop_kills_both_with_one_notice_last(
    short_tmp: Path, gates: Any
) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, spawned):
        first = await sup.send("ch", f"gate={gate}", to=["ann", "bob"])
        await ready(sup, "ch", "agent:ann", first.seq)
        await ready(sup, "ch", "agent:bob", first.seq)
        status = sup.status()["channels"]["ch"]["agents"]
        assert status["ann"]["state"] == status["bob"]["state"] == "running"
        # Two turns run, each its whole tree (the sandbox's monitor and init, the agent), and nothing else.
        assert len(spawned.calls) == 2
        assert {p.pid for p in turn_processes()} == tree_pids(s.process.pid for s in spawned.calls)

        result = await sup.stop("ch")

        assert result.ok and not result.repeat
        assert sorted(t["agent"] for t in result.turns) == ["ann", "bob"]
        assert {t["turn"] for t in result.turns} == {s.turn_id for s in spawned.calls}
        assert all(t["killed"] or t["swept"] for t in result.turns)
        assert sorted(result.stopped_turns) == sorted(s.turn_id for s in spawned.calls)
        assert not turn_processes(result.stopped_turns)
        stored = await entries(sup, "ch")
        notices = [e for e in stored if e.kind == "notice"]
        assert [n.text for n in notices] == [STOP_NOTICE]
        assert stored[-1] == notices[0]
        assert sup.status()["channels"]["ch"]["agents"]["ann"]["state"] == "idle"
        # A message to two agents is each one's prompt alone: neither catches up on it.
        assert [p["prompt"] for p in prompts(short_tmp)] == [f"gate={gate}"] * 2


async def test_a_stop_in_one_channel_never_rests_or_stops_another_with_the_same_agents(
    short_tmp: Path, gates: Any
) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, spawned):
        x = await sup.send("x", f"gate={gate}", to=["ann", "bob"])
        y = await sup.send("y", f"gate={gate}", to=["ann", "bob"])
        for channel, accepted in (("x", x), ("y", y)):
            await ready(sup, channel, "agent:ann", accepted.seq)
            await ready(sup, channel, "agent:bob", accepted.seq)
        trees = {s.turn_id: tree_pids([s.process.pid]) for s in spawned.calls}

        result = await sup.stop("x")

        y_turns = {s.turn_id for s in spawned.calls} - set(result.stopped_turns)
        assert len(y_turns) == 2
        assert {p.pid for p in turn_processes(sorted(y_turns))} == set().union(*(trees[t] for t in y_turns))
        assert sup.status()["channels"]["y"]["rests"] is False
        assert sup.status()["channels"]["x"]["rests"] is True
        gate.open(2)
        with trio.fail_after(SLOW):
            assert await sup.wait_idle("y")
        answers = [e.text for e in await entries(sup, "y") if e.kind == "message" and e.text.endswith("done")]
        assert sorted(answers) == ["ann done", "bob done"]


# ---------------------------------------------------------------- hand-offs and hops


async def test_a_hand_off_routes_the_agents_message_to_the_mentioned_agent(short_tmp: Path) -> None:
    async with running(short_tmp) as (sup, _):
        await sup.send("ch", "handoff", to=["ann"])
        with trio.fail_after(SLOW):
            await wait_entry(sup, "ch", lambda e: e.author == "agent:bob" and e.text == "bob done")
            assert await sup.wait_idle("ch")
        bob = [p for p in prompts(short_tmp) if p["me"] == "bob"]
        assert len(bob) == 1
        # The catch-up: the human's message bob never saw, then ann's hand-off, last, unchanged.
        assert bob[0]["prompt"].splitlines()[1:] == [
            "human:user: handoff",
            "[End of catch-up. The message you are answering, from agent:ann:]",
            "@bob please review",
        ]


async def test_a_ping_pong_chain_ends_at_max_hops_with_a_status_entry(short_tmp: Path) -> None:
    async with running(short_tmp, max_hops=3) as (sup, _):
        await sup.send("ch", "pingpong", to=["ann"])
        with trio.fail_after(SLOW):
            status = await wait_entry(sup, "ch", lambda e: e.kind == "status" and "chain stopped" in e.text)
            assert await sup.wait_idle("ch")
        assert "stopped at 3 hops" in status.text
        # The human's turn, then 3 hand-offs: ann, bob, ann, bob. The fourth answer routes nowhere.
        assert [p["me"] for p in prompts(short_tmp)] == ["ann", "bob", "ann", "bob"]
        stored = await entries(sup, "ch")
        assert stored[-1].kind == "status"


# ---------------------------------------------------------------- contract 12 with several agents


async def test_a_stop_while_a_flushes_its_hand_off_means_b_never_starts(short_tmp: Path, gates: Any) -> None:
    # The seeds' race: A's last output, mentioning B, is flushed as the stop lands (its
    # SIGINT handler prints it). A stale turn's output is never stored, so never routed.
    gate = gates()
    async with running(short_tmp) as (sup, spawned):
        first = await sup.send("ch", f"flush gate={gate}", to=["ann"])
        await ready(sup, "ch", "agent:ann", first.seq)

        result = await sup.stop("ch")
        await trio.testing.wait_all_tasks_blocked()

        assert result.ok and [t["agent"] for t in result.turns] == ["ann"]
        assert [s.turn_id for s in spawned.calls] == result.stopped_turns  # bob never started
        assert sup._ledger.queued("ch") == () and sup.status()["channels"]["ch"]["agents"].keys() == {"ann"}
        stored = await entries(sup, "ch")
        assert stored[-1].kind == "notice" and stored[-1].seq == result.notice_seq
        assert not any("over" in e.text for e in stored)


class ParkAgent(Park):
    """A ``took`` hook that parks the first turn of one agent (the others pass)."""

    def __init__(self, sup_box: list[Supervisor], agent: str) -> None:
        super().__init__()
        self.sup_box = sup_box
        self.agent = agent

    async def __call__(self, channel: str, turn_id: str) -> None:
        if self.sup_box[0]._ledger.current_turn(channel, self.agent) != turn_id:
            return
        await super().__call__(channel, turn_id)


async def test_a_stop_after_a_hand_off_was_stored_drops_it_before_b_starts(short_tmp: Path) -> None:
    # The other side of the race: A's hand-off was stored (and routed, in the same step)
    # just before the stop; B has taken it but not started. B never starts.
    box: list[Supervisor] = []
    park = ParkAgent(box, "bob")
    async with running(short_tmp, took=park) as (sup, spawned):
        box.append(sup)
        await sup.send("ch", "handoff", to=["ann"])
        with trio.fail_after(SLOW):
            await park.arrived.wait()
        handoff = [e for e in await entries(sup, "ch") if e.author == "agent:ann" and e.kind == "message"]
        assert [e.text for e in handoff] == ["@bob please review"]

        stopping = trio.Event()
        results: list[Any] = []

        async def stop() -> None:
            stopping.set()
            results.append(await sup.stop("ch"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop)
            await stopping.wait()
            await trio.testing.wait_all_tasks_blocked()
            park.go.set()
        (result,) = results
        with trio.fail_after(SLOW):
            assert await sup.wait_idle("ch")

        assert [t["agent"] for t in result.turns if t["agent"] == "bob"] == ["bob"]
        assert len(spawned.calls) == 1  # only ann's turn ever spawned
        stored = await entries(sup, "ch")
        assert stored[-1].kind == "notice"
        assert not any(e.author == "agent:bob" for e in stored)


async def test_an_agent_post_after_a_stop_is_stored_not_routed_until_a_human_speaks(short_tmp: Path) -> None:
    async with running(short_tmp) as (sup, spawned):
        await sup.send("ch", "hi")
        with trio.fail_after(SLOW):
            assert await sup.wait_idle("ch")
        await sup.stop("ch")
        before = len(spawned.calls)

        bot = await sup.send("ch", "@bob please look", author="agent:ann")

        assert bot.to == () and sup.status()["channels"]["ch"]["rests"]
        with trio.fail_after(SLOW):
            assert await sup.wait_idle("ch")
        assert len(spawned.calls) == before
        assert any(e.seq == bot.seq for e in await entries(sup, "ch"))

        human = await sup.send("ch", "handoff", to=["ann"])  # lifts the rest

        assert not sup.status()["channels"]["ch"]["rests"] and human.to == ("ann",)
        with trio.fail_after(SLOW):
            await wait_entry(sup, "ch", lambda e: e.author == "agent:bob" and e.text == "bob done")


async def test_a_stop_at_the_first_checkpoint_after_a_hand_off_is_stored_keeps_b_from_starting(
    short_tmp: Path,
) -> None:
    # The stop is scheduled from inside the store's write of A's hand-off entry, so it runs
    # at the very next checkpoint. The routed message was accepted in the same synchronous
    # step as the entry (under the old generation), so the stop drops it: B never starts.
    async with running(short_tmp) as (sup, spawned):
        results: list[Any] = []
        stopped = trio.Event()

        async def stop_now() -> None:
            results.append(await sup.stop("ch"))
            stopped.set()

        real = sup._store.submit_entry

        def submit_entry(channel: str, author: str, kind: str, text: str, **kw: Any) -> Any:
            pending = real(channel, author, kind, text, **kw)
            if author == "agent:ann" and kind == "message" and "@bob" in text and not results:
                results.append(None)
                sup._nursery.start_soon(stop_now)
            return pending

        sup._store.submit_entry = submit_entry  # type: ignore[method-assign]
        await sup.send("ch", "handoff", to=["ann"])
        with trio.fail_after(SLOW):
            await stopped.wait()
            assert await sup.wait_idle("ch")
        result = results[1]
        assert result.ok and len(spawned.calls) == 1  # ann's turn only: bob never started
        stored = await entries(sup, "ch")
        assert stored[-1].kind == "notice" and not any(e.author == "agent:bob" for e in stored)
        assert [e.text for e in stored if e.author == "agent:ann"] == ["@bob please review"]


# ---------------------------------------------------------------- the API, the CLI and a restart


def _http(folder: Path) -> Any:
    import httpx

    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(folder / "corral.sock")), base_url="http://corral")


async def test_api_to_field_and_agent_authors(short_tmp: Path) -> None:
    from supervisor.serve.daemon import run_daemon

    config = two_agents(short_tmp)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status)
        )
        async with _http(short_tmp) as http:
            bad = await http.post("/v1/channels/c/messages", json={"text": "hi", "to": ["bobb"]})
            assert bad.status_code == 400 and "did you mean 'bob'" in bad.json()["error"]["message"]
            wrong = await http.post("/v1/channels/c/messages", json={"text": "hi", "to": "bob"})
            assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "bad_field"
            both = await http.post("/v1/channels/c/messages", json={"text": "hi", "to": ["bob", "ann"]})
            assert both.status_code == 202 and both.json()["to"] == ["bob", "ann"]
            assert (await http.post("/v1/channels/c/wait", params={"timeout": 30})).json()["idle"]
            stop = await http.post("/v1/channels/c/stop")
            assert stop.status_code == 200 and stop.json()["turns"] == []

            bot = await http.post("/v1/channels/c/messages", json={"text": "@bob look", "author": "agent:ann"})
            assert bot.status_code == 202 and bot.json()["to"] == []  # stored, not routed: the channel rests
            status = (await http.get("/v1/status")).json()["channels"]["c"]
            assert status["rests"] is True and set(status["agents"]) == {"ann", "bob"}
            assert all(a["state"] == "idle" for a in status["agents"].values())

            human = await http.post("/v1/channels/c/messages", json={"text": "hi @bob"})
            assert human.json()["to"] == ["bob"]
            assert (await http.get("/v1/status")).json()["channels"]["c"]["rests"] is False
            routed = await http.post("/v1/channels/c/messages", json={"text": "@ann look", "author": "agent:bob"})
            assert routed.json()["to"] == ["ann"]
            assert (await http.post("/v1/channels/c/wait", params={"timeout": 30})).json()["idle"]
            await http.post("/v1/shutdown")


def test_restart_a_channel_at_rest_stays_at_rest_after_shutdown_and_run(short_tmp: Path) -> None:
    from conftest import DaemonProcess

    text = """
[server]
socket = "corral.sock"
[store]
path = "corral.db"
[defaults]
agent = "ann"
[agents.ann]
adapter = "demo"
delay = 0.01
[agents.bob]
adapter = "demo"
delay = 0.01
"""
    daemon = DaemonProcess(short_tmp, text)
    try:
        daemon.cli("send", "ch", "hello", "--to", "ann", "--to", "bob", check=True)
        daemon.cli("wait", "ch", check=True)
        stop = json.loads(daemon.cli("stop", "ch", "--json", check=True).stdout)
        assert stop["ok"] and not stop["repeat"]
        daemon.cli("shutdown", check=True)
        assert daemon.proc.wait(timeout=60) == 0
    finally:
        daemon.stop()
    daemon = DaemonProcess(short_tmp, text)
    try:
        status = json.loads(daemon.cli("status", "--json", check=True).stdout)
        assert status["channels"]["ch"]["rests"] is True
        bot = json.loads(daemon.cli("send", "ch", "@bob wake up", "--as", "agent:ann", "--json", check=True).stdout)
        assert bot["to"] == []
        again = json.loads(daemon.cli("stop", "ch", "--json", check=True).stdout)
        assert again["repeat"] and again["generation"] == stop["generation"]  # the repeat window survived too
        human = json.loads(daemon.cli("send", "ch", "@bob go on", "--json", check=True).stdout)
        assert human["to"] == ["bob"]
        daemon.cli("wait", "ch", check=True)
        status = json.loads(daemon.cli("status", "--json", check=True).stdout)
        assert status["channels"]["ch"]["rests"] is False
        shown = daemon.cli("status", check=True).stdout
        assert "    bob: idle" in shown
    finally:
        daemon.stop()


# ---------------------------------------------------------------- docs/channels.md, the page of this file


def _page() -> str:
    return (Path(__file__).resolve().parent.parent / "docs" / "channels.md").read_text()


def _blocks(lang: str) -> list[str]:
    import re

    return re.findall(rf"```{lang}\n(.*?)```", _page(), re.S)


def test_the_channel_config_shown_is_valid_as_shown(tmp_path: Path) -> None:
    import tomllib

    (block,) = _blocks("toml")
    config = parse_config(tomllib.loads(block), base=tmp_path)
    assert config.members("review") == ("codex", "claude") and config.hop_limit("review") == 2
    assert config.members("elsewhere") == ("claude", "codex") and config.hop_limit("elsewhere") == 6
    assert (config.catch_up_entries, config.catch_up_bytes) == (20, 16384)


def test_the_catch_up_example_shown_is_what_corral_builds() -> None:
    from supervisor.core.catchup import Missed, catch_up_prompt

    (block,) = _blocks("text")
    built = catch_up_prompt(
        [Missed("human:ana", "can someone look at the parser?"),
         Missed("agent:gemini", "I can reproduce it with an empty file")],
        "@claude the tests fail on empty input", author="agent:codex", earlier=3,
    )
    assert block == built + "\n"


def test_the_stop_and_status_examples_shown_have_the_shapes_corral_returns() -> None:
    from supervisor.host.supervisor import StopResult

    stop, status = (json.loads(b) for b in _blocks("json"))
    assert set(stop) == set(StopResult(channel="x", generation=1).to_json())
    assert set(stop["turns"][0]) == {"agent", "turn", "killed", "swept"}
    channel = status["channels"]["work"]
    assert set(channel) >= {"generation", "rests", "queued", "turn", "agents"}
    assert {a["state"] for a in channel["agents"].values()} <= {"idle", "queued", "running", "stopping"}


async def test_a_bug_in_one_agents_turn_frees_its_own_lane_while_another_agent_runs(
    short_tmp: Path, gates: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from supervisor.turns import process as _turn

    original = _turn.Turn._request
    broken: list[str] = []

    def broken_once(self: Any, session_id: Any) -> Any:
        if self.agent.name == "bob" and not broken:
            broken.append(self.turn_id)
            raise RuntimeError("a bug")
        return original(self, session_id)

    monkeypatch.setattr(_turn.Turn, "_request", broken_once)
    gate = gates()
    async with running(short_tmp) as (sup, _):
        first = await sup.send("ch", f"gate={gate}", to=["ann"])
        await ready(sup, "ch", "agent:ann", first.seq)
        await sup.send("ch", "one", to=["bob"])
        await sup.send("ch", "two", to=["bob"])
        with trio.fail_after(SLOW):
            await wait_entry(sup, "ch", lambda e: e.author == "agent:bob" and e.text == "bob done")
        assert sup.status()["channels"]["ch"]["agents"]["ann"]["state"] == "running"
        gate.open()
        with trio.fail_after(SLOW):
            assert await sup.wait_idle("ch")
        stored = await entries(sup, "ch")
        assert any(e.kind == "error" and "a bug" in e.text and e.turn == broken[0] for e in stored)
