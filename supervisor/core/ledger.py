"""The stop ledger: the pure state machine behind the Stop button.

Theory of operation
-------------------

The ledger knows nothing of processes, sockets, files or Trio. It is fed events by one
driver (the supervisor) and answers each with a decision; the driver carries decisions out.
Every method is synchronous and runs to completion, so a decision and the state it was
made from can never be separated by another task.

A channel has one or more **lanes**, one per agent working in it: a lane has its own
queue, at most one turn, and its own run of nudges, so different agents of a channel work
at the same time. Everything a stop is about is per channel, not per lane: the
generation, the repeat window, the notice and the routing rest.

Each channel has a **generation**, a counter only a stop moves. Everything is stamped
with the generation current when it entered: a message when it is accepted, a turn when
it takes its message off the queue. A turn is **stale** when its generation is older than
its channel's: a stop happened after it began, and nothing it does may reach the user any
more, except the session id it prints (so the next message resumes the conversation).

The rules, each a line of the stop contract (docs/stop-contract.md):

* ``stop(channel)`` moves that channel's generation and nothing else's (1, 2). It drops
  every queued message of every lane of the channel (3) and makes every current turn of
  the channel stale, whatever phase each is in (3, 5, 6); the decision names each
  stopped turn with its agent, and owes one notice for all of them (10, 12).
* A message accepted after the stop carries the new generation and runs (4).
* ``may_start`` is asked at the point of no return; a stale turn gets ``False`` (5).
* ``keep_process`` answers whether a newly registered process may live (6).
* ``keep_output`` drops everything a stale turn says, except its session id (8).
* ``end_turn`` decides the todo nudge, and never nudges a stale turn (9).
* A stop is a **repeat** when no turn has begun in the channel since its previous stop:
  it does not move the generation and owes no notice (11). Otherwise it owes exactly one
  notice (10); ``notice_stored`` records it so a repeat can name it.
* ``interrupt(channel, agent)`` is a stop of one lane, for a message that replaces its work
  (a delivery of ``interrupt``): the lane's current turn is made stale (its own notice,
  "Interrupted by a new message.", is owed by ``end_turn``: ``EndDecision.interrupted``) and
  the lane's queue is dropped; no generation moves, so the channel's other lanes, its
  repeat window and its routing are untouched. The driver accepts the interrupting message
  in the same step, so nothing can come between it and the head of the lane. A channel stop
  after it supersedes it: the turn is the stop's to end, and its notice the stop's.
  ``abort_interrupt`` undoes one whose record could not be stored.
* ``stop_all()`` stops every channel that has work (a turn or a queued message); an idle
  channel has nothing to stop and gets no notice from a stop-all.
* After a stop, agent-to-agent routing in the channel rests until a human speaks (12):
  ``may_route`` answers for the router, and ``accept(..., routed=True)`` refuses (a
  :class:`LedgerError`) a routed message while the channel rests or from a stale turn.
  The rest lifts when a human message is accepted; routing then resumes from it only.
* A stop is on record in the ledger at once, but it is carried out only once its record
  (generation, dropped messages, cancelled plan) is durably stored (17). If that store
  fails, ``abort_stop(decision)`` puts the channel back exactly as the stop found it:
  the generation, the repeat window, the routing rest, and the dropped messages at the
  head of their lanes' queues, each lane's in the order it held them (a ``move_first`` may
  have put a later one first). Messages accepted while the record was being stored
  were stamped with the stop's generation; they are re-stamped with the restored one
  and stay queued behind the restored messages, and a turn begun in that window keeps
  running under the restored generation. A retried stop is then a real stop, not a
  repeat. If another stop has moved the generation since (it superseded this one, and
  dropped whatever this one would have), nothing is undone.
* ``take_back(channel, seq)`` and ``move_first(channel, seq)`` edit the queue (20): every
  queued message of the entry ``seq`` (one per lane it went to) leaves its lane, or moves to
  its head, in that step. A turn's ``take`` is synchronous too, so an edit and a take never
  interleave: a message a turn took is not taken back (``RUNNING`` names the turn; a stop is
  what ends it), and one taken back never starts. ``undo_edit`` puts back an edit whose
  record could not be stored (unless a stop came since: what it dropped stays dropped).
* In a fleet the ledger sees only this host's decisions. ``lose`` silences a channel's turns
  when its lease moves; ``adopt`` re-stamps what this host accepted while another host
  owned the channel; and a message taken up from the store may turn out, at its turn's
  begin, to have been dropped by a stop the ledger never saw drop it: ``unbegin`` gives
  the lane back and leaves the repeat window as it was (no turn began).

The ledger keeps, for a host of 100,000 channels, the channels that are busy (a turn or a
queued message in some lane) and those with a turn as two sets, changed in the same step
as the lane that makes them so (``_mark``), and every channel's name in order (``names``,
with the names a restart finds in the store: ``know``): a status page and the metrics then
cost the busy channels, not every one. They are exact after every call (a state-machine
test walks every channel to check).

Violations of the driver's side of the protocol (ending a turn that is not running,
starting a second turn in a busy lane, routing while the channel rests) raise :class:`LedgerError`: they are bugs.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Set
from dataclasses import dataclass, field, replace

from .names import SortedNames


class LedgerError(RuntimeError):
    """The driver broke the ledger's protocol; always a bug in the caller."""


