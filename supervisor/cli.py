"""The ``corral`` command line.

Exit status: 0 success; 1 an error (bad config, a failed stop, an API error); 2 bad usage;
3 no daemon answers; 4 ``corral wait`` timed out.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

import click

from ._client import APIError, Client, DaemonUnavailable
from ._config import DEFAULT_CONFIG_NAME, Config, ConfigError, load_config

EXIT_ERROR = 1
EXIT_NO_DAEMON = 3
EXIT_TIMEOUT = 4


def _fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    click.echo(f"corral: {message}", err=True)
    sys.exit(code)


def _load(path: str | None) -> Config:
    file = path or os.environ.get("CORRAL_CONFIG") or DEFAULT_CONFIG_NAME
    try:
        return load_config(file)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(str(problem), err=True)
        click.echo(f"corral: {len(exc.problems)} problem(s) in {file}; nothing was started", err=True)
        sys.exit(EXIT_ERROR)


class _Context:
    def __init__(self, socket: str | None, config: str | None, as_json: bool) -> None:
        self.socket = socket
        self.config = config
        self.json = as_json

    def client(self) -> Client:
        path = self.socket or os.environ.get("CORRAL_SOCKET")
        if path is None:
            config_file = self.config or os.environ.get("CORRAL_CONFIG")
            if config_file is None and not Path(DEFAULT_CONFIG_NAME).exists():
                _fail(
                    "no daemon to talk to: pass --socket PATH, set CORRAL_SOCKET, or -c FILE "
                    "(start one with `corral run -c FILE`)",
                    EXIT_NO_DAEMON,
                )
            path = str(_load(config_file).server.socket)
        return Client(path)


def _call(ctx: _Context, fn: Any) -> Any:
    client = ctx.client()
    try:
        return fn(client)
    except DaemonUnavailable:
        _fail(f"no daemon is running on {client.where}; start one with `corral run -c corral.toml`", EXIT_NO_DAEMON)
    except APIError as exc:
        _fail(f"{exc.message} ({exc.status} {exc.code})")
    finally:
        client.close()


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False))


def format_entry(entry: dict[str, Any]) -> str:
    """One transcript entry as a readable line."""
    stamp = time.strftime("%H:%M:%S", time.localtime(entry["ts"]))
    return f"[{entry['seq']:>5}] {stamp} {entry['author']:<16} {entry['kind']:<7} {entry['text']}"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's control socket (or CORRAL_SOCKET).")
@click.option("-c", "--config", "config_path", metavar="FILE", help="Config file (or CORRAL_CONFIG; default ./corral.toml).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def main(ctx: click.Context, socket_path: str | None, config_path: str | None, as_json: bool) -> None:
    """corral: run AI coding-agent CLIs for chat channels, with a Stop that sticks."""
    ctx.obj = _Context(socket_path, config_path, as_json)


def _json_option(f: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(f)


def _merge(ctx: _Context, as_json: bool, config: str | None = None) -> _Context:
    return _Context(ctx.socket, config or ctx.config, ctx.json or as_json)


@main.command()
@click.option("-c", "--config", "config_path", metavar="FILE", help="Config file.")
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), show_default=True)
@click.pass_obj
def run(obj: _Context, config_path: str | None, log_level: str) -> None:
    """Run the daemon in the foreground until SIGINT/SIGTERM or `corral shutdown`."""
    import trio

    from ._daemon import DaemonError, harden_process, run_daemon

    config = _load(config_path or obj.config)
    journald = "JOURNAL_STREAM" in os.environ
    logging.basicConfig(
        level=getattr(logging, log_level),
        format="%(levelname)s %(name)s: %(message)s" if journald else "%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    harden_process()
    try:
        trio.run(run_daemon, config)
    except DaemonError as exc:
        _fail(str(exc))


@main.command()
@click.option("-c", "--config", "config_path", metavar="FILE", help="Config file.")
@_json_option
@click.pass_obj
def check(obj: _Context, config_path: str | None, as_json: bool) -> None:
    """Validate a config file: every problem, with the file, the key and the fix."""
    file = config_path or obj.config or os.environ.get("CORRAL_CONFIG") or DEFAULT_CONFIG_NAME
    try:
        config = load_config(file)
    except ConfigError as exc:
        if obj.json or as_json:
            _print_json({"ok": False, "problems": [dataclasses.asdict(p) for p in exc.problems]})
        else:
            for problem in exc.problems:
                click.echo(str(problem), err=True)
            click.echo(f"{len(exc.problems)} problem(s)", err=True)
        sys.exit(EXIT_ERROR)
    if obj.json or as_json:
        _print_json({"ok": True, "agents": list(config.agents), "socket": str(config.server.socket)})
    else:
        click.echo(f"{file}: ok — {len(config.agents)} agent(s): {', '.join(config.agents)}; socket {config.server.socket}")


@main.command()
@click.argument("channel")
@click.argument("text")
@click.option("--agent", metavar="NAME", help="Which agent (default: the config's default).")
@click.option("--as", "author", metavar="NAME", help="Who is speaking (default: user).")
@_json_option
@click.pass_obj
def send(obj: _Context, channel: str, text: str, agent: str | None, author: str | None, as_json: bool) -> None:
    """Send TEXT to CHANNEL; prints the accepted seq."""
    ctx = _merge(obj, as_json)
    result = _call(ctx, lambda c: c.send(channel, text, agent=agent, author=author))
    if ctx.json:
        _print_json(result)
    else:
        click.echo(result["seq"])


@main.command()
@click.argument("channel", required=False)
@click.option("--all", "stop_all", is_flag=True, help="Stop every channel.")
@_json_option
@click.pass_obj
def stop(obj: _Context, channel: str | None, stop_all: bool, as_json: bool) -> None:
    """Stop CHANNEL (or --all); returns when the stop is complete."""
    if bool(channel) == stop_all:
        raise click.UsageError("name a CHANNEL or pass --all (not both)")
    ctx = _merge(obj, as_json)
    result = _call(ctx, lambda c: c.stop(None if stop_all else channel))
    if ctx.json:
        _print_json(result)
    else:
        for r in result["channels"] if result.get("channels") is not None else [result]:
            what = "repeat (already stopped)" if r["repeat"] else f"generation {r['generation']}"
            click.echo(
                f"{r['channel']}: stopped — {what}; turns {len(r['stopped_turns'])}, killed {r['killed']}, "
                f"swept {r['swept']}, dropped {r['dropped']} message(s), {r['elapsed_ms']:.1f} ms"
                + ("" if r["ok"] else f" — FAILED: {r['error']}")
            )
        if stop_all and not result.get("channels"):
            click.echo("nothing was running")
    if not result.get("ok", True):
        sys.exit(EXIT_ERROR)


@main.command()
@click.argument("channel")
@click.option("--timeout", type=float, metavar="SECONDS", help="Give up after this long (exit 4).")
@_json_option
@click.pass_obj
def wait(obj: _Context, channel: str, timeout: float | None, as_json: bool) -> None:
    """Wait until CHANNEL runs no turn and has nothing queued."""
    ctx = _merge(obj, as_json)
    idle = _call(ctx, lambda c: c.wait(channel, timeout))
    if ctx.json:
        _print_json({"channel": channel, "idle": idle})
    elif not idle:
        click.echo(f"{channel}: still busy after {timeout:g} s", err=True)
    sys.exit(0 if idle else EXIT_TIMEOUT)


@main.command()
@click.argument("channel")
@click.option("--after", type=int, default=0, metavar="SEQ", help="Only entries after this seq.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new entries as they are stored.")
@_json_option
@click.pass_obj
def tail(obj: _Context, channel: str, after: int, follow: bool, as_json: bool) -> None:
    """Print CHANNEL's entries (JSON lines with --json)."""
    ctx = _merge(obj, as_json)
    show = _print_json if ctx.json else (lambda e: click.echo(format_entry(e)))

    def run(client: Client) -> None:
        entries = client.follow(channel, after) if follow else client.entries(channel, after)
        for entry in entries:
            show(entry)
            sys.stdout.flush()

    try:
        _call(ctx, run)
    except KeyboardInterrupt:
        pass


