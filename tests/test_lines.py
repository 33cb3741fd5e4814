"""Tests for ``supervisor.procs.lines``: splitting bytes into capped lines, and reading them from a stream."""

from __future__ import annotations

import os

import trio
import trio.testing

from supervisor.procs.lines import MAX_LINE, Line, LineReader, LineSplitter


def datas(lines: list[Line]) -> list[bytes]:
    """The bytes of each line."""
    return [line.data for line in lines]


# ---------------------------------------------------------------- LineSplitter


def test_lines_in_one_chunk() -> None:
    s = LineSplitter()
    assert s.feed(b"one\ntwo\nthr") == [Line(b"one"), Line(b"two")]
    assert s.feed(b"ee\n") == [Line(b"three")]
    assert s.flush() == []


def test_line_split_across_many_chunks() -> None:
    s = LineSplitter()
    out: list[Line] = []
    for byte in b'{"type": "text", "text": "hi"}\nnext\n':
        out += s.feed(bytes([byte]))
    assert datas(out) == [b'{"type": "text", "text": "hi"}', b"next"]


def test_crlf_is_stripped_even_when_split_between_chunks() -> None:
    s = LineSplitter()
    assert s.feed(b"a\r\nb\r") == [Line(b"a")]
    assert s.feed(b"\nc\n") == [Line(b"b"), Line(b"c")]
    # Only the CR right before the newline goes; others are data.
    assert s.feed(b"x\ry\r\r\n") == [Line(b"x\ry\r")]


def test_empty_lines_are_kept() -> None:
    s = LineSplitter()
    assert s.feed(b"\n\na\n\r\n") == [Line(b""), Line(b""), Line(b"a"), Line(b"")]


def test_flush_returns_a_final_line_without_newline_once() -> None:
    s = LineSplitter()
    assert s.feed(b"done\ntail") == [Line(b"done")]
    assert s.flush() == [Line(b"tail")]
    assert s.flush() == []


def test_overlong_line_is_truncated_and_flagged_then_the_next_line_is_whole() -> None:
    s = LineSplitter(max_line=5)
    assert s.feed(b"abcdefghij\nxy\n") == [Line(b"abcde", truncated=True), Line(b"xy", truncated=False)]
    # Exactly the cap is not truncated.
    assert s.feed(b"12345\n") == [Line(b"12345", truncated=False)]


def test_truncation_across_chunks_keeps_only_the_cap() -> None:
    s = LineSplitter(max_line=4)
    out: list[Line] = []
    for chunk in (b"ab", b"cdef", b"ghij" * 100, b"kl\nok", b"\n"):
        out += s.feed(chunk)
        assert len(s._buf) <= 4  # never holds more than the cap
    assert out == [Line(b"abcd", truncated=True), Line(b"ok")]


def test_flush_of_a_truncated_final_line_keeps_the_flag() -> None:
    s = LineSplitter(max_line=3)
    assert s.feed(b"abcdef") == []
    assert s.flush() == [Line(b"abc", truncated=True)]
    assert s.flush() == []


def test_default_cap_is_one_mebibyte() -> None:
    assert MAX_LINE == 1 << 20
    s = LineSplitter()
    [line] = s.feed(b"x" * (MAX_LINE + 10) + b"\n")
    assert len(line.data) == MAX_LINE and line.truncated


def test_text_replaces_undecodable_bytes() -> None:
    assert Line("héllo".encode()).text() == "héllo"
    assert Line(b"a\xffb").text() == "a\ufffdb"


# ---------------------------------------------------------------- LineReader


async def test_reader_returns_lines_as_they_complete_then_eof() -> None:
    send, receive = trio.testing.memory_stream_pair()
    reader = LineReader(receive)
    await send.send_all(b"one\ntwo\npart")
    assert datas(await reader.read_lines()) == [b"one", b"two"]
    async with trio.open_nursery() as nursery:
        got: list[list[Line]] = []

        async def read() -> None:
            got.append(await reader.read_lines())

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # an incomplete line is not returned
        await send.send_all(b"ial")
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        await send.send_all(b"\r\n")
    assert datas(got[0]) == [b"partial"]
    await send.send_all(b"tail without newline")
    await send.aclose()
    assert await reader.read_lines() == [Line(b"tail without newline")]
    assert reader.eof
    assert await reader.read_lines() == []
    assert await reader.read_lines() == []


async def test_reader_with_small_chunks_and_a_cap() -> None:
    send, receive = trio.testing.lockstep_stream_pair()
    reader = LineReader(receive, max_line=4, chunk=3)
    got: list[Line] = []

    async def read_all() -> None:
        while True:
            lines = await reader.read_lines()
            if not lines:
                return
            got.extend(lines)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_all)
        await send.send_all(b"abcdefgh\nok\n\nlast")
        await send.aclose()
    assert got == [Line(b"abcd", True), Line(b"ok"), Line(b""), Line(b"last")]
    assert reader.eof


async def test_reader_at_eof_with_nothing_pending_returns_empty() -> None:
    send, receive = trio.testing.memory_stream_pair()
    reader = LineReader(receive)
    await send.send_all(b"x\n")
    await send.aclose()
    assert await reader.read_lines() == [Line(b"x")]
    assert await reader.read_lines() == []
    assert reader.eof


async def test_read_ready_takes_what_the_pipe_holds_and_its_eof_without_a_checkpoint() -> None:
    """A stopped turn drains its stdout once every writer is dead: no wake-up for that."""
    r, w = os.pipe()
    os.write(w, b"one\ntwo\npartial")
    stream = trio.lowlevel.FdStream(r)
    reader = LineReader(stream)
    with trio.testing.assert_no_checkpoints():
        assert datas(reader.read_ready()) == [b"one", b"two"]  # a writer is alive: no EOF yet
    assert not reader.eof
    os.write(w, b" line\n")
    os.close(w)
    with trio.testing.assert_no_checkpoints():
        assert datas(reader.read_ready()) == [b"partial line"]
    assert reader.eof
    assert await reader.read_lines() == []
    await stream.aclose()


async def test_read_ready_stops_after_its_bound_while_a_writer_keeps_the_pipe_full() -> None:
    r, w = os.pipe()
    os.set_blocking(w, False)
    stream = trio.lowlevel.FdStream(r)
    reader = LineReader(stream, chunk=4)
    os.write(w, b"a\n" * 8)
    assert datas(reader.read_ready(max_reads=2)) == [b"a"] * 4  # two chunks of 4 bytes, then it returns
    assert not reader.eof
    assert datas(await reader.read_lines()) == [b"a"] * 2
    os.close(w)
    await stream.aclose()


async def test_read_ready_of_a_stream_without_a_file_descriptor_reads_nothing() -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    await send.send_all(b"x\n")
    reader = LineReader(receive)
    assert reader.read_ready() == []
    assert datas(await reader.read_lines()) == [b"x"]
