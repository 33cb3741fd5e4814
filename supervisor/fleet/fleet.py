"""A fleet: several daemons (hosts) on one PostgreSQL store, a lease per channel.

Theory of operation
-------------------

* **One owner per channel.** A host runs a channel's turns only while it holds the
  channel's row of ``leases``: its owner, an expiry on the database's clock, and a fencing
  token that grows with every new owner. :meth:`Fleet.acquire` takes a free or expired
  lease (or keeps its own) in one statement; placement is the caller's (a pinned channel
  is taken only by its host, see ``[channels.NAME] host``).
* **Heartbeat and watchdog, two tasks.** :meth:`Fleet.run` renews every third of the lease
  (it runs only on PostgreSQL: the SQLite default has no fleet and no wake-ups); a renewal
  is one transaction sent as ONE round trip (pipelined): the host's heartbeat, each held
  lease's expiry where the token is still this host's, the orphans, the fleet's view, and
  a ``beat`` notice (the listeners' proof of life). Beside it a watchdog sleeps until the
  first local deadline and does nothing else, so a renewal that waits on a silent
  connection can never keep a deadline from being acted on (the bug of a cut cable: the
  heartbeat waited, and the turns ran on).
* **Every database call of the fleet has a deadline** (:class:`Link`): renewals, the
  fleet's view, acquisitions, forced takeovers, give-backs and notices — the store's
  statements for a fleet (:class:`~supervisor.store.leases.Leases`), each one transaction's
  work on the connection it is given — run on connections of their own (never behind the
  store's thread and its commits), one call per connection at a time; a call with no answer
  by its deadline has its connection shut down and abandoned
  (:meth:`PostgresEngine.interrupt`), and the next call opens a new one. The store's own
  connection gets the same treatment from the heartbeat when one call has been waiting for
  a lease (:meth:`Store.unstick`). Lease statements wait at most a quarter of the lease for
  a row lock (``lock_timeout``), and the server ends a session idle in a transaction for
  half the lease (see the engines' theory), so a cut-off host's half-done transaction never
  holds a taker up past its leases' expiry.
* **Two ways to lose a lease, both acted on at once.** The local deadline — the monotonic
  clock at the last successful renewal's start plus the lease, *minus a margin*
  (:func:`kill_margin`) — passes; or a renewal finds the row taken. Either way the lease is
  dropped here and reported in the :class:`Found` the watchdog or the heartbeat hands its
  owner (:meth:`Fleet.run`'s ``apply``), synchronously, and the owner kills the channel's
  turns in the same step with SIGKILL and no grace: the channel is no longer this host's to stop politely, and the
  lease's expiry in the database comes later than the local deadline (the database's clock
  started counting when the renewal arrived, after the local start), so the host's turn is
  dead before another host can take the lease, let alone begin a turn (zero overlap; the
  margin absorbs the event loop's latency and clock rate differences). The point of no
  return asks the same deadline (:meth:`Fleet.holds`). Fencing makes a late write harmless
  anyway: every write of a turn carries the token its host held when the turn began
  (``Store.check_fence``).
* **A slow database.** A renewal costs one round trip; renewals are sequential, so a lease
  survives answers as slow as ``(lease - margin) / 2`` each (two renewals must fit in what
  is left of the lease). Slower, and the host steps down: its leases run out locally, its
  turns are killed as above, and it takes channels again once renewals get through.
* **Taking a dead host's channels.** Each heartbeat also asks for channels that have work
  (a queued message or a running turn) under an expired lease of another host; the
  owner takes those its placement allows (:attr:`Found.orphans`). The next heartbeat comes
  no later than the moment the first such lease runs out, so a dead host's channels move
  within the lease plus one round trip (a live host renews every third of its lease, so
  this adds no wake-ups while every host answers).
* **Decide, then act.** The fleet acts on nothing it finds: :meth:`Fleet.beat` returns a
  frozen :class:`Found` (the leases lost, the orphans, the queued work, when to look again)
  and :meth:`Fleet.run` hands each one to its owner's ``apply`` in the step it was found
  (httpcore's pool: decide, return the work, then do it).
* **Notices between hosts.** :meth:`Fleet.listen` keeps a connection of its own on
  ``LISTEN corral_fleet`` in a worker thread; :meth:`Fleet.notify` sends a notice (a typed
  value of :mod:`.notices`, which holds the one decoder; delivered at its transaction's
  commit). A stop through a host that does not own the
  channel is one: the owner acknowledges at once, carries the stop out and answers with
  its result. A notice can be lost (a connection replaced, or cut while the database is
  reachable: the listener, hearing not even a heartbeat's ``beat`` for a lease, replaces its
  connection): every waiter has a deadline,
  and a stop whose owner stays silent for the lease takes the lease by force
  (:meth:`Fleet.force`). Two more kinds go to every host: ``queued`` (a message row,
  below) and ``entries`` (the range of seqs a host's commit stored in a channel, which
  every other host reads back for its followers: see the store's theory of operation; each
  heartbeat also looks, for a notice lost while a listening connection was replaced).
* **At most once, across a host's loss.** A message begins at most one turn in the whole
  fleet, ever: the commit that begins a turn deletes the message's queue row, checked
  against the lease's fencing token, and a turn begins only if the row was still there. A
  turn cut short by its host's loss (killed at a lost lease, or on a host that died) is not
  run again: the next owner closes it with a notice ("Task interrupted — its host stopped
  answering …") and the user sends it again; so is a turn whose beginning commit reached
  the server while its host was cut off before hearing the answer. Every other accepted
  message runs, unless a stop dropped it. ``faults.py --fleet --partition`` checks both on
  every trial (at most one turn row per message; none only if a stop dropped it).
* **The shared queue.** A message accepted by a host that does not own its channel stays
  in the store's queue; the transaction that inserts the row also sends a ``queued`` notice
  (delivered at its commit, so the row is there when it arrives). The owner — the host
  holding the lease, or the one the channel is pinned to — takes the channel's unknown rows
  up at once; a lost notice is made good by the owner's next heartbeat (the rows of its held
  channels it has never queued). Rows are not taken ``FOR UPDATE SKIP LOCKED``: only the
  lease holder runs a channel, and it dequeues a row in the commit that begins its turn,
  checked against its fencing token, so two hosts can never both begin one row; a row
  lock would add nothing the lease does not already give.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from ..core.notices import Beat, Notice, NoticeError, decode
from ..store.engines import Engine, PostgresEngine, describe_postgres, is_postgres_error
from ..store.leases import Leases, Renewal
from ..store.store import Store, StoreError, notify

T = TypeVar("T")

log = logging.getLogger("corral.fleet")

#: Connections a host's fleet calls may use at once (abandoned ones count until their thread ends).
LINK_THREADS = 8


def kill_margin(lease: float) -> float:
    """How long before a lease's local deadline its host gives it up and kills its turns: a
    fifth of the lease, at least 0.2 s (the event loop's latency, the clocks' drift)."""
    return max(0.2, lease / 5)


@dataclass(frozen=True, slots=True)
class Found:
    """What a heartbeat or the watchdog found, for the owner to act on (the fleet acts on none
    of it). A lost lease is no longer held here when this is returned."""

    lost: tuple[tuple[str, str], ...] = ()
    """``(channel, why)`` of each lease given up at its local deadline or found taken."""
    orphans: tuple[str, ...] = ()
    """Channels with work under an expired lease this host does not hold (or under none)."""
    queued: tuple[tuple[str, int], ...] = ()
    """``(channel, seq)`` of the messages queued in the store for channels this host holds."""
    soonest: float | None = None
    """Seconds until another host's lease on a channel with work runs out (None: no such lease)."""
    beat: bool = False
    """Found by a heartbeat (whose view of the fleet, the hosts' room included, is now in)."""


