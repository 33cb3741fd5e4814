"""The ``corral`` command line.

Exit status: 0 success; 1 an error (bad config, a failed stop, an API error); 2 bad usage;
3 no daemon answers (or it went away); 4 ``corral wait`` timed out.

Client commands import only the standard library and click: Trio, psutil and hypercorn are
imported inside the commands that run a supervisor (``run``, ``demo``), so an emergency
``corral stop`` starts fast and reads nothing of the config but ``[server]``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from .core.text import shown
from .serve.routes import DEFAULT_AUTHOR, DEFAULT_STATUS_PAGE, MAX_LIMIT, MAX_STATUS_PAGE

if TYPE_CHECKING:
    from .config.settings import Config, Problem, ServerConfig
    from .serve.client import Client

#: ``config.settings.DEFAULT_CONFIG_NAME``, not imported from there so that ``--version`` stays fast
#: (a test keeps them equal).
DEFAULT_CONFIG_NAME = "corral.toml"

EXIT_ERROR = 1
EXIT_NO_DAEMON = 3
EXIT_TIMEOUT = 4
EXIT_UNSANDBOXED = 5
"""``check``: the config is valid, but turns would run without a sandbox (``sandbox = "auto"``
on a machine that cannot sandbox): not "ok" to a script that gates on it."""


def _fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    click.echo(f"corral: {message}", err=True)
    sys.exit(code)


def _problems(problems: list[Problem], file: str, consequence: str = "nothing was started") -> NoReturn:
    for problem in problems:
        click.echo(str(problem), err=True)
    _fail(f"{len(problems)} problem(s) in {file}; {consequence}")


def _load(file: str) -> Config:
    from .config.settings import ConfigError, load_config

    try:
        return load_config(file)
    except ConfigError as exc:
        _problems(exc.problems, file)


class _Context:
    def __init__(self, socket: str | None, config: str | None, as_json: bool) -> None:
        self.socket = socket
        self.config = config
        self.json = as_json

    def named_config(self, given: str | None = None) -> str | None:
        """The config file named: the command's ``-c``, else ``corral -c``, else $CORRAL_CONFIG."""
        return given or self.config or os.environ.get("CORRAL_CONFIG")

    def config_file(self, given: str | None = None) -> str:
        """The config file to read: the one named, else ./corral.toml."""
        return self.named_config(given) or DEFAULT_CONFIG_NAME

    def start_hint(self) -> str:
        """How to start the daemon this command looked for: with the config it was given."""
        return f"start one with `corral run -c {self.config_file()}`"

    def client(self) -> Client:
        from .serve.client import Client

        path = self.socket or os.environ.get("CORRAL_SOCKET")
        if path is None:
            if self.named_config() is None and not Path(DEFAULT_CONFIG_NAME).exists():
                _fail(
                    f"no daemon to talk to: there is no ./{DEFAULT_CONFIG_NAME}; pass -c FILE, --socket PATH "
                    "or set CORRAL_SOCKET (start one with `corral run -c FILE`)",
                    EXIT_NO_DAEMON,
                )
            from .config.settings import ConfigError, load_server_config

            file = self.config_file()
            try:
                path = str(load_server_config(file).socket)  # only [server]: agents never block a client
            except ConfigError as exc:
                _problems(exc.problems, file, "no daemon was asked")
        return Client(path)


T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def _call(ctx: _Context, fn: Callable[[Client], T], client: Client | None = None) -> T:
    from .serve.client import APIError, DaemonGone, DaemonUnavailable

    client = client or ctx.client()
    try:
        return fn(client)
    except DaemonGone as exc:
        _fail(f"{exc}; nothing more will come", EXIT_NO_DAEMON)
    except DaemonUnavailable:
        _fail(f"no daemon is running on {client.where}; {ctx.start_hint()}", EXIT_NO_DAEMON)
    except APIError as exc:
        # The HTTP status and the API's code are for programs (--json); a person reads the message.
        if ctx.json:
            _print_json({"ok": False, "error": {"status": exc.status, "code": exc.code, "message": exc.message}})
            _fail(f"{exc.message} ({exc.status} {exc.code})")
        _fail(exc.message)
    finally:
        client.close()


def _print_json(value: Any) -> None:
    # JSON escapes C0 controls itself; C1 ones (and DEL), which a terminal may obey too, are
    # escaped here (they can only stand inside strings, where \u00XX means the same).
    click.echo(_C1.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False)))


_C1 = re.compile("[\x7f-\x9f]")


def format_entry(entry: dict[str, Any]) -> str:
    """One transcript entry as a readable line."""
    import time

    stamp = time.strftime("%H:%M:%S", time.localtime(entry["ts"]))
    meta = entry.get("meta", {})
    dropped = ""
    if meta.get("dropped_by_stop"):
        again = (f"; sent again as {meta['resent_as']}" if meta.get("resent_as") is not None
                 else f"; `corral resend {entry['channel']} {entry['seq']}` sends it again"
                 if str(entry.get("author", "")).startswith("human:") and entry.get("channel") else "")
        by = (f"an interrupt (message {meta['dropped_by_interrupt']})" if meta.get("dropped_by_interrupt")
              else "a stop")
        dropped = f" (not run: dropped by {by}{again})"
    cut = f" (saved as it stood: cut off by the {meta['cut_off']})" if meta.get("cut_off") else ""
    # An agent's text is not trusted with the operator's terminal (see supervisor.core.text.shown).
    author, kind = shown(str(entry["author"]), lines=False), shown(str(entry["kind"]), lines=False)
    return f"[{entry['seq']:>5}] {stamp} {author:<16} {kind:<7} {shown(str(entry['text']))}{dropped}{cut}"


