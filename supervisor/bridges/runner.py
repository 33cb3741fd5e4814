"""The Trio layer of a bridge: it drives :class:`.core.BridgeCore` between a platform and a
supervisor, and does the I/O the core decides.

Theory of operation
-------------------

* **One task receives, a task per room handles.** The receiver reads the platform's batches
  in order and hands each event to its room's handler (a queue and a task per room id):
  rooms are handled concurrently, each in its own order, so a stop awaited in one room never
  delays another room's events, and a room's next message waits for its stop. Each event is
  checked against the store's ``origins`` (a replayed sync, a reconnect, a restart: seen,
  skipped), decided by the core, and carried out: a :class:`.core.Run` is ``send``-ed with
  the event's origin, which the store writes in the message's own transaction; a command or
  an ignored event is marked handled *before* it acts (a stop replayed after a crash would
  drop messages typed after it). A batch's cursor (Matrix's sync token) is saved once its
  events and every earlier batch's are handled (:class:`_Cursors`): a crash in between
  replays them, and the origins make the replay a no-op. A store failure while handling is
  retried in place (the room's later events wait behind it: nothing is lost or reordered).
  A platform whose next read confirms the last (``confirms_on_read``: Telegram's ``offset``,
  after which the server forgets the updates) is asked for its next batch only once the last
  is handled: its rooms are concurrent within a batch, and a stop awaited in one room holds
  the next batch (nothing is confirmed that a crash could lose).
* **A stop is acknowledged before it is awaited**: "Stopping…" goes into the room's outbox,
  whose sender posts it at once, then the receiver awaits ``stop`` (the notice follows through
  the room's follower, after the acknowledgement because one outbox posts in order).
* **Per room, one follower and one sender.** The follower reads the channel's committed
  entries after the room's saved cursor and puts the core's operations in the room's outbox;
  the sender carries them out in order. A post's entry is marked done after it is posted
  where the platform deduplicates a repeated post (Matrix's transaction ids), before it
  otherwise (IRC: at most once).
* **Bad weather is retried**: :class:`.platform.Transient` (server down, restarted, slow, a
  rate limit's ``retry_after``) waits and tries again, with a backoff up to ``retry_max``;
  :class:`.platform.Refused` is logged and that one operation dropped. The supervisor never
  waits on the chat server: a homeserver that is down delays the room, not the daemon.
* **A bridge that fails is contained** (:func:`run_bridges`): it is logged and started again
  after a backoff; it never takes the daemon or another bridge down.
"""

from __future__ import annotations

import logging
import math
import random
import secrets
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import trio

from ..core.errors import UsageError
from ..core.queue import QueueEditRefused, QueueFull
from ..core.restart import ChannelBusy
from ..store.store import Draft as StoreDraft
from ..store.store import StoreError
from .core import (
    STOPPING,
    Answer,
    BridgeCore,
    Decision,
    Draft,
    Edit,
    FindDropped,
    Halt,
    Ignore,
    Inbound,
    Join,
    Op,
    Outbox,
    Policy,
    Post,
    React,
    Restart,
    Run,
    ShowQueue,
    TakeBack,
    Verbosity,
    queue_text,
)
from .platform import Platform, PlatformError, Refused, Transient
from .registry import bridge_type

if TYPE_CHECKING:
    from ..config.settings import BridgeConfig
    from ..host.supervisor import Supervisor

log = logging.getLogger("corral.bridges")
T = TypeVar("T")


def make_platform(config: BridgeConfig) -> Platform:
    """The platform a bridge's ``type`` names, found among the ``corral.bridges`` entry points
    (:mod:`.registry`); :class:`UsageError` for a type none registers."""
    made: Platform = bridge_type(config.type).platform_class()(config)
    return made


class Backoff:
    """Waits that double from ``first`` up to ``most`` (with jitter), reset by a success."""

    def __init__(self, first: float = 0.2, most: float = 30.0) -> None:
        self.first, self.most, self.next = first, most, first

    def delay(self, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), max(self.most, retry_after))
        delay = self.next * (0.8 + 0.4 * random.random())
        self.next = min(self.next * 2, self.most)
        return min(delay, self.most)

    def reset(self) -> None:
        self.next = self.first