class Phase(enum.Enum):
    """Where a turn is. PREPARING ends at the point of no return."""

    PREPARING = "preparing"
    STARTED = "started"


class OutputKind(enum.Enum):
    """What a line of a turn's output amounts to, as far as a stop is concerned."""

    SESSION = "session"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """An accepted message waiting for its turn. ``payload`` is opaque to the ledger."""

    id: int
    generation: int
    human: bool
    nudge: bool = False
    """The supervisor's own "please continue" reminder."""
    payload: object = None
    agent: str = ""
    """The lane (agent) it waits in."""
    hops: int = 0
    """Agent-to-agent hand-offs that led to it: 0 for a human's message."""
    routed: bool = False
    """Routed by corral from an agent's message (a hand-off)."""
    entry: int | None = None
    """The entry it repeats when it has none of its own (a hand-off's source, a second
    target's message); None: ``id`` is its entry. Taking back an entry takes back each."""

    @property
    def entry_seq(self) -> int:
        """The seq of the transcript entry this queued message is (its own, or the one it repeats)."""
        return self.entry if self.entry is not None else self.id


@dataclass(frozen=True, slots=True)
class TurnTicket:
    """A turn that may begin preparing."""

    turn_id: str
    message: QueuedMessage
    generation: int

    @property
    def agent(self) -> str:
        """The lane (agent) the turn runs in."""
        return self.message.agent


