"""Points where a test parks a turn, and the spawner's signature.

Production code passes no hooks, and then no extra checkpoint exists. Tests import
:class:`Hooks` from :mod:`supervisor.testing`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import trio

    from ..core.admission import MemoryReading
    from .cgroup import TurnCgroup

TurnHook = Callable[[str, str], Awaitable[None]]
"""``async (channel, turn_id) -> None``, awaited at a point of a turn's life."""


class Spawner(Protocol):
    """Starts a turn's process: :func:`supervisor.procs.tree.spawn`, or a test's wrapper of it."""

    def __call__(
        self,
        argv: tuple[str, ...],
        *,
        env: Mapping[str, str],
        cwd: str,
        stdin_pipe: bool,
        cgroup: TurnCgroup | None = None,
        sandbox: Sequence[str] = (),
    ) -> Awaitable[trio.Process]:
        """Start ``argv``; the caller registers the process before its next checkpoint."""
        ...


@dataclass(frozen=True, slots=True)
class Hooks:
    """Points where a test can park a turn to drive a race deterministically.

    ``admitted``, ``took`` and ``preparing`` are awaited at that point; ``spawn`` replaces the
    spawner, ``memory`` the memory probe.
    """

    admitted: TurnHook | None = None
    """``(channel, agent)``: after admission granted the lane a slot, before it takes its message."""
    took: TurnHook | None = None
    """After the worker took a message off the queue, before the turn is built."""
    preparing: TurnHook | None = None
    """Inside the turn, after the launch is built, right before the point of no return."""
    spawn: Spawner | None = None
    """Replaces :func:`supervisor.procs.tree.spawn` (same signature)."""
    memory: Callable[[float], MemoryReading | None] | None = None
    """Replaces the memory probe (:func:`supervisor.procs.memory.read_memory`): a simulated reading."""
