"""The stop ledger: the pure state machine behind the Stop button.

Theory of operation
-------------------

The ledger knows nothing of processes, sockets, files or Trio. It is fed events by one
driver (the supervisor) and answers each with a decision; the driver carries decisions out.
Every method is synchronous and runs to completion, so a decision and the state it was
made from can never be separated by another task.

Each channel has a **generation**, a counter only a stop moves. Everything is stamped
with the generation current when it entered: a message when it is accepted, a turn when
it takes its message off the queue. A turn is **stale** when its generation is older than
its channel's: a stop happened after it began, and nothing it does may reach the user any
more, except the session id it prints (so the next message resumes the conversation).

The rules, each a line of the stop contract (docs/stop-contract.md):

* ``stop(channel)`` moves that channel's generation and nothing else's (1, 2). It drops
  every queued message of the channel (3) and makes its current turn stale, whatever
  phase the turn is in (3, 5, 6).
* A message accepted after the stop carries the new generation and runs (4).
* ``may_start`` is asked at the point of no return; a stale turn gets ``False`` (5).
* ``keep_process`` answers whether a newly registered process may live (6).
* ``keep_output`` drops everything a stale turn says, except its session id (8).
* ``end_turn`` decides the todo nudge, and never nudges a stale turn (9).
* A stop is a **repeat** when no turn has begun in the channel since its previous stop:
  it does not move the generation and owes no notice (11). Otherwise it owes exactly one
  notice (10); ``notice_stored`` records it so a repeat can name it.
* ``stop_all()`` stops every channel that has work (a turn or a queued message); an idle
  channel has nothing to stop and gets no notice from a stop-all.
* After a stop, agent-to-agent routing in the channel rests until a human speaks (12):
  ``may_route`` answers for the router.
* A stop is on record in the ledger at once, but it is carried out only once its record
  (generation, dropped messages, cancelled plan) is durably stored (17). If that store
  fails, ``abort_stop(decision)`` puts the channel back exactly as the stop found it:
  the generation, the repeat window, the routing rest, and the dropped messages at the
  head of the queue, oldest first. Messages accepted while the record was being stored
  were stamped with the stop's generation; they are re-stamped with the restored one
  and stay queued behind the restored messages, and a turn begun in that window keeps
  running under the restored generation. A retried stop is then a real stop, not a
  repeat. If another stop has moved the generation since (it superseded this one, and
  dropped whatever this one would have), nothing is undone.

Violations of the driver's side of the protocol (ending a turn that is not running,
starting a second turn in a busy channel) raise :class:`LedgerError`: they are bugs.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace


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


@dataclass(frozen=True, slots=True)
class TurnTicket:
    """A turn that may begin preparing."""

    turn_id: str
    message: QueuedMessage
    generation: int


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
    stopped_turn: str | None
    """The turn made stale: cancel its scope and kill its processes."""
    dropped: tuple[QueuedMessage, ...]
    """Queued messages that will never run."""
    notice_due: bool
    """Post the notice once the stopped turn is torn down."""
    notice_seq: int | None
    """For a repeat: the notice already stored for the stop it repeats (None if pending)."""
    prior_notice_seq: int | None = None
    """What ``abort_stop`` restores: the notice seq the channel had before this stop."""
    prior_routing_rests: bool = False
    """What ``abort_stop`` restores: whether routing rested before this stop."""


@dataclass(frozen=True, slots=True)
class ShutdownDecision:
    """What a shutdown does: end these turns (not already stopped) as interrupted by it."""

    turns: tuple[tuple[str, str], ...]
    """``(channel, turn_id)`` of every turn silenced: cancel its scope, interrupt its group."""


@dataclass(frozen=True, slots=True)
class EndDecision:
    """What follows a turn's end."""

    nudge: bool
    """Queue a "you have N remaining tasks" message for the agent."""
    stale: bool
    """The turn was stopped; its leftovers are discarded."""


@dataclass(slots=True)
class _Turn:
    turn_id: str
    generation: int
    phase: Phase
    nudge: bool
    silenced: bool = False
    """Ended by a shutdown: stale like a stopped turn, though the generation stays."""


@dataclass(slots=True)
class _Channel:
    generation: int = 0
    queue: deque[QueuedMessage] = field(default_factory=deque)
    turn: _Turn | None = None
    stopped: bool = False
    """A stop happened and no turn has begun since: the next stop is a repeat."""
    notice_seq: int | None = None
    nudges_in_row: int = 0
    routing_rests: bool = False