async def retrying(call: Callable[[], Awaitable[T]], what: str, backoff: Backoff) -> T:
    """``call`` until it does not raise :class:`Transient` (each wait logged)."""
    while True:
        try:
            result = await call()
        except Transient as exc:
            delay = backoff.delay(exc.retry_after)
            log.warning("%s: %s; trying again in %.1f s", what, exc, delay)
            await trio.sleep(delay)
            continue
        backoff.reset()
        return result


class _Room:
    def __init__(self, room: str, channel: str, interval: float) -> None:
        self.room, self.channel = room, channel
        self.outbox = Outbox(interval)
        self.wake = trio.Event()
        self.scope = trio.CancelScope()

    def put(self, ops: list[Op]) -> None:
        for op in ops:
            self.outbox.put(op)
        if ops:
            self.wake.set()


class _Batch:
    """A batch read, and how many of its events are still being handled."""

    def __init__(self, cursor: str | None, left: int) -> None:
        self.cursor, self.left = cursor, left
        self.done = trio.Event()
        if not left:
            self.done.set()


class _Cursors:
    """The batches read, in order: a batch's cursor may be saved once it and every earlier
    batch have no event left to handle (rooms finish out of order)."""

    def __init__(self) -> None:
        self.batches: deque[_Batch] = deque()
        self.changed = trio.Event()

    def read(self, cursor: str | None, events: int) -> _Batch:
        batch = _Batch(cursor, events)
        self.batches.append(batch)
        if not events:
            self.changed.set()
        return batch

    def handled(self, batch: _Batch) -> None:
        batch.left -= 1
        if not batch.left:
            batch.done.set()
            self.changed.set()

    def done(self) -> str | None:
        """The newest cursor whose batch and every earlier one are handled (None: none new)."""
        newest = None
        while self.batches and not self.batches[0].left:
            cursor = self.batches.popleft().cursor
            newest = cursor if cursor is not None else newest
        return newest