class DraftView:
    """``tail -f``'s drafts in the human form. On a terminal, the text being written is one line
    rewritten in place (its end, as much as fits), cleared when the saved entry comes; elsewhere
    each draft's new text is printed on a line of its own, marked as not saved yet."""

    def __init__(self, terminal: bool, width: int = 100) -> None:
        self.terminal = terminal
        self.width = max(width, 40)
        self.shown: dict[str, int] = {}
        """How much of each open draft's text has been printed."""
        self.line = False
        """A draft line is on the terminal (the next output first clears it)."""

    def draft(self, draft: dict[str, Any]) -> str:
        """What to write for one draft event."""
        import time

        stamp = time.strftime("%H:%M:%S", time.localtime(draft["ts"]))
        head = f"[draft] {stamp} {shown(str(draft['author']), lines=False):<16} writing…"
        text = str(draft["text"])
        if self.terminal:
            flat = shown(text.replace("\n", " ⏎ "), lines=False)
            room = self.width - len(head) - 2
            self.line = True
            return f"\r\x1b[2K{head} {flat[-room:] if room > 0 else ''}"
        done = self.shown.get(draft["draft"], 0)
        self.shown[draft["draft"]] = len(text)
        fresh = text[done:] if len(text) >= done else text
        return f"{head} (not saved yet) {shown(fresh)}\n" if fresh else ""

    def entry(self, entry: dict[str, Any]) -> str:
        """What to write for one saved entry."""
        self.shown.pop(str(entry.get("meta", {}).get("draft")), None)
        clear = "\r\x1b[2K" if self.line else ""
        self.line = False
        return f"{clear}{format_entry(entry)}\n"


def format_stop(result: dict[str, Any]) -> str:
    """One channel's stop result as a readable line (an ACP turn's prompt: how it ended)."""
    what = "repeat (already stopped)" if result["repeat"] else f"generation {result['generation']}"
    ended = f", ACP prompt {result['ended']}" if result.get("ended") else ""
    failed = "" if result["ok"] else f" — FAILED: {result['error']}"
    turns = len(result["stopped_turns"])
    return (
        f"{result['channel']}: stopped — {what}; turns {turns}{ended}, killed {result['killed']}, "
        f"swept {result['swept']}, dropped {result['dropped']} message(s), {result['elapsed_ms']:.1f} ms{failed}"
    )


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        import supervisor

        click.echo(f"corral {supervisor.__version__}")
        ctx.exit()


class _Command(click.Command):
    """A command whose unknown-option error says how to pass a CHANNEL or TEXT starting with '-'."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            if any(isinstance(p, click.Argument) for p in self.params):
                names = " ".join(p.human_readable_name for p in self.params if isinstance(p, click.Argument))
                raise click.UsageError(f"{exc.format_message()} (a {names} starting with '-' goes after --: "
                                       f"corral {self.name} [OPTIONS] -- {names})", ctx=exc.ctx) from None
            raise


class _Group(click.Group):
    command_class = _Command


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the version and exit.")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's control socket (or CORRAL_SOCKET).")
@click.option("-c", "--config", "config_path", metavar="FILE",
              help="Config file (or CORRAL_CONFIG; default ./corral.toml).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (every command; `run` logs JSON lines).")
@click.pass_context
def main(ctx: click.Context, socket_path: str | None, config_path: str | None, as_json: bool) -> None:
    """corral: run AI coding-agent CLIs for chat channels, with a Stop that sticks."""
    ctx.obj = _Context(socket_path, config_path, as_json)


def _json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(f)


def _client_options(f: F) -> F:
    """``--json`` and ``-c FILE`` after a client command's name, as before it."""
    f = click.option("-c", "--config", "config_path", metavar="FILE",
                     help="Config file whose [server] names the daemon (or CORRAL_CONFIG; default ./corral.toml).")(f)
    return _json_option(f)


def _merge(ctx: _Context, as_json: bool, config: str | None = None) -> _Context:
    return _Context(ctx.socket, config or ctx.config, ctx.json or as_json)


