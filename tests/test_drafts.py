"""Live output: what an agent is writing is shown at once as a draft, saved when its run ends
(or in pieces), and never stored as a draft.

The pure part (the turn's account) is tested without Trio; the rest through a real
supervisor and a real generic agent that prints a line every few hundredths of a second.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import time
from pathlib import Path

import pytest
import trio
from conftest import make_config, script_agent

from adapters._base import Result, Text, ToolUse
from supervisor import open_supervisor
from supervisor.cli import DraftView
from supervisor.core.account import PIECE_CHARS, PIECE_SECONDS, Post, ShowDraft, TurnAccount
from supervisor.store.store import Draft, Entry

# ---------------------------------------------------------------- the account (pure)


def test_each_delta_shows_the_whole_run_as_a_draft_and_the_saved_entry_names_it() -> None:
    account = TurnAccount("agent:bot", "t1")
    assert account.on_event(Text("Hel", delta=True), silenced=False) == [ShowDraft("t1.1", "Hel")]
    assert account.on_event(Text("lo", delta=True), silenced=False) == [ShowDraft("t1.1", "Hello")]
    effects = account.on_event(ToolUse("Bash", "ls"), silenced=False)
    assert effects[0] == Post("message", "Hello", {"draft": "t1.1"})
    # The next run is a draft of its own.
    assert account.on_event(Text("again", delta=True), silenced=False) == [ShowDraft("t1.2", "again")]
    assert account.close_text(silenced=False) == [Post("message", "again", {"draft": "t1.2"})]


def test_a_silenced_turn_shows_no_draft() -> None:
    # Text received after a stop decision is never shown (contract line 8).
    account = TurnAccount("agent:bot", "t1")
    assert account.on_event(Text("late", delta=True), silenced=True) == []
    assert account.close_text(silenced=True) == []


def test_a_long_run_is_saved_in_pieces_by_size() -> None:
    account = TurnAccount("agent:bot", "t1")
    chunk = "x" * 1000
    saved: list[Post] = []
    for _ in range(PIECE_CHARS // 1000 + 1):
        saved += [e for e in account.on_event(Text(chunk, delta=True), silenced=False) if isinstance(e, Post)]
    assert len(saved) == 1 and len(saved[0].text) >= PIECE_CHARS and saved[0].meta == {"draft": "t1.1"}
    # What follows the piece is a new draft.
    assert account.on_event(Text("y", delta=True), silenced=False) == [ShowDraft("t1.2", "y")]


def test_a_long_run_is_saved_in_pieces_by_age() -> None:
    account = TurnAccount("agent:bot", "t1")
    assert account.on_event(Text("a", delta=True), silenced=False, now=100.0) == [ShowDraft("t1.1", "a")]
    assert account.on_event(Text("b", delta=True), silenced=False, now=100.0 + PIECE_SECONDS / 2) == [
        ShowDraft("t1.1", "ab")
    ]
    assert account.on_event(Text("c", delta=True), silenced=False, now=100.0 + PIECE_SECONDS) == [
        Post("message", "abc", {"draft": "t1.1"})
    ]


def test_the_stop_saves_the_open_run_as_it_stood_and_nothing_of_it_twice() -> None:
    account = TurnAccount("agent:bot", "t1")
    account.on_event(Text("half an ans", delta=True), silenced=False)
    assert account.cut_off("stop") == Post("message", "half an ans", {"draft": "t1.1", "cut_off": "stop"})
    assert account.cut_off("stop") is None
    assert account.close_text(silenced=True) == []
    # The final answer, had one come, is not posted again either.
    account.on_event(Result("half an ans", ok=True), silenced=True)
    assert account.last_words(None).effects == []


def test_the_final_answer_is_not_repeated_after_a_run_saved_in_pieces() -> None:
    account = TurnAccount("agent:bot", "t1")
    whole = "z" * (PIECE_CHARS + 10)
    effects = account.on_event(Text(whole[:PIECE_CHARS], delta=True), silenced=False)
    effects += account.on_event(Text(whole[PIECE_CHARS:], delta=True), silenced=False)
    effects += account.on_event(Result(whole, ok=True), silenced=False)
    words = account.last_words(None)
    posts = [e.text for e in [*effects, *words.effects] if isinstance(e, Post)]
    assert words.ok and posts == [whole[:PIECE_CHARS], whole[PIECE_CHARS:]]


# ---------------------------------------------------------------- tail -f's human form


def _draft(text: str, draft: str = "t.1") -> dict[str, object]:
    return {"kind": "draft", "draft": draft, "author": "agent:a", "turn": "t", "text": text, "ts": 0.0}


def _entry(text: str, draft: str | None) -> dict[str, object]:
    meta = {"draft": draft} if draft else {}
    return {"seq": 7, "channel": "c", "author": "agent:a", "kind": "message", "text": text, "turn": "t",
            "generation": 0, "ts": 0.0, "meta": meta}


def test_tail_on_a_terminal_rewrites_the_draft_line_then_clears_it_for_the_entry() -> None:
    view = DraftView(terminal=True, width=80)
    first = view.draft(_draft("one\ntwo"))
    assert first.startswith("\r\x1b[2K") and "writing" in first and first.endswith("one ⏎ two")
    assert "\n" not in first
    saved = view.entry(_entry("one\ntwo", "t.1"))
    assert saved.startswith("\r\x1b[2K") and saved.endswith("one\n    two\n")  # continuation indented
    assert not view.entry(_entry("next", None)).startswith("\r")


def test_tail_elsewhere_prints_only_what_each_draft_adds_marked_unsaved() -> None:
    view = DraftView(terminal=False)
    assert view.draft(_draft("one")).endswith("(not saved yet) one\n")
    assert view.draft(_draft("one two")).endswith("(not saved yet)  two\n")
    assert view.draft(_draft("one two")) == ""
    assert "[    7]" in view.entry(_entry("one two", "t.1"))
    # A new run after the entry starts from nothing again.
    assert view.draft(_draft("three", "t.2")).endswith("(not saved yet) three\n")


# ---------------------------------------------------------------- a real agent streaming

#: Prints a numbered line every 50 ms for ``sys.argv[-1]`` seconds, each with the time it was
#: printed; then a tool line (which closes the run) and a last line.
STREAMER = r"""
import json, sys, time
seconds = float(sys.argv[-1].split()[-1])
end = time.time() + seconds
i = 0
while time.time() < end:
    print(f"line {i} at {time.time():.6f}", flush=True)
    i += 1
    time.sleep(0.05)
