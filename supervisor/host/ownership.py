"""Who runs a channel: the port the lanes and the stopper ask, and the single host's answer.

Theory of operation
-------------------

The lanes and the stopper never ask whether corral runs alone or in a fleet: they ask their
:class:`Ownership`, at five moments —

* before each turn (:meth:`Ownership.take`): does this host run the channel now? Alone:
  always. In a fleet: while it holds the channel's lease (acquired, or taken over from the
  store, first), and only once the lease of an owner it took the channel from by force has
  run out;
* for every write of a turn (:meth:`Ownership.fence`): the fencing token it carries (alone:
  none);
* at the point of no return (:meth:`Ownership.turn_ledger`): the ledger's answer, and in a
  fleet the lease's too;
* for a stop (:meth:`Ownership.stop_elsewhere`): a channel another host runs is stopped by
  that host (alone: never), and a stop here is not done while a host it took the channel
  from is silent (:meth:`Ownership.unconfirmed`);
* around the supervisor's life (:meth:`Ownership.serve`, :meth:`Ownership.close`): a fleet's
  heartbeat, watchdog and notices; its leases given back.

:class:`SingleHost` is the answer of corral alone; a fleet's is
:class:`supervisor.host.fleet_ownership.FleetOwnership`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import trio

from ..core.ledger import StopLedger
from ..turns.ports import TurnLedger

if TYPE_CHECKING:
    from ..core.results import StopResult
    from ..fleet.fleet import Fleet


class Ownership(Protocol):
    """Who runs a channel (see the module's theory)."""

    @property
    def fleet(self) -> Fleet | None:
        """This host's leases, in a fleet."""
        ...

    async def take(self, channel: str, agent: str) -> bool:
        """Before a turn of ``agent``: may this host run the channel's next turn? (False: another host runs it.)"""
        ...

    def fence(self, channel: str) -> int | None:
        """The fencing token this host last held for the channel (kept after the lease is lost)."""
        ...

    def turn_ledger(self, ledger: StopLedger) -> TurnLedger:
        """The ledger as a turn asks it."""
        ...

    async def stop_elsewhere(self, channel: str, started: float, cpu: float) -> StopResult | None:
        """A stop of a channel another host runs, carried out there (None: it is this host's to stop)."""
        ...

    def unconfirmed(self, channel: str) -> str | None:
        """Why a stop of the channel here cannot be called done (a silent host), if so."""
        ...

    def status(self) -> dict[str, Any] | None:
        """What ``status`` shows of the fleet (None: no fleet)."""
        ...

    async def serve(self, nursery: trio.Nursery) -> None:
        """Start what runs beside the supervisor (a fleet's heartbeat and notices)."""
        ...

    async def close(self) -> None:
        """At the end: give back what this host holds."""
        ...


class SingleHost:
    """corral alone: this host runs every channel, and no write is fenced."""

    fleet: Fleet | None = None

    async def take(self, channel: str, agent: str) -> bool:
        """Always this host's."""
        return True

    def fence(self, channel: str) -> int | None:
        """No fencing alone."""
        return None

    def turn_ledger(self, ledger: StopLedger) -> TurnLedger:
        """The ledger itself."""
        return ledger

    async def stop_elsewhere(self, channel: str, started: float, cpu: float) -> StopResult | None:
        """Never elsewhere."""
        return None

    def unconfirmed(self, channel: str) -> str | None:
        """No other host."""
        return None

    def status(self) -> dict[str, Any] | None:
        """No fleet."""
        return None

    async def serve(self, nursery: trio.Nursery) -> None:
        """Nothing runs beside."""

    async def close(self) -> None:
        """Nothing held."""