class Bridge:
    """One running bridge: a platform, its core, and a supervisor."""

    def __init__(self, sup: Supervisor, config: BridgeConfig, platform: Platform | None = None) -> None:
        self.sup = sup
        self.config = config
        self.platform = platform if platform is not None else make_platform(config)
        own = {config.user} if config.user else set()
        agent_users = {name: agent.user for name, agent in config.agents.items()}
        self.core = BridgeCore(
            name=config.name,
            rooms={},
            policy=Policy(
                admins=frozenset(config.admins), users=frozenset(config.users), servers=frozenset(config.servers),
                stoppers=frozenset(config.stoppers) if config.stoppers is not None else None,
            ),
            own_users=frozenset(own | set(agent_users.values())),
            agent_users=agent_users,
            verbosity=_verbosity(config.verbosity),
            invites=config.invites,
            can_edit=self.platform.can_edit,
            server_of=self.platform.server_of,
        )
        self.rooms: dict[str, _Room] = {}
        self._nursery: trio.Nursery | None = None
        self.backoff = Backoff(most=config.retry_max)
        self.handled = 0
        """Events decided so far (the benchmark reads it)."""
        self._inboxes: dict[str, trio.MemorySendChannel[tuple[Inbound, _Batch]]] = {}
        """Room id → its handler's queue (made at the room's first event)."""
        self._cursors = _Cursors()

    def key(self, what: str) -> str:
        return f"bridge:{self.config.name}:{what}"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, join the rooms, and bridge until cancelled; ``started`` once it listens."""
        try:
            # A scope of this store's own: transaction ids made from entry seqs stay unique
            # when the same accounts serve a new store (its seqs start again).
            scope = await self.sup.cursor(self.key("scope"))
            if scope is None:
                scope = secrets.token_hex(4)
                await self.sup.save_cursor(self.key("scope"), scope)
            self.platform.scope = scope
            await retrying(self.platform.connect, f"bridge {self.config.name}: connecting", self.backoff)
            rooms = await retrying(
                lambda: self.platform.rooms(self.config.rooms), f"bridge {self.config.name}: joining", self.backoff
            )
            joined = await self.sup.cursor(self.key("invited"))
            for entry in filter(None, (joined or "").split("\n")):
                room, _, channel = entry.partition("\t")
                if await self.platform.join(room):
                    rooms[room] = channel
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for room, channel in rooms.items():
                    await self._open_room(room, channel)
                log.info("bridge %s (%s): %d room(s) bridged: %s", self.config.name, self.platform.kind, len(rooms),
                         ", ".join(f"{r} → {c}" for r, c in rooms.items()) or "none")
                await nursery.start(self._receive)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await self.platform.aclose()

    async def _open_room(self, room: str, channel: str) -> None:
        assert self._nursery is not None
        self.core.joined(room, channel)
        state = _Room(room, channel, self.config.edit_interval)
        self.rooms[room] = state
        cursor = await self.sup.cursor(self.key(f"posted:{room}"))
        if cursor is None:  # a new room: what was said before the bridge came is not replayed into it
            after = await self.sup.last_seq()
            await self.sup.save_cursor(self.key(f"posted:{room}"), str(after))
        else:
            after = int(cursor)
        self._nursery.start_soon(self._follow, state, after, name=f"corral-bridge-follow:{room}")
        self._nursery.start_soon(self._send, state, name=f"corral-bridge-send:{room}")

    # ---------------------------------------------------------- receiving

    async def _receive(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        assert self._nursery is not None
        cursor = await self.sup.cursor(self.key("since"))
        self._nursery.start_soon(self._save_cursors, cursor, name=f"corral-bridge-cursor:{self.config.name}")
        started = False
        while True:
            try:
                # (after a reconnect, from the newest batch read: what was read is queued here)
                async for batch in self.platform.events(cursor):
                    if not started:
                        started = True
                        task_status.started()
                    read = self._cursors.read(batch.cursor, len(batch.events))
                    for event in batch.events:
                        self._inbox(event.room).send_nowait((event, read))
                    if getattr(self.platform, "confirms_on_read", False):
                        # Asking for the next batch tells the server this one is done (Telegram's
                        # offset): not before it is (its rooms still handled side by side).
                        await read.done.wait()
                    if batch.cursor is not None:
                        cursor = batch.cursor
                    self.backoff.reset()
            except Transient as exc:
                delay = self.backoff.delay(exc.retry_after)
                log.warning("bridge %s: receiving: %s; trying again in %.1f s", self.config.name, exc, delay)
                await trio.sleep(delay)

    def _inbox(self, room: str) -> trio.MemorySendChannel[tuple[Inbound, _Batch]]:
        inbox = self._inboxes.get(room)
        if inbox is None:
            assert self._nursery is not None
            # (unbounded: the receiver never waits for a room, so no room waits for another)
            inbox, queue = trio.open_memory_channel[tuple[Inbound, _Batch]](math.inf)
            self._inboxes[room] = inbox
            self._nursery.start_soon(self._handle_room, queue, name=f"corral-bridge-handle:{room}")
        return inbox

    async def _handle_room(self, queue: trio.MemoryReceiveChannel[tuple[Inbound, _Batch]]) -> None:
        """One room's events, in order, each until it is handled."""
        async for event, batch in queue:
            backoff = Backoff(first=self.backoff.first, most=self.backoff.most)
            while True:
                try:
                    await self.handle(event)
                except StoreError as exc:
                    # Tried again in place: its origin is not marked, and the room's next events wait.
                    delay = backoff.delay()
                    log.error("bridge %s: the store failed (%s); handling %s again in %.1f s", self.config.name,
                              exc, event.room, delay)
                    await trio.sleep(delay)
                    continue
                break
            self._cursors.handled(batch)

    async def _save_cursors(self, saved: str | None) -> None:
        """Saves the newest cursor whose batches are all handled, as they come."""
        unsaved: str | None = None
        while True:
            await self._cursors.changed.wait()
            self._cursors.changed = trio.Event()
            cursor = self._cursors.done() or unsaved
            if cursor is None or cursor == saved:
                continue
            try:
                await self.sup.save_cursor(self.key("since"), cursor)
            except StoreError as exc:  # (nothing lost: a restart reads from the older cursor)
                unsaved, delay = cursor, self.backoff.delay()
                log.error("bridge %s: the store failed (%s); saving the cursor again in %.1f s", self.config.name,
                          exc, delay)
                await trio.sleep(delay)
                self._cursors.changed.set()
                continue
            saved, unsaved = cursor, None

    async def handle(self, event: Inbound) -> Decision:
        """Decide one event and carry the decision out (once per origin)."""
        event_id = getattr(event, "event", None)
        if event.sender in self.core.own_users:
            return Ignore(None)
        if event_id is not None and await self.sup.origin_seq(self.core.origin(event_id)) is not None:
            log.debug("bridge %s: %s seen before; skipped", self.config.name, event_id)
            return Ignore(None)
        decision = self.core.inbound(event)
        self.handled += 1
        log.debug("bridge %s: %r → %r", self.config.name, event, decision)
        if isinstance(decision, Ignore):
            if decision.why:
                log.info("bridge %s: %s", self.config.name, decision.why)
            if decision.origin is not None:
                await self.sup.mark_origin(decision.origin)
        elif isinstance(decision, Run):
            await self._run(decision)
        elif isinstance(decision, Halt):
            await self._halt(decision)
        elif isinstance(decision, Restart):
            await self._restart(decision)
        elif isinstance(decision, ShowQueue):
            await self._show_queue(decision)
        elif isinstance(decision, TakeBack):
            await self._take_back(decision)
        elif isinstance(decision, Answer):
            if decision.origin is not None:
                await self.sup.mark_origin(decision.origin)
            log.info("bridge %s: %s (answered in %s)", self.config.name, decision.text, decision.room)
            self._room_put(decision.room, [Post(decision.room, f"a{decision.reply_to or ''}", decision.text,
                                                notice=True, reply_to=decision.reply_to)])
        elif isinstance(decision, Join):
            await self._join(decision)
        return decision

    async def _run(self, run: Run) -> None:
        try:
            accepted = await self.sup.send_from(run.origin, run.channel, run.text, author=run.author,
                                                to=run.to or None, delivery=run.delivery)
        except (UsageError, QueueFull) as exc:  # (a bad message; a full channel: the sender is told)
            await self.sup.mark_origin(run.origin)
            log.info("bridge %s: not run: %s (%s in %s)", self.config.name, exc, run.author, run.room)
            self._room_put(run.room, [Post(run.room, f"a{run.event}", f"not run: {exc}", notice=True,
                                           reply_to=run.event)])
            return
        self.core.accepted(run, accepted.seq)

    async def _halt(self, halt: Halt) -> None:
        self._room_put(halt.room, [Post(halt.room, f"s{halt.event}", STOPPING, notice=True, reply_to=halt.event)])
        await self.sup.mark_origin(halt.origin)
        what = halt.channel if halt.channel is not None else "every channel"
        log.info("bridge %s: %s asked to stop %s", self.config.name, halt.sender, what)
        try:
            result = await self.sup.stop(halt.channel)
        except UsageError as exc:  # (UnknownChannel: the room's channel never had a message)
            self._room_put(halt.room, [Post(halt.room, f"s{halt.event}n", f"Nothing to stop ({exc}).", notice=True)])
            return
        if not result.ok:
            self._room_put(halt.room, [Post(halt.room, f"s{halt.event}f", f"Stopping failed — {result.error}",
                                            notice=True)])

    async def _restart(self, restart: Restart) -> None:
        """``!new``: the channel's reset (its entry, which the room then shows, says what it did);
        a refusal (a turn runs: say ``!new stop``) is answered in the room, never silent."""
        await self.sup.mark_origin(restart.origin)
        log.info("bridge %s: %s asked to start %s over", self.config.name, restart.sender, restart.channel)
        try:
            await self.sup.reset(restart.channel, stop=restart.stop)
        except (ChannelBusy, UsageError) as exc:  # (a turn runs; UnknownChannel: nothing to start over)
            hint = " Say !new stop to stop it first." if isinstance(exc, ChannelBusy) else ""
            self._room_put(restart.room, [Post(restart.room, f"r{restart.event}", f"Not started over: {exc}.{hint}",
                                               notice=True, reply_to=restart.event)])

    async def _show_queue(self, show: ShowQueue) -> None:
        await self.sup.mark_origin(show.origin)
        try:
            view = await self.sup.queue(show.channel)
        except UsageError:  # (UnknownChannel: nothing was ever sent here)
            view = {"queued": []}
        self._room_put(show.room, [Post(show.room, f"q{show.event}", queue_text(view), notice=True,
                                        reply_to=show.event)])

    async def _take_back(self, take: TakeBack) -> None:
        """``!cancel SEQ``: by the message's sender or an admin; answered in the room either way."""
        await self.sup.mark_origin(take.origin)
        author = f"human:{take.sender}"
        try:
            view = await self.sup.queue(take.channel)
        except UsageError:
            view = {"queued": []}
        senders = {row["author"] for row in view["queued"] if row["entry"] == take.seq}
        if senders and not take.admin and senders != {author}:
            log.info("bridge %s: %s may not take back seq %d (not theirs); refused", self.config.name, take.sender,
                     take.seq)
            text = f"Not taken back: seq {take.seq} is not yours (its sender or an admin may take it back)."
        else:
            try:
                await self.sup.cancel(take.channel, take.seq, author=author)
                text = f"seq {take.seq} taken back: it will not run."
            except QueueEditRefused as exc:
                text = (f"Not taken back: seq {take.seq} already runs; !stop ends it." if exc.code == "running"
                        else f"Not taken back: seq {take.seq} is not waiting (!queue shows what waits).")
        self._room_put(take.room, [Post(take.room, f"c{take.event}", text, notice=True, reply_to=take.event)])

    async def _join(self, join: Join) -> None:
        if join.room in self.rooms:
            return
        if not await retrying(lambda: self.platform.join(join.room), f"joining {join.room}", self.backoff):
            return
        joined = await self.sup.cursor(self.key("invited")) or ""
        await self.sup.save_cursor(self.key("invited"), f"{joined}{join.room}\t{join.channel}\n")
        await self._open_room(join.room, join.channel)
        log.info("bridge %s: joined %s as channel %s", self.config.name, join.room, join.channel)

    def show_draft(self, draft: Draft | StoreDraft) -> None:
        """Live output of a turn, before it is saved: posted once in each room of its channel,
        then edited (at most one edit per ``edit_interval``); the saved entry that names the
        draft (``meta["draft"]``) is its final edit. The follower calls it with the drafts
        ``follow(drafts=True)`` gives; a program may show drafts of its own."""
        for room in self.core.channel_rooms(draft.channel):
            state = self.rooms.get(room)
            if state is not None:
                state.put(self.core.draft(draft, room))

    def _room_put(self, room: str, ops: list[Op]) -> None:
        state = self.rooms.get(room)
        if state is not None:
            state.put(ops)

    # ---------------------------------------------------------- following and sending

    async def _follow(self, room: _Room, after: int) -> None:
        # Drafts (live output, never stored) only where a post can be edited.
        async for entry in self.sup.follow(room.channel, after=after, drafts=self.platform.can_edit):
            if room.room not in self.core.rooms:
                return
            if isinstance(entry, StoreDraft):
                room.put(self.core.draft(entry, room.room))
                continue
            draft = entry.meta.get("draft")
            if isinstance(draft, str) and not self.core.knows_draft(draft):
                # Shown by this bridge before a restart? Its message is edited into the saved text.
                shown = await self.sup.cursor(self.key(f"draft:{room.room}"))
                if shown is not None and shown.partition("\t")[0] == draft:
                    self.core.adopt_draft(draft, shown.partition("\t")[2])
            ops = self.core.outbound(entry, room.room)
            if entry.kind == "notice" and "stop_seq" in entry.meta and entry.turn:
                room.outbox.drop_turn(entry.turn)
            if not self.platform.can_edit:
                ops = [op for op in ops if not isinstance(op, Edit)]
            room.put(ops)

    async def _send(self, room: _Room) -> None:
        while True:
            op, wake = room.outbox.next(trio.current_time())
            if op is None:
                room.wake = trio.Event()
                with trio.move_on_at(wake if wake is not None else math.inf):
                    await room.wake.wait()
                continue
            await self._perform(room, op)

    async def _perform(self, room: _Room, op: Op) -> None:
        name = self.config.name
        try:
            if isinstance(op, Post):
                if op.seq is not None and not self.platform.idempotent_posts:
                    await self.sup.save_cursor(self.key(f"posted:{room.room}"), str(op.seq))
                event = await retrying(lambda: self.platform.post(op), f"bridge {name}: posting", self.backoff)
                self.core.posted(op, event)
                # What was posted is recorded even if the bridge is being cancelled (a store write).
                with trio.CancelScope(shield=True):
                    draft = self.core.draft_of(op.key)
                    if draft is not None:  # (the room's latest draft: a restart edits it into its saved text)
                        await self.sup.save_cursor(self.key(f"draft:{room.room}"), f"{draft}\t{event}")
                    if op.seq is not None and self.platform.idempotent_posts:
                        await self.sup.save_cursor(self.key(f"posted:{room.room}"), str(op.seq))
            elif isinstance(op, Edit):
                target = self.core.event_of(op.target)
                if target is not None:
                    event = await retrying(lambda: self.platform.edit(op, target), f"bridge {name}: editing",
                                           self.backoff)
                    self.core.edited(op, event)
                    if op.final and op.seq is not None:  # (a draft's saved text: its entry is shown now)
                        with trio.CancelScope(shield=True):
                            await self.sup.save_cursor(self.key(f"posted:{room.room}"), str(op.seq))
            elif isinstance(op, React):
                await retrying(lambda: self.platform.react(op), f"bridge {name}: reacting", self.backoff)
            elif isinstance(op, FindDropped):
                entries = await self.sup.entries(op.channel, after=op.after)
                room.put(self.core.dropped(op.room, op.stop_seq, entries))
        except Refused as exc:
            log.error("bridge %s: %s refused %s: %s", name, self.platform.kind, type(op).__name__.lower(), exc)


