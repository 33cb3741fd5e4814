"""What a client says to the proxy, parsed (``supervisor.net.wire``): pure, so each case is bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.net import wire


def test_connect_names_host_and_port_and_keeps_what_follows_the_head() -> None:
    target = wire.parse_http_head(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n\x16\x03")
    assert target == wire.Target("api.example.com", 443, tunnel=True, rest=b"\x16\x03")
    assert wire.parse_http_head(b"CONNECT [::1]:8080 HTTP/1.1\r\n\r\n") == wire.Target("::1", 8080, tunnel=True)


def test_an_absolute_uri_is_forwarded_in_origin_form_with_the_proxy_headers_dropped() -> None:
    head = (b"POST http://127.0.0.1:4000/v1/messages?beta=1 HTTP/1.1\r\nHost: 127.0.0.1:4000\r\n"
            b"Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nConnection: keep-alive\r\n"
            b"Content-Length: 2\r\n\r\n{}")
    target = wire.parse_http_head(head)
    assert target is not None and not target.tunnel and (target.host, target.port) == ("127.0.0.1", 4000)
    assert target.forward == (b"POST /v1/messages?beta=1 HTTP/1.1\r\nHost: 127.0.0.1:4000\r\nContent-Length: 2\r\n"
                              b"Connection: close\r\n\r\n")
    assert target.rest == b"{}"
    bare = wire.parse_http_head(b"GET http://example.org HTTP/1.0\r\n\r\n")
    assert bare is not None and bare.port == 80 and bare.forward.startswith(b"GET / HTTP/1.0\r\nHost: example.org\r\n")


def test_an_incomplete_head_waits_and_a_bad_one_is_refused_with_its_status() -> None:
    assert wire.parse_http_head(b"CONNECT a:1 HTTP/1.1\r\n") is None
    with pytest.raises(wire.WireError) as bad:
        wire.parse_http_head(b"x" * (wire.MAX_HEAD + 1))
    assert bad.value.status == 431
    for head in (b"GET /relative HTTP/1.1\r\n\r\n", b"GET https://a.example/ HTTP/1.1\r\n\r\n",
                 b"CONNECT nohost HTTP/1.1\r\n\r\n", b"CONNECT a:99999 HTTP/1.1\r\n\r\n", b"garbage\r\n\r\n",
                 b"CONNECT a b:1 HTTP/1.1\r\n\r\n"):
        with pytest.raises(wire.WireError):
            wire.parse_http_head(head)
    with pytest.raises(wire.WireError) as bad:
        wire.parse_http_head(b"CONNECT a:1 HTTP/2\r\n\r\n")
    assert bad.value.status == 505


def test_socks5_greeting_and_connect_by_name_v4_and_v6() -> None:
    assert wire.parse_socks_greeting(b"\x05") is None
    assert wire.parse_socks_greeting(b"\x05\x02\x02\x00") == (True, 4)
    assert wire.parse_socks_greeting(b"\x05\x01\x02") == (False, 3)
    name = b"\x05\x01\x00\x03\x0bexample.org\x01\xbb"
    assert wire.parse_socks_request(name) == (wire.Target("example.org", 443, tunnel=True), len(name))
    assert wire.parse_socks_request(name[:-1]) is None
    v4 = b"\x05\x01\x00\x01\x7f\x00\x00\x01\x1f\x90"
    assert wire.parse_socks_request(v4) == (wire.Target("127.0.0.1", 8080, tunnel=True), 10)
    v6 = b"\x05\x01\x00\x04" + b"\x00" * 15 + b"\x01" + b"\x00\x50"
    assert wire.parse_socks_request(v6) == (wire.Target("::1", 80, tunnel=True), 22)
    for request, code in ((b"\x05\x02\x00\x01\x7f\x00\x00\x01\x00\x50", wire.SOCKS_BAD_COMMAND),
                          (b"\x05\x01\x00\x09\x00\x00\x00\x00\x00\x50", wire.SOCKS_BAD_ADDRESS),
                          (b"\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x00", wire.SOCKS_BAD_ADDRESS)):
        with pytest.raises(wire.WireError) as bad:
            wire.parse_socks_request(request)
        assert bad.value.status == code
    assert wire.socks_reply(wire.SOCKS_NOT_ALLOWED)[:2] == b"\x05\x02"


def test_a_refusal_answer_says_its_reason_and_closes() -> None:
    answer = wire.http_answer(403, "Forbidden", "10.0.0.1 is a private address\r\nInjected: yes")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403 Forbidden\r\n") and b"Connection: close" in head
    assert b"\r\nInjected" not in head  # the reason cannot add a header
    assert body.startswith(b"corral: 10.0.0.1 is a private address")
    assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) == len(body)


@given(st.binary(max_size=300))
def test_no_bytes_crash_the_parsers(data: bytes) -> None:
    for parse in (wire.parse_http_head, wire.parse_socks_greeting, wire.parse_socks_request):
        try:
            parse(data)
        except wire.WireError:
            pass
