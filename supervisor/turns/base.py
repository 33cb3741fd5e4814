"""The skeleton every turn runs on, whatever runs the agent.

Theory of operation
-------------------

A turn is one agent handling one message: *prepare* (folders, launch), *start* (the point
of no return — the ledger is asked, then the spawn, the stdin write or the prompt follows
with no checkpoint between), *stream* (the agent's events through the pure
:class:`~supervisor.core.account.TurnAccount` into the store), *finish* (the shielded
teardown). :class:`BaseTurn` writes what every kind shares once:

* :meth:`BaseTurn.run`: the cancel scope the supervisor owns (a stop, a lost lease or a
  shutdown cancels it), the turn's own failures worded into its outcome (never raised), and
  the teardown, shielded, in ``finally``;
* the teardown's order: end the agent's processes (the kind's :meth:`BaseTurn._end`), close
  the text run, the last words unless the turn was silenced, then the line of what it spent
  (:func:`~supervisor.core.usage.usage_entry`, where its CLI reported usage), wait for its last write;
* the request an adapter builds the launch from, the environment (scrubbed, the markers
  last), the sandbox prefix;
* every write: the ledger decides (``keep_output``, ``is_stale``) and the write is
  submitted in the same step, no checkpoint between;
* :meth:`BaseTurn.steer`: a kind that cannot take a message mid-turn says so, and the
  message is queued; one that can (a CLI whose adapter has ``steer``) writes it to the
  agent with the same rule as its start — the ledger asked right before the first byte.

A kind says only how it starts, streams and ends: :class:`~supervisor.turns.process.Turn`
(a CLI process per turn, stdout parsed line by line) and
:class:`~supervisor.turns.acp.AcpTurn` (a prompt to a persistent ACP agent).
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import trio

from adapters import Adapter, Event, Launch, ToolUse, TurnRequest, Usage, get_adapter

from ..config.settings import AgentConfig
from ..core.account import Effect, Post, SavePlan, SaveSession, ShowDraft, TurnAccount
from ..core.budget import DEFAULT_CURRENCY, NO_LIMITS, BudgetSpent, spent, turn_cost
from ..core.daily import utc_day
from ..core.ledger import OutputKind, TurnTicket
from ..core.login import login_help
from ..core.text import shown
from ..core.usage import TurnUsage, turn_record, usage_entry
from ..procs.covers import replaced_text
from ..procs.files import CredentialsUnreadable
from ..procs.sandbox import Network, NotStartable, SandboxRefused, TurnGrants, detachable
from ..procs.tree import STORE_MARKER, ProcessTree, agent_environment
from ..store.store import Draft, Pending, StoreError
from .ports import TurnLimit, TurnOutcome, TurnPorts

if TYPE_CHECKING:
    from ..net.proxy import TurnNetwork

log = logging.getLogger("corral.turn")



def start_failure(agent: AgentConfig, exc: OSError) -> str:
    """Why a turn's CLI could not start, naming the path that failed and the fix.

    An ``OSError`` from the spawn (the program gone since the config was checked, a folder
    missing) carries the path it was about; without one, the agent's program is the suspect.
    """
    if exc.errno in (errno.EAGAIN, errno.ENOMEM):
        # Not a missing program: the kernel refused a new process (the user's process limit,
        # RLIMIT_NPROC, or memory) — often another turn's processes using it all up.
        return (f"could not start {agent.name}: the system refused a new process ({exc.strerror or exc}): "
                "this user's process limit (ulimit -u) or memory is used up, often by another turn's "
                "processes — fix: stop the channel whose turn is forking (corral status shows what runs), "
                "and keep pids_max / memory_max set for every agent (their defaults bound each turn)")
    path = exc.filename or (agent.command[0] if agent.command else None)
    what = f"{path}: {exc.strerror or exc}" if path else f"{exc.strerror or exc}"
    install = get_adapter(agent.adapter).install
    how = f"install it there ({install})" if install else "install it there"
    return (f"could not start {agent.name}: {what} — fix: {how}, or set command = [\"/path/to/it\"]"
            f" in [agents.{agent.name}]")

class BaseTurn:
    """What every kind of turn shares (see the module's theory). Created and driven by the supervisor."""

    own_errors: ClassVar[tuple[type[Exception], ...]] = ()
    """A kind's own failures, worded ``"AGENT: why"`` in the outcome (not raised)."""

    def __init__(self, ports: TurnPorts, channel: str, ticket: TurnTicket, agent: AgentConfig, prompt: str) -> None:
        self.ports = ports
        self.channel = channel
        self.ticket = ticket
        self.turn_id = ticket.turn_id
        self.agent = agent
        self.adapter: Adapter = get_adapter(agent.adapter)
        self.prompt = prompt
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.outcome = TurnOutcome()
        self.started_at = time.time()
        self.stop_reason: str | None = None
        """'user' or 'shutdown' once the supervisor has stopped this turn."""
        self.cwd: str | None = None
        """The working folder, once prepared (it is created then)."""
        self.ended: str | None = None
        self._account = TurnAccount(self.author, self.turn_id, login_help=login_help(agent.name, agent.adapter))
        self._limited = False
        """A stall or turn timeout ended the turn: from then on only corral's line is stored."""
        self._early: TurnLimit | None = None
        """Why corral ended the turn from outside it (a cover replaced on the host)."""
        self._early_scope = trio.CancelScope()
        self._covered: tuple[str, ...] = ()
        """The covers of its sandbox a replacement on the host would detach."""
        self._covers_token: object | None = None
        self._last: Pending | None = None
        self._net: TurnNetwork | None = None
        """The turn's network under a policy (its namespace, served by the proxy), once opened."""
        self._draft: ShowDraft | None = None
        """The open run's latest draft, not yet shown (a kind that shows each as it comes keeps none)."""
        budgets = ports.budgets
        self._limits = budgets.limits(channel, agent.name) if budgets is not None else NO_LIMITS
        """What this turn may spend (the tightest of its agent's, channel's and ``[server]``'s)."""
        self.spent: BudgetSpent | None = None
        """The budget that ran out, once one has (the turn is then stopped)."""

    # ------------------------------------------------------------ what the supervisor reads

    @property
    def author(self) -> str:
        """Who the turn's entries are by."""
        return f"agent:{self.agent.name}"

    @property
    def generation(self) -> int:
        """The generation the turn began under."""
        return self.ticket.generation

    @property
    def stop_grace(self) -> float:
        """How long a stopped turn may take to end before its stop calls itself failed."""
        return self.agent.limits.stop_grace

    @property
    def tree(self) -> ProcessTree | None:
        """The process tree the turn runs in (None before its start)."""
        return None

    @property
    def own_tree(self) -> ProcessTree | None:
        """The tree a stop may end together with other turns' (None: none of its own)."""
        return None

    async def steer(self, text: str) -> str | None:
        """This kind of turn takes no message mid-turn (a kind that can overrides this)."""
        return f"{self.agent.name} cannot take a message mid-turn"

    # ------------------------------------------------------------ writes

    def _silenced(self) -> bool:
        """Stopped by a user or by shutdown (the ledger says): nothing more of it may be stored."""
        return self.ports.ledger.is_stale(self.channel, self.turn_id)

    def _carry_out(self, effects: list[Effect]) -> None:
        """Submit the effects' writes; no checkpoint, so the ledger's answer still holds."""
        store = self.ports.store
        for effect in effects:
            if isinstance(effect, Post):
                self._post(effect.kind, effect.text, dict(effect.meta) if effect.meta is not None else None)
                self._posted(effect)
            elif isinstance(effect, SaveSession):
                if self.ports.ledger.keep_output(self.channel, self.turn_id, OutputKind.SESSION):
                    store.save_session(self.channel, self.agent.name, effect.session_id, self._cwd())
            elif isinstance(effect, SavePlan):
                store.save_todos(self.channel, self.agent.name, effect.items)
            elif isinstance(effect, ShowDraft):
                self._drafted(effect)
            else:
                log.warning(  # (an agent's line: shown, never obeyed, in the log)
                    "[%s %s] unparsed line (%s): %s", self.channel, self.turn_id,
                    shown(effect.reason, lines=False), shown(effect.line[:200], lines=False),
                )

    def _post(self, kind: str, text: str, meta: dict[str, object] | None = None) -> None:
        """Submit an entry unless the turn is stale (ledger decides, no checkpoint before submit)."""
        if not self.ports.ledger.keep_output(self.channel, self.turn_id, OutputKind.OTHER):
            return
        self._last = self.ports.store.submit_entry(
            self.channel, self.author, kind, text, turn=self.turn_id, generation=self.generation, meta=meta
        )

    def _posted(self, post: Post) -> None:
        """A kind's step after an entry is submitted (none by default)."""

    def _drafted(self, draft: ShowDraft) -> None:
        """A draft of the open run: shown as it comes (a kind may hold it, see :meth:`_show_draft`)."""
        self._show_draft(draft)

    def _show_draft(self, draft: ShowDraft) -> None:
        """Show a draft to the channel's followers unless the turn is stale (nothing is stored)."""
        if self.ports.ledger.keep_output(self.channel, self.turn_id, OutputKind.OTHER):
            self.ports.store.show_draft(
                Draft(self.channel, self.author, self.turn_id, draft.draft, draft.text, time.time())
            )

    def usage_so_far(self) -> TurnUsage:
        """What the turn has spent so far, as its CLI has reported it (``status`` shows it)."""
        return self._account.meter.snapshot(time.time() - self.started_at)

    def cut_off(self, reason: str) -> None:
        """Save the open run of text as the stop (or shutdown) decision found it, marked as cut
        off by ``reason``: called in the step that decides, before the notice. Not asked of the
        ledger, which has just silenced the turn: this entry is the decision's own."""
        post = self._account.cut_off(reason)
        if post is None:
            return
        self._draft = None
        self._last = self.ports.store.submit_entry(
            self.channel, self.author, post.kind, post.text, turn=self.turn_id, generation=self.generation,
            meta=dict(post.meta) if post.meta is not None else None,
        )

    def _handle(self, event: Event) -> None:
        """Decide what the event adds (pure), then carry it out; after a usage report or a tool
        call, the budgets are checked in the same step (see :meth:`_check_budget`)."""
        self._carry_out(
            self._account.on_event(event, silenced=self._silenced() or self._limited, now=trio.current_time())
        )
        if isinstance(event, Usage | ToolUse) and self._limits.any:
            self._check_budget()

    def _check_budget(self) -> None:
        """A budget past its limit stops the turn: the ledger's stop is decided (and its record
        submitted) in this step, with no checkpoint since the report that spent it; from then
        on nothing of the turn is kept, and the stop kills its tree once its record is stored."""
        budgets = self.ports.budgets
        if budgets is None or self.spent is not None or self._silenced():
            return
        decision = spent(self._limits, self._account.meter.snapshot(), budgets.prices)
        if decision is not None:
            self.spent = decision
            budgets.spent(self.channel, self.turn_id, decision)

    def _flush_text(self) -> None:
        self._carry_out(self._account.close_text(silenced=self._silenced() or self._limited))

    def _cwd(self) -> str:
        assert self.cwd is not None, "a turn's output comes only once it is prepared"
        return self.cwd

    # ------------------------------------------------------------ the turn

    async def run(self, session_id: str | None) -> TurnOutcome:
        """Run the turn to its end; never raises for the turn's own failures."""
        try:
            with self.scope:
                refused = self.ports.refusal() if self.ports.refusal is not None else None
                if refused is not None:
                    raise NotStartable(refused)
                with self._early_scope:
                    await self._prepare_and_stream(session_id)
                if self._early is not None:
                    raise self._early
        except TurnLimit as exc:
            # corral ended it: what the CLI says on its way out ("Request interrupted by user")
            # would tell the wrong story, so only corral's own line is stored (the session id
            # is still kept, as after a stop).
            self._flush_text()  # what it said before the limit stands
            self._limited = True
            self.outcome.error = str(exc)
        except StoreError as exc:
            self.outcome.error = f"could not store the turn's output: {exc}"
        except self.own_errors as exc:
            self.outcome.error = f"{self.agent.name}: {exc}"
        except (SandboxRefused, NotStartable, CredentialsUnreadable) as exc:
            self.outcome.error = f"could not start {self.agent.name}: {exc}"
        except OSError as exc:
            self.outcome.error = start_failure(self.agent, exc)
        finally:
            with trio.CancelScope(shield=True):
                await self._teardown()
            if self._covers_token is not None and self.ports.covers is not None:
                self.ports.covers.unregister(self._covers_token)
        return self.outcome

    async def _prepare_and_stream(self, session_id: str | None) -> None:
        """The kind's *prepare*, *start* and *stream*."""
        raise NotImplementedError

    async def _end(self) -> None:
        """The kind's end of the agent's processes (shielded): a stop's kill, a normal
        turn's sweep, and the events that end brings."""
        raise NotImplementedError

    async def _teardown(self) -> None:
        """End the processes, drop or keep leftovers, store the last words. Shielded; the
        same order every time."""
        self.outcome.stopped = self._silenced()
        try:
            try:
                await self._end()
            finally:
                if self._net is not None:  # after its processes: their connections end with them
                    await self._net.aclose()
            self._flush_text()
            self.outcome.stale_session = self._account.stale_session
            if not self._silenced():
                # The turn's last words: its final answer or the reason it failed.
                words = self._account.last_words(self.outcome.error)
                self._carry_out(words.effects)
                self.outcome.ok = words.ok
                self.outcome.error = words.error
                self._tally()
                if not self.outcome.stale_session:  # (retried without its session: that turn ends it)
                    self._post_usage()
            if self._last is not None:
                try:
                    await self._last.committed()
                except StoreError as exc:
                    self.outcome.error = self.outcome.error or f"could not store the turn's output: {exc}"
        except StoreError as exc:
            self.outcome.error = self.outcome.error or f"could not store the turn's output: {exc}"
        finally:
            if self.outcome.record is None:
                self._tally()
            self.done.set()

    def _tally(self) -> None:
        """What the turn spent, once its CLI's output is all read: its usage, and its record
        priced as it is stored (``turn_usage``) and shown (its end entry, a stop's)."""
        usage = self.outcome.usage = self._account.usage(wall_seconds=time.time() - self.started_at)
        budgets = self.ports.budgets
        prices = budgets.prices if budgets is not None else {}
        currency = budgets.currency(self.channel, self.agent.name) if budgets and budgets.currency else DEFAULT_CURRENCY
        self.outcome.record = turn_record(
            self.turn_id, self.channel, self.agent.name, utc_day(), usage, cost=turn_cost(usage, prices, currency),
            currency=currency, budget=self.spent.budget if self.spent is not None else None,
        )

    def _post_usage(self) -> None:
        """The entry that ends a turn that ended on its own and whose CLI reported its usage:
        "AGENT used LINE" (:func:`~supervisor.core.usage.usage_entry`), after its last words.
        A stopped turn's is the stop's, before its notice (``host.stopper``)."""
        assert self.outcome.record is not None
        made = usage_entry(self.outcome.record, self.outcome.usage)
        if made is not None and self.ports.ledger.keep_output(self.channel, self.turn_id, OutputKind.OTHER):
            text, meta = made
            # The row first: a reader the entry wakes (the dashboard's spend) finds the turn summed.
            self.ports.store.record_usage(self.outcome.record)
            self.outcome.stored = True
            self._last = self.ports.store.submit_entry(
                self.channel, "system", "status", text, turn=self.turn_id, generation=self.generation, meta=meta,
            )

    # ------------------------------------------------------------ launch inputs

    def _request(self, session_id: str | None, prompt: str | None = None) -> TurnRequest:
        """What the adapter builds the launch from (the working folder is created here);
        ``prompt``: the turn's own unless given (a persistent agent's launch has none)."""
        places = self.ports.places
        home = places.agent_home(self.agent.name, self.channel)
        self.cwd = str(places.channel_cwd(self.channel, self.agent))
        return TurnRequest(
            prompt=self.prompt if prompt is None else prompt,
            channel=self.channel,
            turn_id=self.turn_id,
            agent=self.agent.name,
            command=self.agent.command or self.adapter.default_command,
            args=self.agent.args,
            session_id=session_id,
            model=self.agent.model,
            cwd=self.cwd,
            home=str(home),
            options=dict(self.agent.options),
            unattended=self.agent.unattended,
            env=dict(self.agent.env),
        )

    def _extra_env(self) -> Mapping[str, str]:
        """What the environment adds after the launch's: the agent's ``env``, the store's marker."""
        return {**self.agent.env, STORE_MARKER: self.ports.store.store_id}

    def _environment(self, launch: Launch, marker: str) -> dict[str, str]:
        home = self.ports.places.agent_home(self.agent.name, self.channel)
        return agent_environment(launch.env, home=str(home), marker=marker, extra=self._extra_env())

    async def _open_network(self) -> Mapping[str, str]:
        """Under a network policy, sandboxed: the turn's namespace and proxy (closed by the
        teardown), and the proxy variables for its environment; else nothing."""
        network = self.ports.network
        if not self.agent.network.proxied or not self.ports.sandbox.active:
            return {}
        if network is None:
            raise SandboxRefused(f"network = {self.agent.network.label!r} needs the proxy, which is not running")
        self._net = await network.open(self.turn_id, self.agent.network)
        return self._net.env

    def _sandbox(self, launch: Launch, home: str, net: TurnNetwork | None = None) -> tuple[str, ...]:
        """The argv the agent starts behind (empty: no sandbox); its login files read-only, its
        program found on the PATH it gets, as the kernel will run it; in ``net``'s namespace
        (the turn's own unless given), if it has one."""
        net = net or self._net
        policy = self.agent.network
        if policy.proxied and net is None and self.ports.sandbox.active:
            raise SandboxRefused(f"network = {policy.label!r} needs the turn's network opened first")
        mode: Network = "proxied" if net is not None else "none" if policy.kind == "none" else "host"
        sandbox = self.ports.sandbox
        reach = sandbox.reach(TurnGrants(
            self.agent.name, cwd=launch.cwd, home=home, writable=self.agent.sandbox_write,
            hidden=self.agent.sandbox_hide, network=mode,
            installation=(*(self.agent.command or self.adapter.default_command), *self.agent.args),
            read_only=tuple(Path(home) / rel for _, rel in self.agent.credentials),
            shown=self.agent.sandbox_show, program=launch.argv[0],
            path_env=self._environment(launch, "").get("PATH"),
        ))
        if reach is None:
            return ()
        self._covered = detachable(reach)
        return sandbox.argv(reach, net.entering if net is not None else ())

    def _watch_covers(self) -> None:
        """Register the sandbox's detachable covers, before the spawn (see :mod:`..procs.covers`)."""
        watch = self.ports.covers
        if watch is not None and self._covered and self._covers_token is None:
            self._covers_token = watch.register(self._covered, self._cover_replaced)

    def _cover_replaced(self, path: str) -> None:
        """A covered path was replaced on the host: the turn ends at once, in corral's words."""
        log.warning("[%s %s] ending: %s was replaced on the host while the turn ran (its cover detached)",
                    self.channel, self.turn_id, shown(path, lines=False))
        self.end_early(replaced_text(path))

    def end_early(self, why: str) -> None:
        """End the turn from outside it (a replaced cover, a disk below its reserve): its tree
        is killed in this step — no checkpoint from the caller's decision to the signal — and
        the turn ends with ``why`` as its last words."""
        if self._early is not None or self.done.is_set():
            return
        self._early = TurnLimit(why)
        tree = self.tree
        if tree is not None:
            tree.kill_group()
        self._early_scope.cancel()