@dataclass(frozen=True, slots=True)
class LeaseCheck:
    """The watchdog's decision: the leases to give up now, and when to look again."""

    lost: tuple[str, ...]
    wake_at: float


def check_leases(until: Mapping[str, float], now: float, margin: float) -> LeaseCheck:
    """(Pure) the held leases whose local deadline minus ``margin`` has passed at ``now``,
    and the moment the next one's does (``inf``: none held)."""
    lost = tuple(channel for channel, deadline in until.items() if deadline - margin <= now)
    wake = min((deadline - margin for channel, deadline in until.items() if channel not in lost), default=math.inf)
    return LeaseCheck(lost, wake)


class LinkTimeout(StoreError):
    """A fleet call had no answer by its deadline: its connection was shut down and abandoned."""


class _Call:
    """One call's connection, shared with its worker thread under a lock (an abandoned
    call's thread closes the connection it ends up with)."""

    def __init__(self, engine: PostgresEngine | None) -> None:
        self.lock = threading.Lock()
        self.engine = engine
        self.abandoned = False
        self.reusable = False


class Link:
    """The connections of a host's fleet calls, every call under a deadline.

    A call takes an idle connection (or opens one, in its thread), runs, and gives it back;
    calls in flight at once each have their own, so a renewal never waits behind an
    acquisition, or behind the store's thread. At its deadline (or a cancel) a call's
    connection is shut down from the Trio thread, which wakes the worker thread blocked on
    it; the call raises :class:`LinkTimeout` and the connection is never used again."""

    def __init__(self, connect: Callable[[], PostgresEngine], name: str) -> None:
        self._connect = connect
        self.name = name
        self._idle: list[PostgresEngine] = []
        self._limiter = trio.CapacityLimiter(LINK_THREADS)
        self.abandoned = 0
        """Calls abandoned at their deadline (for tests and the fault runs)."""

    async def transact(self, work: Callable[[Engine], T], deadline: float, *, own: bool = False) -> T:
        """Run ``work`` in a transaction of its own (``own``: it begins and commits it itself,
        as one pipelined round trip may) within ``deadline`` seconds, else :class:`LinkTimeout`."""
        call = _Call(self._idle.pop() if self._idle else None)

        def run() -> T:
            engine = call.engine
            if engine is None:
                engine = self._connect()
                with call.lock:
                    call.engine, abandoned = engine, call.abandoned
                if abandoned:
                    engine.close()
                    raise LinkTimeout("abandoned while connecting")
            try:
                with engine.rolling_back() if own else engine.transaction():
                    out = work(engine)
            finally:
                with call.lock:
                    call.reusable = not call.abandoned and engine.usable()
                if not call.reusable:
                    engine.close()
            return out

        try:
            with trio.fail_after(deadline):
                out = await trio.to_thread.run_sync(run, abandon_on_cancel=True, limiter=self._limiter)
        except (trio.Cancelled, trio.TooSlowError) as exc:
            self._abandon(call)
            if isinstance(exc, trio.TooSlowError):
                raise LinkTimeout(f"the database did not answer within {deadline:.2g} s (store {self.name});"
                                  " its connection was abandoned") from None
            raise
        except Exception as exc:
            if call.reusable and call.engine is not None:
                self._idle.append(call.engine)
            if is_postgres_error(exc):
                raise StoreError(describe_postgres(exc, self.name)) from exc
            raise
        if call.reusable and call.engine is not None:
            self._idle.append(call.engine)
        return out

    def _abandon(self, call: _Call) -> None:
        with call.lock:
            call.abandoned = True
            engine = call.engine
        self.abandoned += 1
        if engine is not None:
            engine.interrupt()  # (the thread wakes with an error, and closes it)

    def close(self) -> None:
        """Close the idle connections (those in flight close when their call ends)."""
        idle, self._idle = self._idle, []
        for engine in idle:
            engine.close()