print(json.dumps({"type": "tool", "name": "Bash", "input": "true"}), flush=True)
print("done", flush=True)
"""


def _printed_at(text: str) -> float:
    return float(text.rstrip().rsplit(" at ", 1)[1])


@pytest.mark.parametrize("seconds", [PIECE_SECONDS + 1.5])
async def test_a_streaming_turn_shows_its_text_within_a_second_and_saves_it_without_drafts(
    short_tmp: Path, seconds: float
) -> None:
    config = make_config(short_tmp, {"streamer": script_agent(STREAMER)})
    lags: list[float] = []
    drafts: list[Draft] = []
    entries: list[Entry] = []
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", f"stream {seconds}")
        with trio.fail_after(60):
            async for item in sup.follow("c", accepted.seq, drafts=True):
                if isinstance(item, Draft):
                    if item.text != "done":  # (the run after the tool line)
                        drafts.append(item)
                        lags.append(time.time() - _printed_at(item.text))
                    continue
                entries.append(item)
                if item.kind == "message" and item.text == "done":
                    break
            assert await sup.wait_idle("c")
        entries += [e for e in await sup.entries("c", after=entries[-1].seq)]
    assert drafts, "no draft was shown while the agent wrote"
    # The text keeps moving: a draft at least every second of the stream, each within a
    # second of the agent printing its last line (the target, 100 ms, is the benchmark's).
    assert max(lags) < 1.0, max(lags)
    times = [d.ts for d in drafts]
    assert max(b - a for a, b in itertools.pairwise(times)) < 1.0
    assert len(drafts) >= seconds * 5
    messages = [e for e in entries if e.kind == "message" and e.author == "agent:streamer"]
    # The run older than PIECE_SECONDS was saved in pieces; each entry names the draft it replaces,
    # and every draft shown is replaced by one.
    pieces = [e for e in messages if e.meta.get("draft") and e.text != "done"]
    assert len(pieces) >= 2, [e.text[:40] for e in messages]
    assert {d.draft for d in drafts} <= {e.meta["draft"] for e in pieces}
    for piece in pieces:
        last = [d for d in drafts if d.draft == piece.meta["draft"]][-1]
        assert piece.text.startswith(last.text), "a saved piece holds everything its draft showed"
        assert not piece.text.startswith("\n")
    # Every line printed is in the transcript, once, in order.
    lines = "\n".join(e.text for e in pieces).split("\n")
    numbers = [int(line.split()[1]) for line in lines if line.startswith("line ")]
    assert numbers == list(range(len(numbers))) and len(numbers) >= seconds * 10
    # Nothing of a draft is in the store: the entries followed are every row written.
    with sqlite3.connect(config.store_location) as db:
        rows = db.execute("SELECT seq, kind FROM entries WHERE seq > ?", (accepted.seq,)).fetchall()
    assert [seq for seq, _ in rows] == [e.seq for e in entries]


async def test_a_follower_without_drafts_sees_only_entries(short_tmp: Path) -> None:
    config = make_config(short_tmp, {"streamer": script_agent(STREAMER)})
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", "stream 0.5")
        seen: list[object] = []
        with trio.fail_after(60):
            async for entry in sup.follow("c", accepted.seq):
                seen.append(entry)
                if entry.text == "done":
                    break
    assert seen and all(isinstance(e, Entry) for e in seen)


async def test_an_acp_agents_chunks_are_drafts_before_the_saved_message(short_tmp: Path) -> None:
    from test_acp_turns import fake

    config = make_config(short_tmp, {"acp": fake(short_tmp)})
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", "[[say:abcdefghi]] go")
        drafts: list[Draft] = []
        with trio.fail_after(60):
            async for item in sup.follow("c", accepted.seq, drafts=True):
                if isinstance(item, Draft):
                    drafts.append(item)
                elif item.kind == "message" and item.author == "agent:acp":
                    saved = item
                    break
    # Drafts of the chunks (coalesced and paced: not one per chunk), each the whole run so far,
    # each longer than the one before; the entry replaces the last.
    texts = [d.text for d in drafts]
    assert texts and all(b.startswith(a) and b != a for a, b in itertools.pairwise(texts)), texts
    assert saved.text.startswith(texts[-1]) and saved.text.startswith("abcdefghi")
    assert saved.meta["draft"] == drafts[-1].draft


async def test_the_sse_stream_carries_drafts_only_when_asked_and_never_with_an_id(short_tmp: Path) -> None:
    from test_api import _client

    from supervisor.serve.daemon import run_daemon

    config = make_config(short_tmp, {"streamer": script_agent(STREAMER)})
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(config, handle_signals=False, subreaper=False,
                                                            task_status=task_status))
        async with _client(short_tmp) as http:
            first = (await http.post("/v1/channels/c/messages", json={"text": "stream 0"})).json()["seq"]
            await http.post("/v1/channels/c/wait", params={"timeout": 30})
            bad = await http.get("/v1/channels/c/events", params={"drafts": "maybe"})
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_query"
            last = (await http.get("/v1/channels/c/entries", params={"after": first})).json()["entries"][-1]["seq"]
            with trio.fail_after(60):
                frames: list[list[str]] = []
                async with http.stream("GET", "/v1/channels/c/events",
                                       params={"after": last, "drafts": 1}) as stream:
                    await http.post("/v1/channels/c/messages", json={"text": "stream 1"})
                    frame: list[str] = []
                    async for line in stream.aiter_lines():
                        if line:
                            frame.append(line)
                            continue
                        frames.append(frame)
                        frame = []
                        data = [json.loads(f[6:]) for f in frames[-1] if f.startswith("data: ")]
                        if data and data[0].get("text") == "done" and data[0]["kind"] == "message":
                            break
                # The same after the fact without drafts=1: entries only.
                plain: list[dict[str, object]] = []
                async with http.stream("GET", "/v1/channels/c/events", params={"after": last}) as stream:
                    async for line in stream.aiter_lines():
                        if line.startswith("event: draft"):
                            plain.append({"draft": line})
                        if line.startswith("data: "):
                            plain.append(json.loads(line[6:]))
                            if plain[-1].get("text") == "done":
                                break
            await http.post("/v1/shutdown")
    drafts = [f for f in frames if "event: draft" in f]
    assert drafts, frames
    for frame in drafts:
        assert not any(f.startswith("id:") for f in frame), "a draft must not move a reconnect's resume point"
        (data,) = [json.loads(f[6:]) for f in frame if f.startswith("data: ")]
        assert data["kind"] == "draft" and data["author"] == "agent:streamer" and "seq" not in data
    assert all("seq" in item for item in plain), plain


# ---------------------------------------------------------------- what a stop does to a draft


async def test_contract_18_a_stop_saves_the_draft_as_it_stood_before_its_notice_and_shows_nothing_after(
    short_tmp: Path,
) -> None:
    from supervisor import STOP_NOTICE

    config = make_config(short_tmp, {"streamer": script_agent(STREAMER)})
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", "stream 60")
        items: list[Entry | Draft] = []
        streaming = trio.Event()
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    async for item in sup.follow("c", accepted.seq, drafts=True):
                        items.append(item)
                        if isinstance(item, Draft) and item.text.count("\n") >= 3:
                            streaming.set()
                        if isinstance(item, Entry) and item.kind == "notice":
                            # Anything more of the turn would come right behind the notice.
                            await sup.flush()
                            nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                await streaming.wait()  # mid-run: a draft of several lines is showing
                result = await sup.stop("c")
        assert result.ok and result.stopped_turns
        after = await sup.entries("c", after=accepted.seq)
    cut = [e for e in after if e.meta.get("cut_off")]
    assert len(cut) == 1 and cut[0].meta == {"draft": cut[0].meta["draft"], "cut_off": "stop"}
    # Saved as it stood: the last draft the follower was shown, or (drafts are coalesced and
    # paced per follower, and one the entry saves is dropped) what it grew to since, before the notice.
    shown = [i for i in items if isinstance(i, Draft) and i.draft == cut[0].meta["draft"]]
    assert shown and cut[0].text.startswith(shown[-1].text)
    kinds = [e.kind for e in after]
    assert kinds[-1] == "notice" and after[-1].text == STOP_NOTICE
    assert after.index(cut[0]) < len(after) - 1
    # Nothing of the turn after the stop: no entry, and no draft once the cut-off entry came.
    position = items.index(next(i for i in items if isinstance(i, Entry) and i.meta.get("cut_off")))
    assert not [i for i in items[position:] if isinstance(i, Draft)]
    assert not [e for e in after[after.index(cut[0]) + 1:] if e.author == "agent:streamer"]


async def test_contract_18_a_shutdown_saves_the_draft_marked_as_cut_off_by_the_shutdown(short_tmp: Path) -> None:
    from supervisor import SHUTDOWN_NOTICE

    config = make_config(short_tmp, {"streamer": script_agent(STREAMER)})
    seen: list[Draft] = []
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", "stream 60")
        with trio.fail_after(60):
            async for item in sup.follow("c", accepted.seq, drafts=True):
                if isinstance(item, Draft) and item.text.count("\n") >= 2:
                    seen.append(item)
                    break
        # Leaving the block shuts down: the running turn is interrupted by the shutdown.
    async with open_supervisor(config) as sup:
        after = await sup.entries("c", after=accepted.seq)
    cut = [e for e in after if e.meta.get("cut_off")]
    assert len(cut) == 1 and cut[0].meta["cut_off"] == "shutdown"
    assert cut[0].text.startswith(seen[0].text)
    assert after[-1].kind == "notice" and after[-1].text == SHUTDOWN_NOTICE


def test_a_daemon_killed_mid_draft_keeps_what_was_saved_and_nothing_claims_more(short_tmp: Path) -> None:
    import os
    import signal
    import subprocess
    import threading

    from conftest import CORRAL, DaemonProcess
    from test_daemon_cli import CONFIG as DEMO_DAEMON

    daemon = DaemonProcess(short_tmp, DEMO_DAEMON)
    env = {**os.environ, "CORRAL_SOCKET": str(daemon.socket)}
    seq = json.loads(daemon.cli("send", "c", "hello", "--json", check=True).stdout)["seq"]
    daemon.cli("wait", "c", "--timeout", "60", check=True)
    tail = subprocess.Popen([*CORRAL, "tail", "c", "-f", "--json", "--after", str(seq)], cwd=short_tmp, env=env,
                            stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(60, tail.kill)
    watchdog.start()
    saved: list[dict[str, object]] = []
    last_draft: dict[str, object] | None = None
    try:
        daemon.cli("send", "c", f"stream {PIECE_SECONDS * 3:g}", check=True)
        assert tail.stdout is not None
        for line in tail.stdout:
            item = json.loads(line)
            if item["kind"] == "draft":
                last_draft = item
                # A piece is saved and the next one is being written: the moment to die.
                if saved:
                    daemon.proc.send_signal(signal.SIGKILL)
                    daemon.proc.wait()
                    break
            elif item["kind"] == "message" and item["author"] == "agent:demo":
                saved.append(item)
    finally:
        watchdog.cancel()
        tail.kill()
        tail.wait()
    assert saved and last_draft is not None, "a piece was saved and a draft was showing when the daemon died"
    again = DaemonProcess(short_tmp, DEMO_DAEMON)
    try:
        after = [json.loads(line) for line in again.cli("tail", "c", "--json", "--after", str(seq),
                                                         check=True).stdout.splitlines()]
    finally:
        again.stop()
    messages = [e for e in after if e["author"] == "agent:demo" and e["kind"] == "message"]
    # The transcript holds the pieces saved before the kill, and no more: the draft that was
    # showing is not there, and nothing is marked as saved by a stop that never happened.
    assert [m["seq"] for m in messages if m["kind"] == "message"][: len(saved)] == [s["seq"] for s in saved]
    assert all(last_draft["text"] != m["text"] and not m["meta"].get("cut_off") for m in messages)
    assert not any(str(last_draft["text"]) in str(m["text"]) for m in messages)