@dataclass(frozen=True, slots=True)
class Take:
    """The answer to ``take``: the turn to run (if any) and messages dropped on the way."""

    ticket: TurnTicket | None
    dropped: tuple[QueuedMessage, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class StopDecision:
    """What one channel's stop does; the driver carries it out in order."""

    channel: str
    generation: int
    repeat: bool
    stopped_turns: tuple[tuple[str, str], ...]
    """``(agent, turn_id)`` of every turn made stale: cancel each scope, kill each tree."""
    dropped: tuple[QueuedMessage, ...]
    """Queued messages of every lane that will never run, oldest first."""
    notice_due: bool
    """Post the notice once the stopped turn is torn down."""
    notice_seq: int | None
    """For a repeat: the notice already stored for the stop it repeats (None if pending)."""
    prior_notice_seq: int | None = None
    """What ``abort_stop`` restores: the notice seq the channel had before this stop."""
    prior_routing_rests: bool = False
    """What ``abort_stop`` restores: whether routing rested before this stop."""
    dropped_by_lane: tuple[tuple[str, tuple[QueuedMessage, ...]], ...] = ()
    """What ``abort_stop`` restores: each lane's dropped messages in its queue's order (a
    ``move_first`` may have put a later message ahead of an older one)."""

    @property
    def stopped_turn(self) -> str | None:
        """The first stopped turn's id (None: nothing was running); see ``stopped_turns``."""
        return self.stopped_turns[0][1] if self.stopped_turns else None


@dataclass(frozen=True, slots=True)
class ShutdownDecision:
    """What a shutdown does: end these turns (not already stopped) as interrupted by it."""

    turns: tuple[tuple[str, str], ...]
    """``(channel, turn_id)`` of every turn silenced (of every lane): cancel its scope,
    interrupt its group."""


@dataclass(frozen=True, slots=True)
class EndDecision:
    """What follows a turn's end."""

    nudge: bool
    """Queue a "you have N remaining tasks" message for the agent."""
    stale: bool
    """The turn was stopped; its leftovers are discarded."""
    interrupted: bool = False
    """It was interrupted by a new message (and not stopped since): its notice is owed now."""


@dataclass(frozen=True, slots=True)
class InterruptDecision:
    """What an interrupt of one lane does; the driver carries it out in order."""

    channel: str
    agent: str
    turn_id: str | None
    """The lane's turn made stale (cancel its scope, kill its tree); None: none was running."""
    dropped: tuple[QueuedMessage, ...]
    """The lane's queued messages that will never run, oldest first."""


class EditOutcome(enum.Enum):
    """What a queue edit (take back, move first) found."""

    DONE = "done"
    """Every queued message of the entry was taken back (moved first)."""
    RUNNING = "running"
    """Nothing of it is queued any more: a turn took it (it runs; a stop ends it)."""
    NOT_QUEUED = "not_queued"
    """It is no queued message of the channel (run already, dropped, taken back, never one)."""


@dataclass(frozen=True, slots=True)
class QueueEdit:
    """What ``take_back`` or ``move_first`` decided; the driver stores it (or undoes it)."""

    channel: str
    seq: int
    """The entry asked for."""
    action: str
    """``"take_back"`` or ``"move_first"``."""
    outcome: EditOutcome
    messages: tuple[QueuedMessage, ...] = ()
    """The queued messages taken back (moved first), in their lanes' order."""
    places: tuple[int, ...] = ()
    """Each one's index in its lane before the edit (what ``undo_edit`` puts back)."""
    running: tuple[tuple[str, str], ...] = ()
    """``(agent, turn_id)`` of the turns that took the entry already (they run on)."""
    generation: int = 0
    """The channel's generation when it was decided."""


@dataclass(slots=True)
class _Turn:
    turn_id: str
    generation: int
    phase: Phase
    nudge: bool
    silenced: bool = False
    """Ended by a shutdown: stale like a stopped turn, though the generation stays."""
    interrupted: bool = False
    """Ended by an interrupting message: stale like a stopped turn, for its lane alone."""
    closed_window: bool = False
    """Taking it closed the channel's repeat window (``unbegin`` opens it again)."""
    entry: int = -1
    """The entry of the message it took (a queue edit that comes too late names the turn)."""


@dataclass(slots=True)
class _Lane:
    queue: deque[QueuedMessage] = field(default_factory=deque)
    turn: _Turn | None = None
    nudges_in_row: int = 0


@dataclass(slots=True)
class _Channel:
    generation: int = 0
    lanes: dict[str, _Lane] = field(default_factory=dict)
    """One per agent that has had work in the channel, in the order they first had it."""
    stopped: bool = False
    """A stop happened and no turn has begun since: the next stop is a repeat."""
    notice_seq: int | None = None
    routing_rests: bool = False

    def lane(self, agent: str) -> _Lane:
        lane = self.lanes.get(agent)
        if lane is None:
            lane = self.lanes[agent] = _Lane()
        return lane

    def lane_of(self, turn_id: str) -> _Lane | None:
        """The lane whose current turn is ``turn_id`` (a handful of lanes: a scan is enough)."""
        for lane in self.lanes.values():
            if lane.turn is not None and lane.turn.turn_id == turn_id:
                return lane
        return None

    def queued(self) -> list[QueuedMessage]:
        """Every lane's queue, merged in acceptance order."""
        return sorted((m for lane in self.lanes.values() for m in lane.queue), key=lambda m: m.id)

    def busy(self) -> bool:
        return any(lane.turn is not None or lane.queue for lane in self.lanes.values())


class StopLedger:
    """Per-channel stop generations and per-(channel, agent) lanes; decisions only, no I/O."""

    def __init__(self, *, max_nudges: int = 3) -> None:
        if max_nudges < 0:
            raise ValueError("max_nudges must be >= 0")
        self.max_nudges = max_nudges
        self._channels: dict[str, _Channel] = {}
        self._shut_down = False
        # Kept where a lane's turn or queue changes (``_mark``), so a status page and the
        # metrics cost what is busy, not every channel a host of 100,000 has seen.
        self._busy: set[str] = set()
        self._with_turn: set[str] = set()
        self.names = SortedNames()
        """Every channel seen, in name order (a restart adds the store's: :meth:`know`)."""

    # ------------------------------------------------------------ queries

    def _chan(self, channel: str) -> _Channel:
        state = self._channels.get(channel)
        if state is None:
            state = self._channels[channel] = _Channel()
            self.names.add(channel)
        return state

    def _mark(self, channel: str, state: _Channel) -> None:
        """Keep ``_busy`` and ``_with_turn`` exact after a change to a lane of ``channel``."""
        turn = queue = False
        for lane in state.lanes.values():
            turn = turn or lane.turn is not None
            queue = queue or bool(lane.queue)
        if turn:
            self._with_turn.add(channel)
        else:
            self._with_turn.discard(channel)
        if turn or queue:
            self._busy.add(channel)
        else:
            self._busy.discard(channel)

    def _lane(self, channel: str, agent: str | None) -> _Lane | None:
        """The named lane, or (``agent`` None) the first lane with a turn, else the first."""
        state = self._channels.get(channel)
        if state is None or not state.lanes:
            return None
        if agent is not None:
            return state.lanes.get(agent)
        return next((lane for lane in state.lanes.values() if lane.turn is not None), next(iter(state.lanes.values())))

    def generation(self, channel: str) -> int:
        """The channel's current stop generation."""
        state = self._channels.get(channel)
        return state.generation if state else 0

    def channels(self) -> Iterable[str]:
        """Every channel the ledger has seen (has state for; :attr:`names` also holds the known ones)."""
        return self._channels.keys()

    def know(self, names: Iterable[str]) -> None:
        """Channels the store holds (a restart): named in :attr:`names`, idle, with no state
        kept for them until they have some (a host of 100,000 restores their names only)."""
        self.names.update(names)

    def busy_channels(self) -> Set[str]:
        """The channels with a turn or a queued message in some lane (read only: kept by the ledger)."""
        return self._busy

    def running_channels(self) -> Set[str]:
        """The channels with a turn (preparing or started, stale or not) in some lane (read only)."""
        return self._with_turn

    def queue_size(self, channel: str) -> int:
        """How many messages wait in the channel's lanes (``len(queued(channel))`` without the sort)."""
        state = self._channels.get(channel)
        return sum(len(lane.queue) for lane in state.lanes.values()) if state else 0

    def lanes(self, channel: str) -> tuple[str, ...]:
        """The agents that have had work in the channel, in the order they first had it."""
        state = self._channels.get(channel)
        return tuple(state.lanes) if state else ()

    def queued(self, channel: str, agent: str | None = None) -> tuple[QueuedMessage, ...]:
        """A lane's queue, oldest first; with no ``agent``, every lane's, in acceptance order."""
        state = self._channels.get(channel)
        if state is None:
            return ()
        if agent is None:
            return tuple(state.queued())
        lane = state.lanes.get(agent)
        return tuple(lane.queue) if lane else ()

    def current_turn(self, channel: str, agent: str | None = None) -> str | None:
        """The id of the turn the lane is running or preparing (no ``agent``: any lane's)."""
        lane = self._lane(channel, agent)
        return lane.turn.turn_id if lane and lane.turn else None

    def current_turns(self, channel: str) -> dict[str, str]:
        """``agent -> turn id`` of every lane running or preparing a turn."""
        state = self._channels.get(channel)
        if state is None:
            return {}
        return {agent: lane.turn.turn_id for agent, lane in state.lanes.items() if lane.turn is not None}

    def turn_phase(self, channel: str, agent: str | None = None) -> Phase | None:
        """The phase of the lane's current turn (no ``agent``: any lane's), if any."""
        lane = self._lane(channel, agent)
        return lane.turn.phase if lane and lane.turn else None

    def is_busy(self, channel: str, agent: str | None = None) -> bool:
        """The lane (no ``agent``: any lane of the channel) has a turn or a queued message."""
        state = self._channels.get(channel)
        if state is None:
            return False
        if agent is None:
            return state.busy()
        lane = state.lanes.get(agent)
        return bool(lane and (lane.turn or lane.queue))

    def is_stale(self, channel: str, turn_id: str) -> bool:
        """A stop has happened since this turn began (or the turn is not a current one)."""
        state = self._channels.get(channel)
        lane = state.lane_of(turn_id) if state else None
        if state is None or lane is None or lane.turn is None:
            return True
        return lane.turn.silenced or lane.turn.interrupted or lane.turn.generation < state.generation

    def rests(self, channel: str) -> bool:
        """Agent-to-agent routing in the channel rests (a stop, and no human since)."""
        state = self._channels.get(channel)
        return bool(state and state.routing_rests)

    def in_repeat_window(self, channel: str) -> bool:
        """A stop happened and no turn has begun since: the next stop is a repeat."""
        state = self._channels.get(channel)
        return bool(state and state.stopped)

    # ------------------------------------------------------------ messages

    def restore(self, channel: str, generation: int, *, rests: bool = False, stopped: bool = False) -> None:
        """Set a channel's state from the store after a restart (never moves the generation back).

        ``rests`` and ``stopped`` are the routing rest and the repeat window as stored.
        """
        state = self._chan(channel)
        state.generation = max(state.generation, generation)
        state.routing_rests = state.routing_rests or rests
        state.stopped = state.stopped or stopped

    def accept(
        self, channel: str, agent: str, message_id: int, *, human: bool, nudge: bool = False, payload: object = None,
        hops: int = 0, routed: bool = False, entry: int | None = None,
    ) -> QueuedMessage:
        """Queue a message in the agent's lane under the channel's current generation.

        A human lifts the routing rest. A ``routed`` message (a hand-off from an agent) while
        the channel rests is a driver bug: ``may_route`` said no.
        """
        state = self._chan(channel)
        if routed and state.routing_rests:
            raise LedgerError(f"channel {channel!r} rests: message {message_id} may not be routed")
        message = QueuedMessage(message_id, state.generation, human, nudge, payload, agent, hops, routed, entry)
        state.lane(agent).queue.append(message)
        self._busy.add(channel)
        if human:
            state.routing_rests = False
        return message

    def requeue(self, channel: str, message: QueuedMessage) -> None:
        """Put back a message restored from the store, with the generation it was accepted under."""
        self._chan(channel).lane(message.agent).queue.append(message)
        self._busy.add(channel)

    def take(self, channel: str, agent: str, turn_id: str) -> Take:
        """Begin the lane's next turn: pop its oldest current message; stale ones are dropped."""
        state = self._chan(channel)
        lane = state.lane(agent)
        if lane.turn is not None:
            raise LedgerError(f"agent {agent!r} in channel {channel!r} already runs turn {lane.turn.turn_id!r}")
        if state.lane_of(turn_id) is not None:
            raise LedgerError(f"turn {turn_id!r} already runs in channel {channel!r}")
        if self._shut_down:
            return Take(None, ())
        dropped = []
        while lane.queue:
            message = lane.queue.popleft()
            if message.generation < state.generation:
                dropped.append(message)
                continue
            lane.turn = _Turn(turn_id, state.generation, Phase.PREPARING, message.nudge, closed_window=state.stopped,
                              entry=message.entry_seq)
            state.stopped = False
            if message.human:
                lane.nudges_in_row = 0
            self._with_turn.add(channel)
            self._busy.add(channel)
            return Take(TurnTicket(turn_id, message, state.generation), tuple(dropped))
        self._mark(channel, state)
        return Take(None, tuple(dropped))

    # ------------------------------------------------------------ a turn's life

    def may_start(self, channel: str, turn_id: str) -> bool:
        """Asked at the point of no return. True moves the turn to STARTED."""
        if self.is_stale(channel, turn_id):
            return False
        lane = self._channels[channel].lane_of(turn_id)
        assert lane is not None and lane.turn is not None
        lane.turn.phase = Phase.STARTED
        return True

    def keep_process(self, channel: str, turn_id: str) -> bool:
        """May a process just registered for this turn live? False means kill it now."""
        return not self.is_stale(channel, turn_id)

    def keep_output(self, channel: str, turn_id: str, kind: OutputKind) -> bool:
        """May this output of the turn be stored? A stale turn keeps only its session id."""
        return kind is OutputKind.SESSION or not self.is_stale(channel, turn_id)

    def end_turn(
        self, channel: str, turn_id: str, *, ok: bool, unfinished_todos: int, max_nudges: int | None = None
    ) -> EndDecision:
        """The turn is over and torn down; decide whether to nudge it on (in its own lane)."""
        state = self._channels.get(channel)
        lane = state.lane_of(turn_id) if state else None
        if state is None or lane is None or lane.turn is None:
            raise LedgerError(f"turn {turn_id!r} is not running in channel {channel!r}")
        turn = lane.turn
        lane.turn = None
        self._mark(channel, state)
        stopped = turn.silenced or turn.generation < state.generation
        stale = stopped or turn.interrupted
        nudge = (
            not stale
            and ok
            and unfinished_todos > 0
            and lane.nudges_in_row < (self.max_nudges if max_nudges is None else max_nudges)
            and not lane.queue
        )
        if nudge:
            lane.nudges_in_row += 1
        elif not turn.nudge:
            lane.nudges_in_row = 0
        return EndDecision(nudge=nudge, stale=stale, interrupted=turn.interrupted and not stopped)

    def unbegin(self, channel: str, turn_id: str) -> None:
        """(A fleet) the turn never began: the store found its message dropped by a stop this
        ledger did not see drop it (another host's, or one that came while the row was read).
        Its lane is free, and the repeat window is as it was (no turn has begun since the stop)."""
        state = self._channels.get(channel)
        lane = state.lane_of(turn_id) if state else None
        if state is None or lane is None or lane.turn is None:
            raise LedgerError(f"turn {turn_id!r} is not running in channel {channel!r}")
        if lane.turn.phase is not Phase.PREPARING:
            raise LedgerError(f"turn {turn_id!r} is past its point of no return: it began")
        state.stopped = state.stopped or lane.turn.closed_window
        lane.turn = None
        self._mark(channel, state)

    # ------------------------------------------------------------ queue edits (contract 21)

    def _edit_targets(self, channel: str, seq: int) -> tuple[_Channel | None, list[tuple[_Lane, int, QueuedMessage]]]:
        """Every current queued message of the entry ``seq``, with its lane and index there."""
        state = self._channels.get(channel)
        if state is None:
            return None, []
        found = [
            (lane, i, m) for lane in state.lanes.values() for i, m in enumerate(lane.queue)
            if m.entry_seq == seq and m.generation >= state.generation
        ]
        return state, found

    def _running(self, state: _Channel | None, seq: int) -> tuple[tuple[str, str], ...]:
        if state is None:
            return ()
        return tuple((agent, lane.turn.turn_id) for agent, lane in state.lanes.items()
                     if lane.turn is not None and lane.turn.entry == seq)

    def take_back(self, channel: str, seq: int) -> QueueEdit:
        """Take the entry ``seq``'s queued messages off their lanes, in this step: none of them
        starts a turn. One a turn already took is not taken back: ``RUNNING`` names the turn
        (a stop is what ends it). Nothing queued at all: ``NOT_QUEUED``."""
        state, found = self._edit_targets(channel, seq)
        running = self._running(state, seq)
        if state is None or not found:
            outcome = EditOutcome.RUNNING if running else EditOutcome.NOT_QUEUED
            return QueueEdit(channel, seq, "take_back", outcome, running=running,
                             generation=state.generation if state else 0)
        for lane, _, message in found:
            lane.queue.remove(message)
        self._mark(channel, state)
        return QueueEdit(channel, seq, "take_back", EditOutcome.DONE, tuple(m for _, _, m in found),
                         tuple(i for _, i, _ in found), running, state.generation)

    def move_first(self, channel: str, seq: int) -> QueueEdit:
        """Move the entry ``seq``'s queued messages to the head of their lanes (the next turn
        of each lane takes it). Outcomes as :meth:`take_back`'s."""
        state, found = self._edit_targets(channel, seq)
        running = self._running(state, seq)
        if state is None or not found:
            outcome = EditOutcome.RUNNING if running else EditOutcome.NOT_QUEUED
            return QueueEdit(channel, seq, "move_first", outcome, running=running,
                             generation=state.generation if state else 0)
        for lane, _, message in found:
            lane.queue.remove(message)
            # Ahead of every current message; stale ones a restart put back stay first (the
            # next take drops them).
            head = next((i for i, m in enumerate(lane.queue) if m.generation >= state.generation), len(lane.queue))
            lane.queue.insert(head, message)
        return QueueEdit(channel, seq, "move_first", EditOutcome.DONE, tuple(m for _, _, m in found),
                         tuple(i for _, i, _ in found), running, state.generation)

    def undo_edit(self, edit: QueueEdit) -> None:
        """Undo an edit whose record could not be stored: each message back at its place. A
        stop since dropped what was queued; a message taken back stays dropped with it."""
        state = self._channels.get(edit.channel)
        if state is None or edit.outcome is not EditOutcome.DONE:
            return
        stopped = state.generation != edit.generation
        for message, place in sorted(zip(edit.messages, edit.places, strict=True), key=lambda p: p[1]):
            lane = state.lane(message.agent)
            if message in lane.queue:
                lane.queue.remove(message)
            elif stopped or edit.action != "take_back":
                continue
            lane.queue.insert(min(place, len(lane.queue)), message)
        self._mark(edit.channel, state)

    # ------------------------------------------------------------ stops

    def stop(self, channel: str) -> StopDecision:
        """Stop one channel, every lane of it. Synchronous: the generation has moved when this returns."""
        state = self._chan(channel)
        if state.stopped:
            return StopDecision(
                channel=channel, generation=state.generation, repeat=True, stopped_turns=(), dropped=(),
                notice_due=False, notice_seq=state.notice_seq,
            )
        prior = (state.notice_seq, state.routing_rests)
        state.generation += 1
        state.stopped = True
        state.notice_seq = None
        state.routing_rests = True
        dropped = tuple(state.queued())
        by_lane = tuple((agent, tuple(lane.queue)) for agent, lane in state.lanes.items() if lane.queue)
        stopped_turns = []
        for agent, lane in state.lanes.items():
            lane.queue.clear()
            if lane.turn is not None:
                stopped_turns.append((agent, lane.turn.turn_id))
        self._mark(channel, state)
        return StopDecision(
            channel=channel, generation=state.generation, repeat=False, stopped_turns=tuple(stopped_turns),
            dropped=dropped, notice_due=True, notice_seq=None, prior_notice_seq=prior[0], prior_routing_rests=prior[1],
            dropped_by_lane=by_lane,
        )

    def abort_stop(self, decision: StopDecision) -> bool:
        """Undo a stop whose record could not be stored; False if a later stop superseded it.

        Exactly restores the channel: generation, repeat window, routing rest, notice seq, and
        every lane's dropped messages back at the head of its queue. Work begun since the stop
        (a message accepted, a turn taken) is re-stamped with the restored generation.
        """
        if decision.repeat:
            raise LedgerError(f"a repeat stop of {decision.channel!r} has nothing to undo")
        state = self._chan(decision.channel)
        if state.generation != decision.generation:
            return False
        restored = decision.generation - 1
        state.generation = restored
        state.stopped = False
        state.notice_seq = decision.prior_notice_seq
        # A human who spoke since has lifted the rest already; that stands.
        state.routing_rests = decision.prior_routing_rests and state.routing_rests
        back: dict[str, list[QueuedMessage]] = {agent: list(queue) for agent, queue in decision.dropped_by_lane}
        if not back:  # (a decision made without it: oldest first)
            for message in decision.dropped:
                back.setdefault(message.agent, []).append(message)
        for agent in {*back, *state.lanes}:
            lane = state.lane(agent)
            later = [replace(m, generation=restored) if m.generation > restored else m for m in lane.queue]
            lane.queue = deque([*back.get(agent, ()), *later])
            if lane.turn is not None and lane.turn.generation > restored:
                lane.turn.generation = restored
        self._mark(decision.channel, state)
        return True

    def interrupt(self, channel: str, agent: str) -> InterruptDecision:
        """A new message replaces the lane's work: its running turn is made stale and its queue
        dropped, in this step. A turn already stale (stopped, interrupted, silenced) is left to
        what made it so; the queue is dropped all the same (the new message goes first)."""
        state = self._chan(channel)
        lane = state.lane(agent)
        dropped = tuple(lane.queue)
        lane.queue.clear()
        self._mark(channel, state)
        turn = lane.turn
        if turn is None or self.is_stale(channel, turn.turn_id):
            return InterruptDecision(channel, agent, None, dropped)
        turn.interrupted = True
        return InterruptDecision(channel, agent, turn.turn_id, dropped)

    def abort_interrupt(self, decision: InterruptDecision) -> None:
        """Undo an interrupt whose record could not be stored: its turn runs on (if it is still
        the lane's and no stop has come since) and its dropped messages are queued again at the
        head of the lane, oldest first."""
        state = self._chan(decision.channel)
        lane = state.lane(decision.agent)
        if decision.turn_id is not None and lane.turn is not None and lane.turn.turn_id == decision.turn_id:
            lane.turn.interrupted = False
        kept = [m for m in decision.dropped if m.generation >= state.generation]  # (a stop since drops them)
        lane.queue = deque([*kept, *lane.queue])
        self._mark(decision.channel, state)

    def stop_all(self) -> list[StopDecision]:
        """Stop every channel that has work; idle channels are left alone."""
        return [self.stop(name) for name in list(self._channels) if self.is_busy(name)]

    def shut_down(self) -> ShutdownDecision:
        """The supervisor is closing: every current turn is silenced, nothing more starts.

        Unlike a stop, no generation moves and no queue is dropped: what was accepted runs
        after the restart. A silenced turn is stale to every question (``may_start``,
        ``keep_process``, ``keep_output``, ``end_turn``), so it keeps only its session id.
        A second call silences nothing more (no turn can begin in between).
        """
        self._shut_down = True
        silenced = []
        for name, state in self._channels.items():
            for lane in state.lanes.values():
                turn = lane.turn
                if turn is None or turn.silenced:
                    continue
                # A stopped turn is its stop's to end; an interrupted one, the shutdown's.
                if turn.generation == state.generation:
                    silenced.append((name, turn.turn_id))
                turn.silenced = True  # even so: should its stop be undone, it stays silenced
        return ShutdownDecision(tuple(silenced))

    def adopt(self, channel: str) -> None:
        """(A fleet host that has just taken the channel, its generation restored) messages
        it accepted while another host owned the channel were stamped with this host's
        stale view of the generation: they take the current one. Whether a stop of the other
        host dropped one is the store's to say (its row is gone: the turn's begin fails),
        not the seqs' (two hosts' clocks do not order them)."""
        state = self._channels.get(channel)
        if state is None:
            return
        for lane in state.lanes.values():
            lane.queue = deque(
                replace(m, generation=state.generation) if m.generation < state.generation else m for m in lane.queue
            )

    def forget_queue(self, channel: str, agent: str) -> None:
        """(A fleet) the lane's queued messages are another host's to run: not queued here."""
        state = self._channels.get(channel)
        if state is not None and agent in state.lanes:
            state.lanes[agent].queue.clear()
            self._mark(channel, state)

    def lose(self, channel: str) -> ShutdownDecision:
        """This host lost the channel's lease (a fleet): its current turns are silenced, as in
        a shutdown but for one channel, and its queue is forgotten here (the store keeps it:
        the channel's new owner runs it). No generation moves: nobody stopped anything."""
        state = self._channels.get(channel)
        if state is None:
            return ShutdownDecision(())
        silenced = []
        for lane in state.lanes.values():
            turn = lane.turn
            if turn is not None and not turn.silenced:
                silenced.append((channel, turn.turn_id))
                turn.silenced = True
            lane.queue.clear()
        self._mark(channel, state)
        return ShutdownDecision(tuple(silenced))

    def notice_seq(self, channel: str) -> int | None:
        """The seq of the notice stored for the channel's latest stop, once it is stored."""
        state = self._channels.get(channel)
        return state.notice_seq if state else None

    def notice_stored(self, channel: str, generation: int, seq: int) -> None:
        """Record the notice of the stop that moved the channel to ``generation``."""
        state = self._chan(channel)
        if state.generation == generation:
            state.notice_seq = seq

    # ------------------------------------------------------------ routing (contract 12)

    def may_route(self, channel: str, *, from_human: bool, turn_id: str | None = None) -> bool:
        """May a message be routed on to another agent? Human messages always may.

        An agent's message routes only while the channel does not rest and, when it comes
        from a turn (``turn_id``), only if that turn is not stale.
        """
        if from_human:
            return True
        state = self._channels.get(channel)
        if state and state.routing_rests:
            return False
        return turn_id is None or not self.is_stale(channel, turn_id)