class Fleet:
    """This host's leases in a fleet; run :meth:`run` as the heartbeat task."""

    def __init__(self, store: Store, host: str, lease: float) -> None:
        self.store = store
        self.host = host
        self.lease = lease
        self.margin = kill_margin(lease)
        """How long before a lease's local deadline this host gives it up (:func:`kill_margin`)."""
        self.link = Link(store.link_engine, store.path)
        """The connections of this host's fleet calls, each call under a deadline."""
        self.leases = Leases(host, lease)
        """What those calls ask of the database (the store's statements for a fleet)."""
        self.room: Callable[[], int] | None = None
        """(Set by the owner) this host's room — free slots less waiting turns — which each
        heartbeat stores for the other hosts (placement by capacity)."""
        self._tokens: dict[str, int] = {}
        """Held leases: channel → fencing token."""
        self._until: dict[str, float] = {}
        """Each held lease's local deadline (``trio.current_time``)."""
        self._changed = trio.Event()
        self._not_before: dict[str, float] = {}
        """(``trio.current_time``) channels taken by force: no turn before the old lease ran out."""
        self._acquiring: dict[str, list[trio.Event]] = {}
        """Acquisitions in flight, by channel: each event is set when its answer is in."""
        self.renewals = 0
        """Heartbeats that reached the database, each counted once its view of the fleet
        (``view``) is read (for tests and the benchmark)."""
        self.paused = False
        """(Tests) take and renew nothing, as a host cut off from the database."""
        self.view: list[dict[str, Any]] = []
        """Every host of the fleet as the last heartbeat read it (``status`` shows it)."""
        self.malformed = 0
        """Payloads on the notices' channel that were no notice (dropped, see :meth:`_malformed`)."""

    # ------------------------------------------------------------ leases

    def token(self, channel: str) -> int | None:
        """The fencing token of the channel's lease, if this host holds it."""
        return self._tokens.get(channel)

    def holds(self, channel: str) -> bool:
        """The lease is this host's and its local deadline minus the margin has not passed
        (the point of no return asks; the watchdog kills at the same moment)."""
        until = self._until.get(channel)
        now = trio.current_time()
        return until is not None and self._not_before.get(channel, now) <= now < until - self.margin

    async def wait_ready(self, channel: str) -> None:
        """Before a turn: wait until the lease of the owner this host took the channel from
        by force has run out (its turns are dead by then, whatever it heard)."""
        not_before = self._not_before.get(channel)
        if not_before is not None:
            await trio.sleep_until(not_before)
            if self._not_before.get(channel) == not_before:
                del self._not_before[channel]

    @property
    def call_deadline(self) -> float:
        """The deadline of one fleet call (half the lease): a host that cannot get an answer in
        that time cannot keep its leases anyway."""
        return max(0.5, self.lease / 2)

    def held(self) -> dict[str, int]:
        """Every lease this host holds, with its token."""
        return dict(self._tokens)

    async def settled(self, channel: str) -> None:
        """Wait for this host's acquisitions of the channel's lease in flight: the database
        may already name this host the owner (another host just read so, and asks it to
        stop the channel) while the answer is on its way here."""
        for taken in list(self._acquiring.get(channel, ())):
            await taken.wait()

    async def force(self, channel: str) -> int:
        """Take the channel's lease whoever holds it (a stop its owner did not answer): a new
        token, so the last owner's writes fail from now on and it kills its turns when it
        next looks — at the latest by its local deadline, which comes before the old lease's
        expiry in the database. So this host begins no turn of the channel until that expiry
        (:meth:`wait_ready`): the old owner may still be running one, cut off from the news."""
        started = trio.current_time()
        host, lease = self.host, self.lease
        token, newest, left = await self.link.transact(functools.partial(self.leases.force, channel=channel),
                                                       max(2.0, lease))
        self.store.seq_floor(newest)
        self._tokens[channel] = token
        self._until[channel] = started + lease
        if left > 0:
            self._not_before[channel] = trio.current_time() + left
        log.warning("host %s took channel %r by force (fencing token %d)", host, channel, token)
        self._changed.set()
        return token

    async def give_back(self, channel: str) -> None:
        """Let the channel's lease run out now (a pinned channel taken only for a stop)."""
        token = self._tokens.pop(channel, None)
        self._until.pop(channel, None)
        if token is None:
            return
        await self.link.transact(functools.partial(self.leases.give_back, channel=channel, token=token),
                                 self.call_deadline)

    # ------------------------------------------------------------ notices between hosts

    async def notify(self, notice: Notice) -> None:
        """Send a notice to every host of the fleet (``NOTIFY``, delivered at the commit)."""
        await self.link.transact(functools.partial(notify, notice=notice), self.call_deadline)

    async def listen(
        self, deliver: Callable[[Notice], None], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Deliver every notice of the fleet to ``deliver`` (in Trio), until cancelled; a
        ``beat`` only keeps the connection's silence from being taken for a cut, and a
        malformed payload is dropped (:meth:`_malformed`): nothing from the wire can end it.

        A connection of its own waits in a worker thread; it wakes once a second to see
        whether it should end (PostgreSQL only: the fleet has no SQLite mode). A lost
        connection is replaced; notices sent meanwhile are lost, and every waiter has a
        deadline (a stop answers ``ok: false`` when its owner's answer does not come). A
        connection that hears nothing for a lease — not even the ``beat`` every renewal of
        every host sends, its own included — is silent (cut while the database answers the
        rest): it is replaced too."""
        token = trio.lowlevel.current_trio_token()
        closing = False
        lease = self.lease

        def wait() -> None:
            import psycopg

            conn = None
            heard = time.monotonic()
            try:
                while not closing:
                    try:
                        if conn is not None and time.monotonic() - heard > lease:
                            log.warning("host %s: the fleet's notices went silent for %g s; listening again",
                                        self.host, lease)
                            conn.close()
                            conn = None
                        if conn is None or conn.closed or conn.broken:
                            conn = self.store.listener()
                            heard = time.monotonic()
                        for notify in conn.notifies(timeout=min(1.0, lease / 3)):
                            heard = time.monotonic()
                            try:
                                notice = decode(notify.payload)
                            except NoticeError as exc:
                                self._malformed(notify.payload, exc)
                                continue
                            if not isinstance(notice, Beat):
                                trio.from_thread.run_sync(deliver, notice, trio_token=token)
                    except psycopg.OperationalError as exc:
                        log.warning("host %s: the fleet's notices were cut off (%s); listening again", self.host, exc)
                        time.sleep(1.0)
            except trio.RunFinishedError:
                pass
            finally:
                if conn is not None:
                    conn.close()

        task_status.started()
        try:
            await trio.to_thread.run_sync(wait, abandon_on_cancel=True)
        finally:
            closing = True

    def _malformed(self, payload: str, error: NoticeError) -> None:
        """(The listener's thread) a payload that is no notice: dropped; the first is logged as
        a warning, the rest (a stream of them must not flood the log) at debug level."""
        self.malformed += 1
        level = logging.WARNING if self.malformed == 1 else logging.DEBUG
        log.log(level, "host %s: dropped a malformed fleet notice of %d characters: %s%s", self.host, len(payload),
                error, "; more are logged at debug level" if self.malformed == 1 else "")

    async def acquire(self, channel: str) -> int | None:
        """Take the channel's lease (free, expired, or already this host's); its token, or
        None if another host holds it. A new owner's token is the last one plus one, and the
        store's seqs move past every seq stored so far, in the same transaction."""
        if self.paused:
            return None
        taken = trio.Event()
        self._acquiring.setdefault(channel, []).append(taken)
        try:
            return await self._acquire(channel)
        finally:
            taken.set()
            waiting = self._acquiring[channel]
            waiting.remove(taken)
            if not waiting:
                del self._acquiring[channel]

    async def _acquire(self, channel: str) -> int | None:
        started = trio.current_time()
        host, lease = self.host, self.lease
        token, newest = await self.link.transact(functools.partial(self.leases.take, channel=channel),
                                                 self.call_deadline)
        if token is None:
            return None
        self.store.seq_floor(newest)
        previous = self._tokens.get(channel)
        self._tokens[channel] = token
        self._until[channel] = started + lease
        if previous != token:
            log.info("host %s took channel %r (fencing token %d)", host, channel, token)
        self._changed.set()
        return token

    def _lose(self, channel: str, why: str) -> bool:
        """Drop the channel's lease here; was it held?"""
        token = self._tokens.pop(channel, None)
        self._until.pop(channel, None)
        self._not_before.pop(channel, None)
        if token is not None:
            log.warning("host %s lost channel %r (token %d): %s", self.host, channel, token, why)
        return token is not None

    async def release(self) -> None:
        """Give every lease back (a clean shutdown): other hosts may take them at once."""
        held, self._tokens, self._until = self._tokens, {}, {}
        if not held:
            return
        host = self.host
        try:
            await self.link.transact(functools.partial(self.leases.give_back_all, held=held), self.call_deadline)
        except StoreError as exc:
            log.warning("host %s could not give its leases back (they expire on their own): %s", host, exc)

    # ------------------------------------------------------------ the heartbeat

    async def run(
        self, apply: Callable[[Found], None], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Renew this host's heartbeat and leases every third of the lease, and (a task of
        its own) give each lease up the moment its local deadline minus the margin passes.
        What either finds is handed to ``apply`` (the owner's, synchronous: a lost lease's
        turns die in that step)."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, apply)
                task_status.started()
                await self._renew(apply)
        finally:
            self.link.close()

    async def _watch(self, apply: Callable[[Found], None]) -> None:
        """The watchdog: nothing but the local deadlines, so nothing can hold it up."""
        while True:
            check = check_leases(self._until, trio.current_time(), self.margin)
            why = f"its lease ({self.lease:g} s) could not be renewed in time"
            lost = tuple((channel, why) for channel in check.lost if self._lose(channel, why))
            if lost:
                apply(Found(lost=lost))  # (no checkpoint from the check to the kill)
            # (No checkpoint since the check: a lease taken after it sets this new event.)
            self._changed = trio.Event()
            with trio.move_on_at(check.wake_at):
                await self._changed.wait()

    async def _renew(self, apply: Callable[[Found], None]) -> None:
        renew_at = trio.current_time()
        while True:
            await trio.sleep_until(renew_at)
            renew_at = trio.current_time() + self.lease / 3
            self.store.unstick(self.lease)  # (the store's thread waiting on a silent connection: abandon it)
            if not self.paused:
                found = await self.beat()
                if found is None:
                    continue
                apply(found)  # (in the step the beat returned: no checkpoint before a lost lease's kill)
                if found.soonest is not None:  # (a dead host's lease: look again the moment it runs out)
                    renew_at = min(renew_at, trio.current_time() + found.soonest + 0.01)

    async def beat(self) -> Found | None:
        """One heartbeat, ONE round trip: the host's row, every held lease whose token is
        still this host's, the channels with work under an expired lease not held here, the
        fleet's view, and a ``beat`` notice. Returns what it found (:class:`Found`: the leases
        found taken, dropped here already; the orphans; the queued work; the seconds until
        another host's lease on a channel with work runs out), or None if it failed: the
        owner acts on it. Its deadline is half the lease, or
        the first lease's local deadline minus the margin if that comes sooner (the
        watchdog gives that lease up then anyway)."""
        started = trio.current_time()
        host, lease, held = self.host, self.lease, dict(self._tokens)
        first = min(self._until.values(), default=math.inf) - self.margin
        deadline = max(0.05, min(self.call_deadline, first - started))

        try:
            renewal: Renewal = await self.link.transact(
                functools.partial(self.leases.beat, held=list(held),
                                  room=self.room() if self.room is not None else None),
                deadline, own=True,
            )
        except StoreError as exc:
            log.warning("host %s: heartbeat failed (%s); its leases run out unless the next one succeeds", host, exc)
            return None
        kept, orphans, queued = renewal.kept, list(renewal.orphans), list(renewal.queued)
        self.store.reachable()  # (the database answers again: the store reconnects at once if it must)
        self.store.others_committed()  # (a notice of other hosts' entries lost in a reconnect: read them now)
        lost: list[tuple[str, str]] = []
        for channel, token in held.items():
            if self._tokens.get(channel) != token:
                continue  # (lost or taken anew while the heartbeat ran)
            if (channel, token) in kept:
                self._until[channel] = started + lease
            elif self._lose(channel, "another host holds its lease now"):
                lost.append((channel, "another host holds its lease now"))
        self.view = self._view(renewal.now, renewal.hosts, renewal.leases)
        self.renewals += 1  # (counted once its view of the fleet is in: status shows this beat's)
        return Found(tuple(lost), tuple(orphans), tuple(queued), renewal.soonest, beat=True)

    def _view(self, now: float, hosts: list[tuple[Any, ...]], leases: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
        out = []
        for host, heartbeat, pid, started, room in hosts:
            out.append({
                "host": host, "heartbeat": heartbeat, "age": round(now - heartbeat, 3), "pid": pid, "started": started,
                "alive": now - heartbeat < self.lease, "room": room,
                "channels": {c: {"token": t, "expired": e <= now} for c, o, e, t in leases if o == host},
            })
        return out

    def room_elsewhere(self) -> int:
        """The room other live hosts said they had at their last heartbeats (0: none)."""
        return sum(max(0, h["room"] or 0) for h in self.view if h["host"] != self.host and h["alive"])

    async def hosts(self) -> list[dict[str, Any]]:
        """Every host of the fleet: its name, last heartbeat (database clock), age, and channels."""
        now, hosts, leases = await self.link.transact(self.leases.view, self.call_deadline)
        return self._view(now, hosts, leases)