@main.command()
@_json_option
@click.pass_obj
def status(obj: _Context, as_json: bool) -> None:
    """The daemon, its agents, channels and running turns."""
    ctx = _merge(obj, as_json)
    result = _call(ctx, lambda c: c.status())
    if ctx.json:
        _print_json(result)
        return
    click.echo(f"corral pid {result['pid']}, up {result['uptime']:.0f} s, {result['running']} turn(s) running")
    for name, agent in result["agents"].items():
        click.echo(f"  agent {name}: {agent['adapter']} {' '.join(agent['command'])}")
    for name, ch in result["channels"].items():
        turn = ch["turn"]
        running = f"turn {turn['id']} ({turn['agent']}, {turn['phase']}, pid {turn['pid']})" if turn else "idle"
        click.echo(f"  channel {name}: {running}, {ch['queued']} queued, generation {ch['generation']}")


@main.command()
@_json_option
@click.pass_obj
def shutdown(obj: _Context, as_json: bool) -> None:
    """Ask the daemon to shut down in order."""
    ctx = _merge(obj, as_json)
    _call(ctx, lambda c: c.shutdown())
    if ctx.json:
        _print_json({"shutting_down": True})
    else:
        click.echo("corral is shutting down")


@main.command()
@click.option("--keep", is_flag=True, help="Keep the temporary folder and print its path.")
def demo(keep: bool) -> None:
    """Show the main job with no setup: send, stream, stop mid-tool, resume."""
    import trio

    from ._demo import run_demo

    folder = tempfile.mkdtemp(prefix="corral-demo-")
    ok = trio.run(run_demo, Path(folder), click.echo)
    if keep:
        click.echo(f"(files kept in {folder})")
    else:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    sys.exit(0 if ok else EXIT_ERROR)


if __name__ == "__main__":
    main()