def _verbosity(value: str) -> Verbosity:
    if value == "quiet":
        return "quiet"
    if value == "verbose":
        return "verbose"
    return "normal"


async def run_bridge(sup: Supervisor, config: BridgeConfig, *, platform: Platform | None = None,
                     task_status: trio.TaskStatus[Bridge] = trio.TASK_STATUS_IGNORED) -> None:
    """Run one bridge; ``started`` with it once it listens (its failure is raised)."""
    bridge = Bridge(sup, config, platform)

    async def run(*, task_status: trio.TaskStatus[None]) -> None:
        await bridge.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        await nursery.start(run)
        task_status.started(bridge)


async def run_bridges(sup: Supervisor, bridges: list[BridgeConfig], *,
                      task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Run every bridge, each contained: one that fails is logged and started again after a
    backoff, and never takes the daemon or another bridge down. ``started`` at once (a chat
    server that is down must not hold the daemon's start)."""
    async with trio.open_nursery() as nursery:
        for config in bridges:
            nursery.start_soon(_contained, sup, config, name=f"corral-bridge:{config.name}")
        task_status.started()


async def _contained(sup: Supervisor, config: BridgeConfig) -> None:
    backoff = Backoff(first=1.0, most=max(config.retry_max, 1.0))
    while True:
        try:
            await run_bridge(sup, config)
        except Exception as exc:  # a bridge's bug must not take the daemon down (logged with its traceback)
            delay = backoff.delay()
            cause = _sole(exc)  # (the bridge's nurseries wrap what it raised in groups)
            if isinstance(cause, PlatformError | StoreError | OSError | UsageError):
                log.error("bridge %s failed: %s; starting it again in %.0f s", config.name, cause, delay)
            else:
                log.exception("bridge %s crashed (%s); starting it again in %.0f s", config.name, cause, delay)
        else:
            return
        await trio.sleep(delay)


def _sole(exc: BaseException) -> BaseException:
    """The one exception a chain of single-member exception groups holds (else ``exc``)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
