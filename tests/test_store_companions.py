"""Companions of the store corral did not write (issue 41.2): a planted hot journal is never
replayed over the store, and a config where an agent may write the store's folder is refused.

SQLite replays a hot rollback journal at the next read-write open, whoever wrote it; the store
is in WAL mode, so corral never leaves one. An agent that could write the store's folder
planted one holding an image of the store with a forged entry: it is moved aside, unread,
both by the embedded runner and by ``corral run``, and the real store is kept — checked
beside the same plant replayed by plain SQLite (the attack is real).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from conftest import PYTHON, DaemonProcess

from supervisor.config.preflight import preflight
from supervisor.config.settings import ConfigError, parse_config
from supervisor.store.engines import quarantine_companions
from supervisor.store.store import open_store

FORGED = "forged system entry"


def plant_journal(store: Path) -> None:
    """What a hostile agent writes beside ``store``: a hot journal whose pages are a copy of the
    store with a forged entry (a copy in rollback mode, and a writer that died mid-transaction)."""
    forged = store.with_name("forged.db")
    shutil.copy(store, forged)
    db = sqlite3.connect(forged, isolation_level=None)
    db.execute("PRAGMA journal_mode=DELETE")
    row = db.execute("SELECT * FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
    names = [d[1] for d in db.execute("PRAGMA table_info(entries)")]
    values = dict(zip(names, row, strict=True))
    values.update(seq=values["seq"] + 1000, text=FORGED, author="system")
    db.execute(f"INSERT INTO entries ({','.join(names)}) VALUES ({','.join('?' * len(names))})",
               list(values.values()))
    db.close()
    code = (
        "import os, sqlite3, sys\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('PRAGMA cache_size=1')\n"
        "db.execute('BEGIN IMMEDIATE')\n"
        "for (t,) in db.execute(\"SELECT name FROM sqlite_master WHERE type='table'\").fetchall():\n"
        "    db.execute(f'DELETE FROM \"{t}\"')\n"
        "db.execute('CREATE TABLE pad(x)')\n"
        "db.execute('INSERT INTO pad SELECT randomblob(3000) FROM (WITH RECURSIVE c(n) AS "
        "(SELECT 1 UNION ALL SELECT n+1 FROM c WHERE n<50) SELECT n FROM c)')\n"
        "os._exit(0)\n"  # dies mid-transaction: the journal is hot
    )
    subprocess.run([sys.executable, "-c", code, str(forged)], check=True)
    os.rename(str(forged) + "-journal", str(store) + "-journal")
    forged.unlink()


async def _store_with_an_entry(path: Path) -> None:
    async with open_store(str(path)) as store:
        await store.append("c", "human:user", "message", "the real entry")


def _texts(path: Path) -> list[str]:
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return [t for (t,) in db.execute("SELECT text FROM entries ORDER BY seq")]
    finally:
        db.close()


def test_plain_sqlite_replays_the_planted_journal(tmp_path: Path) -> None:
    """The attack, without corral in the way: the forged entry lands in the store."""
    store = tmp_path / "corral.db"
    trio.run(_store_with_an_entry, store)
    plant_journal(store)
    sqlite3.connect(store).execute("SELECT count(*) FROM entries").fetchone()  # a read-write open
    assert FORGED in _texts(store)


def test_the_store_moves_a_planted_journal_aside_and_keeps_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "corral.db"
    trio.run(_store_with_an_entry, store)
    plant_journal(store)
    planted = (tmp_path / "corral.db-journal").read_bytes()

    async def reopen() -> list[str]:
        async with open_store(str(store)) as opened:
            return [e.text for e in await opened.entries("c")]

    texts = trio.run(reopen)
    assert "the real entry" in texts and FORGED not in texts
    assert FORGED not in _texts(store)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("corral.db-journal.untrusted-")]
    assert len(aside) == 1 and aside[0].read_bytes() == planted  # kept for the operator, unread
    assert not (tmp_path / "corral.db-journal").exists()
    assert any("moved" in r.message and "corral did not write" in r.message for r in caplog.records)


def test_a_symlinked_companion_is_moved_aside_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("not corral's")
    store = tmp_path / "corral.db"
    (tmp_path / "corral.db.lock").symlink_to(target)
    (tmp_path / "corral.db-wal").symlink_to(tmp_path / "nowhere")
    moved = quarantine_companions(str(store), now=0)
    assert sorted(Path(a).name for _, a in moved) == ["corral.db-wal.untrusted-19700101T000000Z",
                                                      "corral.db.lock.untrusted-19700101T000000Z"]
    assert target.read_text() == "not corral's"  # the lock would have truncated it
    trio.run(_store_with_an_entry, store)
    assert target.read_text() == "not corral's" and not (tmp_path / "corral.db.lock").is_symlink()


def test_corral_run_starts_with_the_store_kept(short_tmp: Path) -> None:
    """``corral check`` no longer calls a store with a planted journal damaged (its fix, "move
    this one away", lost the store); ``corral run`` moves the journal aside, says so, serves the
    real transcript."""
    config = '[server]\nsocket = "corral.sock"\n[store]\npath = "corral.db"\n[agents.demo]\nadapter = "demo"\n'
    store = short_tmp / "corral.db"
    trio.run(_store_with_an_entry, store)
    plant_journal(store)
    (short_tmp / "corral.toml").write_text(config)
    check = subprocess.run([PYTHON, "-m", "supervisor.cli", "check", "-c", str(short_tmp / "corral.toml")],
                           capture_output=True, text=True, cwd=short_tmp)
    assert check.returncode == 0, check.stderr
    daemon = DaemonProcess(short_tmp, config)
    try:
        out = daemon.cli("tail", "c", "--json")
        texts = [json.loads(line)["text"] for line in out.stdout.splitlines()]
        assert "the real entry" in texts and FORGED not in texts
    finally:
        assert daemon.stop() == 0
    assert any("corral.db-journal.untrusted-" in line for line in daemon.log)


# ------------------------------------------------------------------ the config's wall


@pytest.mark.parametrize("where", [".", "project"])
def test_an_agent_whose_cwd_holds_the_stores_folder_is_refused(tmp_path: Path, where: str) -> None:
    """``cwd = "."`` in the folder holding the store, or an ancestor of the store's folder:
    refused, naming the store and a fix that keeps it; a folder beside the store is fine."""
    (tmp_path / "project" / "data").mkdir(parents=True)
    store = "project/data/corral.db" if where == "project" else "corral.db"
    raw = {"store": {"path": store}, "agents": {"a": {"adapter": "demo", "cwd": where}}}
    with pytest.raises(ConfigError) as bad:
        parse_config(raw, file="c.toml", base=tmp_path)
    text = str(bad.value)
    assert "agents.a.cwd" in text and "the store's folder" in text and "[store] path" in text
    (tmp_path / "beside").mkdir()
    ok = {"store": {"path": store}, "agents": {"a": {"adapter": "demo", "cwd": "beside"}}}
    assert preflight(parse_config(ok, file="c.toml", base=tmp_path)) == []


def test_corral_check_says_a_configured_cwd_is_shared_by_every_channel(short_tmp: Path) -> None:
    """Issue 41.11: docs/security.md promised a working folder per (agent, channel); a configured
    ``cwd`` is one for all its channels, and ``corral check`` says exactly that."""
    (short_tmp / "repo").mkdir()
    (short_tmp / "corral.toml").write_text(
        '[server]\nsocket = "corral.sock"\n[store]\npath = "state/corral.db"\n'
        '[defaults]\nagent = "shared"\n[agents.shared]\nadapter = "demo"\ncwd = "repo"\n'
        '[agents.own]\nadapter = "demo"\n'
    )
    (short_tmp / "state").mkdir()
    check = subprocess.run([PYTHON, "-m", "supervisor.cli", "check", "-c", "corral.toml"],
                           capture_output=True, text=True, cwd=short_tmp)
    assert check.returncode == 0, check.stderr
    [note] = [line for line in check.stdout.splitlines() if line.startswith("note: ")]
    assert "agents.shared.cwd" in note and "shared by every channel" in note and "Remove cwd" in note
    as_json = subprocess.run([PYTHON, "-m", "supervisor.cli", "check", "-c", "corral.toml", "--json"],
                             capture_output=True, text=True, cwd=short_tmp)
    assert [n[:18] for n in json.loads(as_json.stdout)["notes"]] == ["agents.shared.cwd:"]


def test_corral_check_says_what_a_grant_of_the_stores_folder_allows(tmp_path: Path) -> None:
    """A grant that holds the store's folder is not refused (the sandbox covers the store's
    files; a planted journal is moved aside), and check says what it does and does not hold."""
    from supervisor.config.preflight import notes

    config = parse_config({"agents": {"a": {"adapter": "demo", "sandbox_write": ["."]}}}, file="c.toml",
                          base=tmp_path)
    [note] = notes(config)
    assert note.startswith("agents.a.sandbox_write:") and "moved aside" in note and "folder of its own" in note
    (tmp_path / "elsewhere").mkdir()
    apart = parse_config({"agents": {"a": {"adapter": "demo", "sandbox_write": ["elsewhere"]}}}, file="c.toml",
                         base=tmp_path)
    assert notes(apart) == []