class StopLedger:
    """Per-channel stop generations, queues and turns; decisions only, no I/O."""

    def __init__(self, *, max_nudges: int = 3) -> None:
        if max_nudges < 0:
            raise ValueError("max_nudges must be >= 0")
        self.max_nudges = max_nudges
        self._channels: dict[str, _Channel] = {}
        self._shut_down = False

    # ------------------------------------------------------------ queries

    def _chan(self, channel: str) -> _Channel:
        state = self._channels.get(channel)
        if state is None:
            state = self._channels[channel] = _Channel()
        return state

    def generation(self, channel: str) -> int:
        """The channel's current stop generation."""
        state = self._channels.get(channel)
        return state.generation if state else 0

    def channels(self) -> Iterable[str]:
        """Every channel the ledger has seen."""
        return self._channels.keys()

    def queued(self, channel: str) -> tuple[QueuedMessage, ...]:
        """The channel's queue, oldest first."""
        state = self._channels.get(channel)
        return tuple(state.queue) if state else ()

    def current_turn(self, channel: str) -> str | None:
        """The id of the turn the channel is running or preparing, if any."""
        state = self._channels.get(channel)
        return state.turn.turn_id if state and state.turn else None

    def turn_phase(self, channel: str) -> Phase | None:
        """The phase of the channel's current turn, if any."""
        state = self._channels.get(channel)
        return state.turn.phase if state and state.turn else None

    def is_busy(self, channel: str) -> bool:
        """The channel has a turn or a queued message."""
        state = self._channels.get(channel)
        return bool(state and (state.turn or state.queue))

    def is_stale(self, channel: str, turn_id: str) -> bool:
        """A stop has happened since this turn began (or the turn is not the current one)."""
        state = self._channels.get(channel)
        if state is None or state.turn is None or state.turn.turn_id != turn_id:
            return True
        return state.turn.silenced or state.turn.generation < state.generation

    # ------------------------------------------------------------ messages

    def restore(self, channel: str, generation: int) -> None:
        """Set a channel's generation from the store after a restart (never moves it back)."""
        state = self._chan(channel)
        state.generation = max(state.generation, generation)

    def accept(
        self, channel: str, message_id: int, *, human: bool, nudge: bool = False, payload: object = None
    ) -> QueuedMessage:
        """Queue a message under the channel's current generation. A human lifts the routing rest."""
        state = self._chan(channel)
        message = QueuedMessage(message_id, state.generation, human, nudge, payload)
        state.queue.append(message)
        if human:
            state.routing_rests = False
        return message

    def requeue(self, channel: str, message: QueuedMessage) -> None:
        """Put back a message restored from the store, with the generation it was accepted under."""
        self._chan(channel).queue.append(message)

    def take(self, channel: str, turn_id: str) -> Take:
        """Begin the next turn: pop the oldest current message; stale ones are dropped."""
        state = self._chan(channel)
        if state.turn is not None:
            raise LedgerError(f"channel {channel!r} already runs turn {state.turn.turn_id!r}")
        if self._shut_down:
            return Take(None, ())
        dropped = []
        while state.queue:
            message = state.queue.popleft()
            if message.generation < state.generation:
                dropped.append(message)
                continue
            state.turn = _Turn(turn_id, state.generation, Phase.PREPARING, message.nudge)
            state.stopped = False
            if message.human:
                state.nudges_in_row = 0
            return Take(TurnTicket(turn_id, message, state.generation), tuple(dropped))
        return Take(None, tuple(dropped))

    # ------------------------------------------------------------ a turn's life

    def may_start(self, channel: str, turn_id: str) -> bool:
        """Asked at the point of no return. True moves the turn to STARTED."""
        if self.is_stale(channel, turn_id):
            return False
        turn = self._channels[channel].turn
        assert turn is not None
        turn.phase = Phase.STARTED
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
        """The turn is over and torn down; decide whether to nudge it on."""
        state = self._channels.get(channel)
        if state is None or state.turn is None or state.turn.turn_id != turn_id:
            raise LedgerError(f"turn {turn_id!r} is not running in channel {channel!r}")
        turn = state.turn
        state.turn = None
        stale = turn.silenced or turn.generation < state.generation
        nudge = (
            not stale
            and ok
            and unfinished_todos > 0
            and state.nudges_in_row < (self.max_nudges if max_nudges is None else max_nudges)
            and not state.queue
        )
        if nudge:
            state.nudges_in_row += 1
        elif not turn.nudge:
            state.nudges_in_row = 0
        return EndDecision(nudge=nudge, stale=stale)

    # ------------------------------------------------------------ stops

    def stop(self, channel: str) -> StopDecision:
        """Stop one channel. Synchronous: the generation has moved when this returns."""
        state = self._chan(channel)
        if state.stopped:
            return StopDecision(
                channel=channel, generation=state.generation, repeat=True, stopped_turn=None, dropped=(),
                notice_due=False, notice_seq=state.notice_seq,
            )
        prior = (state.notice_seq, state.routing_rests)
        state.generation += 1
        state.stopped = True
        state.notice_seq = None
        state.routing_rests = True
        dropped = tuple(state.queue)
        state.queue.clear()
        stopped_turn = state.turn.turn_id if state.turn else None
        return StopDecision(
            channel=channel, generation=state.generation, repeat=False, stopped_turn=stopped_turn, dropped=dropped,
            notice_due=True, notice_seq=None, prior_notice_seq=prior[0], prior_routing_rests=prior[1],
        )

    def abort_stop(self, decision: StopDecision) -> bool:
        """Undo a stop whose record could not be stored; False if a later stop superseded it.

        Exactly restores the channel: generation, repeat window, routing rest, notice seq, and
        the dropped messages back at the head of the queue. Work begun since the stop (a
        message accepted, a turn taken) is re-stamped with the restored generation.
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
        later = [replace(m, generation=restored) if m.generation > restored else m for m in state.queue]
        state.queue = deque([*decision.dropped, *later])
        if state.turn is not None and state.turn.generation > restored:
            state.turn.generation = restored
        return True

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
            turn = state.turn
            if turn is None or turn.silenced:
                continue
            if turn.generation == state.generation:  # a stopped turn is its stop's to end
                silenced.append((name, turn.turn_id))
            turn.silenced = True  # even so: should its stop be undone, it stays silenced
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

    def may_route(self, channel: str, *, from_human: bool) -> bool:
        """May a message be routed on to another agent? Human messages always may."""
        if from_human:
            return True
        state = self._channels.get(channel)
        return not (state and state.routing_rests)