@main.command(short_help="Run the daemon in the foreground.")
@click.option("-c", "--config", "config_path", metavar="FILE", help="Config file.")
@click.option(
    "--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), show_default=True,
    help="Least severe log record written to stderr.",
)
@_json_option
@click.pass_obj
def run(obj: _Context, config_path: str | None, log_level: str, as_json: bool) -> None:
    """Run the daemon in the foreground until SIGINT/SIGTERM or `corral shutdown`.

    Logs go to stderr (JSON lines with --json). A problem with the config or with the
    places it names (socket, store, state folder) is reported with the fix; exit 1.
    """
    import logging

    from .config.preflight import preflight
    from .serve.logformat import JSONLogFormatter
    from .serve.systemd import JournalFormatter, stderr_is_journal

    file = obj.config_file(config_path)
    config = _load(file)
    problems = preflight(config)
    if problems:
        _problems(problems, file)
    handler = logging.StreamHandler(sys.stderr)
    journald = stderr_is_journal(os.environ, sys.stderr)
    formatter: logging.Formatter
    if obj.json or as_json:
        formatter = JSONLogFormatter()
    else:  # the journal stamps every line itself
        formatter = logging.Formatter(("" if journald else "%(asctime)s ") + "%(levelname)s %(name)s: %(message)s")
    # Under systemd each line starts with its syslog priority, so `journalctl -p warning` works.
    handler.setFormatter(JournalFormatter(formatter) if journald else formatter)
    logging.basicConfig(level=getattr(logging, log_level), handlers=[handler])
    if getattr(logging, log_level) > logging.DEBUG:
        # httpx (the Matrix and Telegram bridges' client) logs every request at INFO: a line
        # per long poll and per draft edit would drown the daemon's own. Its warnings stay.
        for noisy in ("httpx", "httpcore"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    import trio

    from .serve.daemon import harden_process, run_daemon

    harden_process()
    try:
        trio.run(run_daemon, config)
    except Exception as exc:  # the one place start-up errors become messages
        message = _startup_error(exc, config)
        if message is None:
            raise
        logging.getLogger("corral").debug("start-up failed", exc_info=exc)
        _fail(message)


def _startup_error(exc: BaseException, config: Config) -> str | None:
    """A start-up failure as one line with the path and the fix; None if it is a bug."""
    import sqlite3

    from .serve.daemon import DaemonError
    from .store.engines import is_postgres_error
    from .store.store import StoreError, StoreInUse

    if isinstance(exc, BaseExceptionGroup):
        for leaf in exc.exceptions:
            message = _startup_error(leaf, config)
            if message is not None:
                return message
        return None
    where = f"in {config.path}" if config.path else "in the config"
    if isinstance(exc, DaemonError | StoreInUse):
        return str(exc)
    if config.store_url is not None and (is_postgres_error(exc) or isinstance(exc, StoreError)):
        first = str(exc).split("\n", 1)[0].strip()
        return (f"cannot use the store {config.store_name}: {first}"
                f" — fix: start the PostgreSQL server, or point [store] url {where} at a database this user can use")
    if isinstance(exc, sqlite3.Error | StoreError):
        return (f"cannot use the store {config.store_path}: {exc}"
                f" — fix: point [store] path {where} at a corral database or a new file")
    if isinstance(exc, OSError):
        path = exc.filename or config.store_path
        return (
            f"{path}: {exc.strerror or exc} — fix: make its folder exist and be writable by this user, "
            f"or change [server] socket / [store] path {where}"
        )
    return None


@main.command(short_help="Validate a config file and the places it names.")
@click.option("-c", "--config", "config_path", metavar="FILE", help="Config file.")
@_json_option
@click.pass_obj
def check(obj: _Context, config_path: str | None, as_json: bool) -> None:
    """Validate a config file: every problem, with the file, the key and the fix.

    Also checks what it can without starting: the socket path's length, that the socket's
    and the store's folders are writable or can be created, and that a PostgreSQL store
    answers.
    """
    import dataclasses

    from .config.preflight import notes, preflight, private_of, sandbox_warnings
    from .config.settings import ConfigError, Problem, load_config
    from .procs.sandbox import Sandbox, Support, probe

    file = obj.config_file(config_path)
    sandbox: dict[str, Any] = {}
    warnings: list[Problem] = []
    try:
        config = load_config(file)
        problems = preflight(config)
        mode = config.server.sandbox
        support = probe(config.server.bwrap) if mode != "off" else None
        view = Sandbox(mode, support or Support(None), private_of(config))
        # The supervisor's own description (every field it has), as `status` would say it.
        sandbox = view.describe()
        warnings = sandbox_warnings(config, view)
        if sandbox["state"] == "refused":
            problems.append(Problem(file, "server.sandbox",
                                    f"is \"required\", and this machine cannot sandbox "
                                    f"({'; '.join(view.support.missing)}): every turn would be refused",
                                    view.support.fix or 'write sandbox = "auto"'))
    except ConfigError as exc:
        problems = exc.problems
    if problems:
        if obj.json or as_json:
            _print_json({"ok": False, "problems": [dataclasses.asdict(p) for p in problems]})
        else:
            for problem in problems:
                click.echo(str(problem), err=True)
            click.echo(f"{len(problems)} problem(s)", err=True)
        sys.exit(EXIT_ERROR)
    # (A PostgreSQL store was connected to by the preflight: say so.)
    connected = " (connected)" if config.store_url else ""
    # "auto" that cannot sandbox is valid, and not ok: turns would run unsandboxed unasked
    # ("off" asked for it: warned, and ok).
    unsandboxed = sandbox["state"] == "unsandboxed"
    told = notes(config)
    # (As status says it: a policy needs the sandbox, so without one it is not enforced.)
    networks = {name: {**a.network.describe(), "enforced": not a.network.proxied or sandbox["state"] == "on"}
                for name, a in config.agents.items()}
    if obj.json or as_json:
        _print_json({"ok": not unsandboxed, "valid": True, "agents": list(config.agents),
                     "socket": str(config.server.socket), "store": config.store_name, "sandbox": sandbox,
                     "networks": networks, "warnings": [dataclasses.asdict(w) for w in warnings], "notes": told})
    else:
        for warning in warnings:
            click.echo(f"warning: {warning}", err=True)
        answer = "valid, but turns would run WITHOUT a sandbox" if unsandboxed else "ok"
        click.echo(f"{file}: {answer} — {len(config.agents)} agent(s): {', '.join(config.agents)};"
                   f" socket {config.server.socket}; store {config.store_name}{connected}")
        click.echo(sandbox_line(sandbox))
        for name, network in networks.items():
            click.echo(f"network of {name}: {network_line(network)}")
        for note in told:
            click.echo(f"note: {note}")
    if unsandboxed:
        sys.exit(EXIT_UNSANDBOXED)


def network_line(network: dict[str, Any]) -> str:
    """An agent's network as ``status`` and ``check`` print it."""
    words = str(network.get("policy"))
    if network.get("names"):
        words += f" ({', '.join(network['names'])})"
    if network.get("allow"):
        words += f"; allowed: {', '.join(network['allow'])}"
    if network.get("enforced") is False:
        words += " — NOT enforced: turns run without the sandbox"
    return words


def sandbox_line(sandbox: dict[str, Any]) -> str:
    """How ``status`` and ``check`` say whether turns are sandboxed: the supervisor's own
    sentence for its state (``summary``), marked as a warning when turns run without one and
    as an error when every turn is refused."""
    state = sandbox.get("state")
    mark = "sandbox" if state == "on" else "ERROR: sandbox" if state == "refused" else "WARNING: sandbox"
    return f"{mark}: {sandbox.get('summary', '')}"


@main.command(short_help="Send TEXT to CHANNEL (\"-\": from stdin); prints the accepted seq.")
@click.argument("channel")
@click.argument("text")
@click.option("--agent", metavar="NAME", help="Which agent (default: @mentions, else the channel's default).")
@click.option("--to", "to", metavar="NAME", multiple=True, help="An agent to send it to (repeatable).")
@click.option("--as", "author", metavar="NAME", default=DEFAULT_AUTHOR, show_default=True,
              help="Who is speaking: NAME (a human) or agent:NAME (another bot posting for an agent).")
@click.option("--interrupt", "delivery", flag_value="interrupt",
              help="Stop the agent's running turn (and drop what was queued before) and run this instead.")
@click.option("--steer", "delivery", flag_value="steer",
              help="Hand it to the agent's running turn, where it can take one (else it is queued, and says why).")
@click.option("--queue", "delivery", flag_value="queue", help="Queue it after the running turn (the default).")
@click.option("--key", "idempotency_key", metavar="KEY",
              help="An idempotency key: sent again with the same key (and author), it runs once.")
@_client_options
@click.pass_obj
def send(
    obj: _Context, channel: str, text: str, agent: str | None, to: tuple[str, ...], author: str,
    delivery: str | None, idempotency_key: str | None, config_path: str | None, as_json: bool,
) -> None:
    """Send TEXT to CHANNEL; prints the accepted seq (and says on stderr who it went to).

    TEXT "-" reads the text from standard input (for a long text, or one a shell would mangle).
    Without --interrupt, --steer or --queue, the channel's (or agent's) `delivery` setting applies.
    A connection lost before the answer is retried (for up to 15 s) with an idempotency key
    (--key, else one of its own), so the message runs once.
    """
    ctx = _merge(obj, as_json, config_path)
    if text == "-":
        text = sys.stdin.read()
    key = idempotency_key or _new_key()
    result = _call(ctx, lambda c: _retrying(
        lambda: c.send(channel, text, agent=agent, author=author, to=list(to) or None, delivery=delivery,
                       idempotency_key=key)))
    if ctx.json:
        _print_json(result)
        return
    click.echo(result["seq"])  # stdout stays the seq alone: scripts read it
    if result.get("replayed"):
        click.echo(f"corral: note: key {key!r} was sent before; this is its first acceptance, nothing new queued",
                   err=True)
    for hint in result.get("hints") or ():
        click.echo(f"corral: note: {hint}", err=True)
    click.echo(f"corral: {sent_line(result)}", err=True)


#: How long ``corral send`` retries a request whose answer was lost (the daemon restarting).
RETRY_SECONDS = 15.0


def _new_key() -> str:
    import uuid

    return str(uuid.uuid4())


def _retrying(send: Callable[[], T]) -> T:
    """``send`` again while its connection is lost or the daemon restarts, for
    :data:`RETRY_SECONDS` (safe: the send carries an idempotency key)."""
    from .serve.client import ConnectionLost, DaemonUnavailable

    deadline = time.monotonic() + RETRY_SECONDS
    lost = False
    while True:
        try:
            return send()
        except ConnectionLost:
            lost = True
        except DaemonUnavailable:
            if not lost:
                raise  # (no daemon, and none went away under this request: nothing to wait for)
        if time.monotonic() >= deadline:
            raise ConnectionLost(f"the daemon went away and did not answer again within {RETRY_SECONDS:g} s")
        time.sleep(0.25)


def sent_line(result: dict[str, Any]) -> str:
    """Who an accepted message went to, as ``corral send`` says it."""
    to = result.get("to") or []
    if not to:
        return f"stored as seq {result['seq']}, for no agent (the channel rests until a human speaks)"
    if result.get("delivery") == "steer":
        return f"seq {result['seq']} steered into {to[0]}'s running turn"
    if result.get("delivery") == "interrupt":
        interrupted = result.get("interrupted") or []
        dropped = result.get("dropped") or []
        what = f"interrupted {len(interrupted)} turn(s)" if interrupted else "nothing to interrupt"
        drops = f", dropped {len(dropped)} queued message(s) ({', '.join(map(str, dropped))})" if dropped else ""
        return f"seq {result['seq']} sent to {', '.join(to)}: {what}{drops}; it runs next"
    ahead = result.get("queued") or 0
    behind = f", behind {ahead} turn(s) of {to[0]}" if ahead else ""
    fallback = f" (not steered: {result['fallback']})" if result.get("fallback") else ""
    return f"seq {result['seq']} sent to {', '.join(to)}{behind}{fallback}"


@main.command()
@click.argument("channel", required=False)
@click.option("--all", "stop_all", is_flag=True, help="Stop every channel.")
@_client_options
@click.pass_obj
def stop(obj: _Context, channel: str | None, stop_all: bool, config_path: str | None, as_json: bool) -> None:
    """Stop CHANNEL (or --all); returns when the stop is complete."""
    if channel and stop_all:
        raise click.UsageError("name a CHANNEL or pass --all, not both")
    if not channel and not stop_all:
        raise click.UsageError("name the CHANNEL to stop, or pass --all to stop every channel")
    ctx = _merge(obj, as_json, config_path)
    result = _call(ctx, lambda c: c.stop(None if stop_all else channel))
    if ctx.json:
        _print_json(result)
    else:
        for r in result["channels"] if result.get("channels") is not None else [result]:
            click.echo(format_stop(r))
        if stop_all and not result.get("channels"):
            click.echo("nothing was running")
    if not result.get("ok", True):
        sys.exit(EXIT_ERROR)


@main.command(short_help="Start CHANNEL's conversation over: forget its sessions and plans.")
@click.argument("channel")
@click.option("--agent", metavar="NAME", help="Only this agent's conversation (default: every agent's).")
@click.option("--stop", "stop", is_flag=True, help="Stop a running turn first (else a running turn refuses it).")
@_client_options
@click.pass_obj
def reset(obj: _Context, channel: str, agent: str | None, stop: bool, config_path: str | None,
          as_json: bool) -> None:
    """Start CHANNEL over, as /new or /clear do in a chat: the agents forget its session ids
    (the next message starts a new conversation, in the same folder) and plans, recorded as
    an entry. The transcript stays. While a turn runs there it refuses (exit 1) unless --stop."""
    ctx = _merge(obj, as_json, config_path)
    entry = _call(ctx, lambda c: c.reset(channel, agent=agent, stop=stop))
    if ctx.json:
        _print_json(entry)
    else:
        click.echo(format_entry(entry))


@main.command(short_help="Send again, once, a message a stop dropped (by its seq).")
@click.argument("channel")
@click.argument("seq", type=click.IntRange(min=1))
@_client_options
@click.pass_obj
def resend(obj: _Context, channel: str, seq: int, config_path: str | None, as_json: bool) -> None:
    """Send again the message SEQ of CHANNEL that a stop dropped (`corral tail` shows it as
    "not run"): same text, same agents. Once: a second resend is refused."""
    ctx = _merge(obj, as_json, config_path)
    result = _call(ctx, lambda c: c.resend(channel, seq))
    if ctx.json:
        _print_json(result)
        return
    click.echo(result["seq"])
    click.echo(f"corral: message {seq} sent again: {sent_line(result)}", err=True)


@main.command(short_help="Show CHANNEL's waiting messages: place, author, agent, age, why.")
@click.argument("channel")
@_client_options
@click.pass_obj
def queue(obj: _Context, channel: str, config_path: str | None, as_json: bool) -> None:
    """Show the messages waiting in CHANNEL, each agent's lane in its order: seq, place,
    author, agent, age and why it waits. `corral cancel` takes one back, `corral first` moves one up."""
    ctx = _merge(obj, as_json, config_path)
    view = _call(ctx, lambda c: c.queue(channel))
    if ctx.json:
        _print_json(view)
        return
    for agent, turn in sorted(view.get("running", {}).items()):
        click.echo(f"running  {shown(agent, lines=False)}: turn {turn}")
    if not view.get("queued"):
        click.echo(f"nothing waits in {shown(channel, lines=False)}")
    for row in view["queued"]:
        age = "?" if row.get("age") is None else f"{row['age']:.0f}s"
        click.echo(f"[{row['entry']:>5}] #{row['place']} {shown(row['agent'], lines=False):<10} "
                   f"{shown(row['author'], lines=False):<16} {age:>6}  {shown(row['why'], lines=False)}: "
                   f"{shown(row['text'], lines=False)}")


@main.command(short_help="Take back a queued message of CHANNEL (by its seq): it never runs.")
@click.argument("channel")
@click.argument("seq", type=click.IntRange(min=1))
@click.option("--as", "author", metavar="NAME", default=DEFAULT_AUTHOR, show_default=True, help="Who takes it back.")
@_client_options
@click.pass_obj
def cancel(obj: _Context, channel: str, seq: int, author: str, config_path: str | None, as_json: bool) -> None:
    """Take the queued message SEQ of CHANNEL back (every agent's copy): it never starts a turn,
    recorded in the transcript. One a turn took already is not taken back (exit 1; the message
    names the turn and `corral stop`)."""
    ctx = _merge(obj, as_json, config_path)
    result = _call(ctx, lambda c: c.cancel(channel, seq, author=author))
    if ctx.json:
        _print_json(result)
        return
    click.echo(f"seq {seq} taken back ({', '.join(result['agents'])}); recorded as {result['record']}")


@main.command(short_help="Move a queued message of CHANNEL to the front of its agent's lane.")
@click.argument("channel")
@click.argument("seq", type=click.IntRange(min=1))
@click.option("--as", "author", metavar="NAME", default=DEFAULT_AUTHOR, show_default=True, help="Who moves it.")
@_client_options
@click.pass_obj
def first(obj: _Context, channel: str, seq: int, author: str, config_path: str | None, as_json: bool) -> None:
    """Move the queued message SEQ of CHANNEL to the front: its agent's next turn takes it."""
    ctx = _merge(obj, as_json, config_path)
    result = _call(ctx, lambda c: c.move_first(channel, seq, author=author))
    if ctx.json:
        _print_json(result)
        return
    click.echo(f"seq {seq} moved first ({', '.join(result['agents'])}); recorded as {result['record']}")


@main.command()
@click.argument("channel")
@click.option("--timeout", type=float, metavar="SECONDS", help="Give up after this long (exit 4).")
@_client_options
@click.pass_obj
def wait(obj: _Context, channel: str, timeout: float | None, config_path: str | None, as_json: bool) -> None:
    """Wait until CHANNEL runs no turn and has nothing queued."""
    ctx = _merge(obj, as_json, config_path)
    idle = _call(ctx, lambda c: c.wait(channel, timeout))
    if ctx.json:
        _print_json({"channel": channel, "idle": idle})
    elif not idle:
        click.echo(f"{channel}: still busy after {timeout:g} s", err=True)
    sys.exit(0 if idle else EXIT_TIMEOUT)


@main.command(short_help="Print CHANNEL's newest entries (a screenful; --limit N, --all).")
@click.argument("channel")
@click.option("--after", type=int, default=0, metavar="SEQ",
              help="Only entries after the entry SEQ (in a fleet: committed after it).")
@click.option("--limit", type=click.IntRange(0), default=None, metavar="N",
              help="The newest N entries, as `tail -n` [default: a screenful; with --json, every entry].")
@click.option("--all", "everything", is_flag=True, help="Every entry, oldest first.")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new entries as they are stored, and the text agents are writing before it is.")
@_client_options
@click.pass_obj
def tail(
    obj: _Context, channel: str, after: int, limit: int | None, everything: bool, follow: bool,
    config_path: str | None, as_json: bool,
) -> None:
    """Print CHANNEL's newest entries, a screenful unless --limit or --all (JSON lines with --json)."""
    ctx = _merge(obj, as_json, config_path)
    import shutil

    if everything and limit is not None:
        raise click.UsageError("--all and --limit say different things: give one of them")
    view = DraftView(sys.stdout.isatty(), shutil.get_terminal_size().columns)
    # A person gets a screenful of the newest; a program (--json) every entry unless it asks.
    if limit is None and not everything and not ctx.json:
        limit = max(5, shutil.get_terminal_size().lines - 2)

    def show(item: dict[str, Any]) -> None:
        if ctx.json:
            _print_json(item)
        else:
            sys.stdout.write(view.draft(item) if item.get("kind") == "draft" else view.entry(item))

    def newest(client: Client, n: int) -> Iterator[dict[str, Any]]:
        found = client.entries(channel, after, n + 1, newest=True)  # (one more: were earlier ones left out?)
        if len(found) > n and not ctx.json:
            click.echo(f"(the newest {n} entries; earlier ones: --limit N, or --all)", err=True)
        return iter(found[1:] if len(found) > n else found)

    def every(client: Client) -> Iterator[dict[str, Any]]:
        last = after
        while True:
            page = client.entries(channel, last, MAX_LIMIT)
            yield from page
            if len(page) < MAX_LIMIT:
                return
            last = page[-1]["seq"]

    def run(client: Client) -> None:
        entries = (client.follow(channel, after, drafts=True) if follow
                   else newest(client, limit) if limit is not None else every(client))
        for entry in entries:
            show(entry)
            sys.stdout.flush()

    try:
        _call(ctx, run)
    except KeyboardInterrupt:
        pass


@main.command(short_help="The daemon, its turns and channels, busy first.")
@click.option("--all", "idle", is_flag=True, help="List the idle channels too (page by page).")
@click.option("--after", metavar="CURSOR", default=None,
              help="The page after CURSOR (the `next` a page printed).")
@click.option("--limit", type=click.IntRange(1, MAX_STATUS_PAGE), default=DEFAULT_STATUS_PAGE, show_default=True,
              metavar="N", help="At most N channels in the page.")
@_client_options
@click.pass_obj
def status(
    obj: _Context, idle: bool, after: str | None, limit: int, config_path: str | None, as_json: bool
) -> None:
    """The daemon, its agents, running turns and its channels, busy ones first.

    A host with more channels than a page holds lists its busy channels (running, then
    queued) and counts the idle ones; --all lists those too, and --after pages on.
    """
    ctx = _merge(obj, as_json, config_path)
    result = _call(ctx, lambda c: c.status(after=after, limit=limit, idle=idle))
    if ctx.json:
        _print_json(result)
        return
    click.echo(f"corral pid {result['pid']}, up {result['uptime']:.0f} s, {result['running']} turn(s) running")
    if result.get("sandbox"):
        click.echo(f"  {sandbox_line(result['sandbox'])}")
    if result.get("capacity"):
        click.echo(f"  {_capacity_line(result['capacity'])}")
    for name, agent in result["agents"].items():
        click.echo(f"  agent {name}: {agent['adapter']} {' '.join(agent['command'])}")
        if agent.get("network"):
            click.echo(f"    network: {network_line(agent['network'])}")
    for name, ch in result["channels"].items():
        # Only where hand-offs can happen (two agents or more): in a one-agent channel the rest
        # after a stop changes nothing, and "rests" there read as something wrong.
        handing = len(ch.get("members") or ()) > 1
        rests = ", after its stop agent-to-agent hand-offs wait for a human's message" if ch.get("rests") \
            and handing else ""
        click.echo(f"  channel {name}: generation {ch['generation']}{rests}")
        for agent_name, lane in (ch.get("agents") or {}).items():
            click.echo(f"    {agent_name}: {_lane_state(lane)}")
    counts = result.get("channel_counts") or {}
    if counts.get("idle") and not result.get("idle_listed"):
        click.echo(f"  {counts['idle']} idle channel(s) not listed (of {counts['total']}):"
                   " `corral status --all` lists them")
    if result.get("next"):
        again = "corral status" + (" --all" if idle else "") + f" --after {shlex.quote(result['next'])}"
        click.echo(f"  more channels: `{again}`")
    recovered = result.get("recovered") or {}
    if recovered.get("killed") or recovered.get("turns") or recovered.get("stops"):
        click.echo(
            f"  recovered at start: killed {recovered['killed']}, interrupted turns {recovered['turns']},"
            f" stop notices {recovered['stops']}"
        )


def _capacity_line(capacity: dict[str, Any]) -> str:
    """The host's limits and use, as ``corral status`` prints them."""
    source = "from the config" if capacity["max_turns_from"] == "config" else "derived from memory"
    line = (f"capacity: {capacity['used']} of {capacity['max_turns']} slots used ({source}): "
            f"{capacity['running']} turn(s), {capacity['residents']} idle ACP agent(s); "
            f"{len(capacity['waiting'])} waiting")
    memory = capacity.get("memory")
    if memory:
        pressure = f", pressure {memory['pressure']:g}%" if memory.get("pressure") is not None else ""
        line += (f"; memory available {memory['available'] >> 20} MiB ({memory['source']}{pressure}),"
                 f" reserve {capacity['memory_reserve'] >> 20} MiB")
    limited = [f"{name} {a['running']}/{a['max_concurrent']}" for name, a in capacity.get("agents", {}).items()
               if a.get("max_concurrent") is not None]
    return line + (f"; agent limits: {', '.join(limited)}" if limited else "")


def _lane_state(lane: dict[str, Any]) -> str:
    """One agent's state in a channel, as ``corral status`` prints it."""
    turn = lane.get("turn")
    if lane["state"] in ("running", "stopping") and turn:
        since = time.strftime("%H:%M:%S", time.localtime(turn["started"]))
        what = f"{lane['state']} turn {turn['id']} since {since} ({turn['phase']}, pid {turn['pid']})"
        used = turn.get("usage")
        if used and (used["tokens"] or used["tool_calls"]):
            # The line every surface shows (supervisor.core.usage.usage_line), then its budgets.
            budgets = [f"{used['max_turn_tokens']:,} tokens" if used.get("max_turn_tokens") else "",
                       f"{used['max_turn_cost']} {used['currency']}" if used.get("max_turn_cost") else "",
                       f"{used['max_turn_tool_calls']:,} tools" if used.get("max_turn_tool_calls") else ""]
            within = ", ".join(b for b in budgets if b)
            what += f": {shown(str(used['line']), lines=False)}" + (f" (budget {within})" if within else "")
    else:
        what = lane["state"]
    waiting = lane.get("waiting")
    why = f", waiting #{waiting['position']} for a slot ({waiting['why']})" if waiting else ""
    return what + (f", {lane['queued']} queued" if lane["queued"] and lane["state"] != "queued" else
                   f" {lane['queued']}" if lane["state"] == "queued" else "") + why


@main.command(short_help="What turns spent, per day, channel and agent (today, or --since DAY).")
@click.argument("channel", required=False)
@click.option("--since", default=None, metavar="YYYY-MM-DD", help="From this UTC day on (default: today).")
@_client_options
@click.pass_obj
def usage(obj: _Context, channel: str | None, since: str | None, config_path: str | None, as_json: bool) -> None:
    """What turns spent (tokens, tool calls, wall time, cost), summed per UTC day, channel and agent."""
    ctx = _merge(obj, as_json, config_path)
    days = _call(ctx, lambda c: c.usage(channel, since))
    if ctx.json:
        _print_json({"days": days})
        return
    if not days:
        click.echo("no turn has ended in that time")
    for row in days:
        cost = ", ".join(f"{amount} {currency}" for currency, amount in row["cost"].items()) or "cost unknown"
        if row["cost"] and row["unpriced"]:
            cost += f" (and {row['unpriced']} turn(s) unpriced)"
        stopped = f", {row['stopped_by_budget']} stopped by a budget" if row["stopped_by_budget"] else ""
        click.echo(f"{row['day']} {row['channel']} {row['agent']}: {row['turns']} turn(s), {row['tokens']:,} tokens "
                   f"({row['input_tokens']:,} in, {row['output_tokens']:,} out, {row['cache_read_tokens']:,} cache "
                   f"read, {row['cache_write_tokens']:,} cache write), {row['tool_calls']} tool call(s), "
                   f"{row['wall_seconds']:.0f} s, {cost}{stopped}")


@main.group(short_help="Daily budgets: start one again today (budget reset).")
def budget() -> None:
    """Daily budgets (max_daily_tokens, max_daily_cost)."""


@budget.command("reset", short_help="Start a channel's or agent's daily budget again (default: every one).")
@click.argument("name", required=False)
@_client_options
@click.pass_obj
def budget_reset(obj: _Context, name: str | None, config_path: str | None, as_json: bool) -> None:
    """Forget today's spend of channel or agent NAME (every one without it): its daily budget
    starts again, and the messages that waited for it run now. Until the daemon restarts."""
    ctx = _merge(obj, as_json, config_path)
    answer = _call(ctx, lambda c: c.budget_reset(name))
    if ctx.json:
        _print_json(answer)
    elif answer["reset"]:
        click.echo(f"daily budget reset for {', '.join(answer['reset'])} ({answer['day']})")
    else:
        click.echo(f"nothing had spent anything today ({answer['day']}){f' as {name}' if name else ''}")


@main.command()
@_client_options
@click.pass_obj
def shutdown(obj: _Context, config_path: str | None, as_json: bool) -> None:
    """Ask the daemon to shut down in order."""
    ctx = _merge(obj, as_json, config_path)
    _call(ctx, lambda c: c.shutdown())
    if ctx.json:
        _print_json({"shutting_down": True})
    else:
        click.echo("corral is shutting down")


@main.command(short_help="Print a one-time login URL for the web dashboard.")
@click.option("-c", "--config", "config_path", metavar="FILE", help="Config file (its [server] tcp and token_file).")
@click.option("--open", "open_browser", is_flag=True,
              help="Also open the URL in a web browser (none here: the URL is printed, as without it).")
@click.option("--write-token", is_flag=True,
              help="Create the config's token_file with a new secret (mode 0600) if it does not exist.")
@click.option("--port", "tunnel_port", type=click.IntRange(1, 65535), metavar="PORT",
              help="The URL for another machine: the local port of its ssh tunnel (ssh -L PORT:127.0.0.1:TCP_PORT).")
@_json_option
@click.pass_obj
def dashboard(obj: _Context, config_path: str | None, open_browser: bool, write_token: bool,
              tunnel_port: int | None, as_json: bool) -> None:
    """Print a login URL for the dashboard, served on the daemon's loopback TCP listener.

    The URL holds a code that works once, for two minutes: visiting it sets a session
    cookie and opens the dashboard, so the token never reaches the browser. Needs
    ``tcp`` and ``token_file`` in the config's [server] table. From another machine, forward
    a port to the listener (``ssh -L 9000:127.0.0.1:8765 HOST``) and pass ``--port 9000``:
    the URL then names ``localhost:9000``, as that machine's browser reaches it.
    """
    from .config.settings import ConfigError, load_server_config
    from .serve.client import Client

    file = obj.config_file(config_path)
    try:
        server = load_server_config(file)
    except ConfigError as exc:
        missing = [p for p in exc.problems if p.key == "server.token_file" and p.message.endswith("does not exist")]
        if not (write_token and missing and len(missing) == len(exc.problems)):
            if missing and not write_token:
                click.echo(f"(`corral -c {file} dashboard --write-token` creates it with a new secret)", err=True)
            _problems(exc.problems, file)
        server = _write_token(file)
    if server.tcp is None or server.token_file is None:
        # Everything the dashboard needs, said once (issue 32: it took two errors and a restart).
        _fail(
            f"{file}: server.tcp: the dashboard is served on a loopback TCP listener with a token, and [server] has "
            'none — fix: add these two lines to [server]:\n    tcp = "127.0.0.1:8765"\n'
            '    token_file = "corral.token"\n'
            f"  then run `corral -c {file} dashboard --write-token` (it writes the token file, mode 0600) and restart "
            "the daemon (`corral shutdown`, then `corral run`): it opens the listener at start"
        )
    try:
        token = server.token_file.read_text().strip()
    except OSError as exc:
        _fail(f"{server.token_file}: cannot read the token: {exc.strerror or exc}")
    url = f"http://{server.tcp}"
    minted = _call(obj, lambda c: c.login_code(), client=Client(url=url, token=token))
    login = f"{url if tunnel_port is None else f'http://localhost:{tunnel_port}'}{minted['path']}"
    if obj.json or as_json:
        _print_json({"url": login, "expires_in": minted["expires_in"]})
    else:
        click.echo(login)
        click.echo(f"(works once, for {minted['expires_in']:g} s)", err=True)
    if open_browser:
        import webbrowser

        try:
            opened = webbrowser.open(login)
        except webbrowser.Error:
            opened = False
        if not opened:  # (a server over ssh, say): the URL is printed above; that is the answer
            click.echo("(no web browser here: open the URL above in one)", err=True)


def _write_token(file: str) -> ServerConfig:
    """``dashboard --write-token``: create the config's missing ``token_file`` (a new secret,
    0600, never overwriting a file), then read the config again."""
    import secrets
    from pathlib import Path

    from .config.settings import ConfigError, _read_toml, load_server_config

    named = Path(os.path.expanduser(str(_read_toml(Path(file)).get("server", {}).get("token_file"))))
    path = named if named.is_absolute() else Path(file).resolve().parent / named  # (as the config resolves it)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        _fail(f"{path}: cannot create the token file: {exc.strerror or exc}")
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32) + "\n")
    click.echo(f"wrote a new token to {path} (mode 0600); restart the daemon if it runs, so that it reads it",
               err=True)
    try:
        return load_server_config(file)
    except ConfigError as exc:
        _problems(exc.problems, file)


@main.command(short_help="Show the main job with no setup.")
@click.option("--keep", is_flag=True, help="Keep the temporary folder and print its path.")
@_json_option
@click.pass_obj
def demo(obj: _Context, keep: bool, as_json: bool) -> None:
    """Show the main job with no setup: send, stream, stop mid-tool, resume.

    With --json each line of the show is a JSON object {"say": ...}, then {"ok": ..., "status": ...}.
    """
    from ._demo import demo_main

    json_out = obj.json or as_json
    say = (lambda text: _print_json({"say": text})) if json_out else click.echo
    status = demo_main(keep, say)
    if json_out:
        _print_json({"ok": status == 0, "status": status})
    sys.exit(status)


if __name__ == "__main__":
    main()
