"""The network policy's decision (``supervisor.core.netpolicy``): pure, so every case is a table.

No address here is ever connected to: each line asks :func:`decide` what the proxy would do.
"""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.netpolicy import (
    Allowed,
    NameRule,
    NetRule,
    PolicyError,
    Refused,
    configured_urls,
    decide,
    grant_for,
    local_urls,
    parse_policy,
    parse_rule,
    public,
)

A = ipaddress.ip_address
INTERNET = parse_policy("internet")

#: Every special range the default must refuse, with the kind its reason names.
NOT_PUBLIC = [
    ("127.0.0.1", "loopback"), ("127.255.0.9", "loopback"), ("::1", "loopback"),
    ("169.254.169.254", "link-local"), ("169.254.0.1", "link-local"), ("fe80::1", "link-local"),
    ("fd00:ec2::254", "private"), ("fc00::1", "private"),
    ("10.0.0.1", "private"), ("172.16.0.1", "private"), ("172.31.255.254", "private"), ("192.168.1.1", "private"),
    ("100.64.0.1", "CGNAT"), ("100.127.255.254", "CGNAT"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("0.1.2.3", "private"),
    ("224.0.0.1", "multicast"), ("239.1.2.3", "multicast"), ("ff02::1", "multicast"), ("ff0e::1", "multicast"),
    ("255.255.255.255", "private"), ("240.0.0.1", "private"),
    ("192.0.2.1", "private"), ("198.51.100.1", "private"), ("203.0.113.1", "private"), ("198.18.0.1", "private"),
    ("2001:db8::1", "private"), ("192.0.0.8", "reserved"),
    # IPv4 in IPv6 clothing: mapped, 6to4 and NAT64 of a loopback / metadata / private address.
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:169.254.169.254", "link-local"), ("::ffff:10.1.2.3", "private"),
    ("2002:7f00:1::1", "loopback"), ("2002:a9fe:a9fe::1", "link-local"), ("2002:c0a8:101::1", "private"),
    ("64:ff9b::7f00:1", "loopback"), ("64:ff9b::a9fe:a9fe", "link-local"), ("64:ff9b::a00:1", "private"),
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "151.101.1.69", "2606:4700::1111", "2a00:1450:4001::200e",
          "::ffff:8.8.8.8", "2002:808:808::1", "64:ff9b::808:808"]


@pytest.mark.parametrize(("address", "kind"), NOT_PUBLIC)
def test_the_default_refuses_every_special_range_and_says_which(address: str, kind: str) -> None:
    assert not public(A(address))
    decision = decide(INTERNET, address, 443, A(address))
    assert isinstance(decision, Refused), decision
    assert kind in decision.reason and "network_allow" in decision.reason


@pytest.mark.parametrize("address", PUBLIC)
def test_the_default_allows_public_addresses(address: str) -> None:
    assert public(A(address))
    assert isinstance(decide(INTERNET, "example.org", 443, A(address)), Allowed)


def test_a_name_is_judged_by_the_address_it_resolved_to_not_by_its_look() -> None:
    # A public-looking name that resolves to the metadata service or loopback: DNS rebinding.
    for address in ("169.254.169.254", "127.0.0.1", "::1", "10.0.0.5"):
        decision = decide(INTERNET, "innocent.example.com", 443, A(address))
        assert isinstance(decision, Refused) and "innocent.example.com" in decision.reason, decision
    # And "localhost" resolving to a public address is judged as that address.
    assert isinstance(decide(INTERNET, "localhost", 80, A("8.8.8.8")), Allowed)


def test_a_grant_opens_exactly_its_address_and_port() -> None:
    policy = parse_policy("internet", ["127.0.0.1:8080", "[::1]:9000", "10.0.0.0/8", "git.internal:443"])
    assert isinstance(decide(policy, "127.0.0.1", 8080, A("127.0.0.1")), Allowed)
    assert isinstance(decide(policy, "127.0.0.1", 8081, A("127.0.0.1")), Refused)
    assert isinstance(decide(policy, "127.0.0.2", 8080, A("127.0.0.2")), Refused)
    assert isinstance(decide(policy, "::1", 9000, A("::1")), Allowed)
    assert isinstance(decide(policy, "::1", 8080, A("::1")), Refused)
    assert isinstance(decide(policy, "10.9.8.7", 5432, A("10.9.8.7")), Allowed)  # any port of the network
    assert isinstance(decide(policy, "192.168.0.1", 5432, A("192.168.0.1")), Refused)
    # A granted name reaches whatever it resolves to (the operator's internal DNS), on its port only.
    assert isinstance(decide(policy, "git.internal", 443, A("172.20.0.4")), Allowed)
    assert isinstance(decide(policy, "GIT.Internal.", 443, A("172.20.0.4")), Allowed)
    assert isinstance(decide(policy, "git.internal", 22, A("172.20.0.4")), Refused)
    # A grant by name is not a grant of the address: another name for it stays refused.
    assert isinstance(decide(policy, "other.example", 443, A("172.20.0.4")), Refused)
    # A mapped loopback address is inside the loopback grant, as the kernel would route it.
    assert isinstance(decide(policy, "::ffff:127.0.0.1", 8080, A("::ffff:127.0.0.1")), Allowed)


def test_only_loopback_ports_granted_one_by_one_are_forwarded_onto_the_turns_loopback() -> None:
    policy = parse_policy("internet", ["127.0.0.1:8080", "[::1]:9000", "localhost:11434", "127.0.0.2:80",
                                       "127.0.0.1", "127.0.0.0/8", "10.0.0.1:5432", "git.internal:443",
                                       "127.0.0.1:8080"])
    assert policy.forwarded == (("127.0.0.1", 8080), ("::1", 9000), ("127.0.0.1", 11434), ("::1", 11434),
                                ("127.0.0.2", 80))
    assert parse_policy("internet", []).forwarded == ()


def test_a_domain_list_allows_exactly_its_names() -> None:
    policy = parse_policy(["api.anthropic.com", "*.githubusercontent.com", "pypi.org:443"])
    pub = A("151.101.0.223")
    assert isinstance(decide(policy, "api.anthropic.com", 443, pub), Allowed)
    assert isinstance(decide(policy, "api.anthropic.com", 8443, pub), Allowed)  # no port: any
    assert isinstance(decide(policy, "raw.githubusercontent.com", 443, pub), Allowed)
    assert isinstance(decide(policy, "a.b.githubusercontent.com", 443, pub), Allowed)
    assert isinstance(decide(policy, "pypi.org", 443, pub), Allowed)
    for host, port in [("githubusercontent.com", 443), ("evilgithubusercontent.com", 443), ("pypi.org", 80),
                       ("anthropic.com", 443), ("api.anthropic.com.evil.net", 443), ("files.pypi.org", 443)]:
        decision = decide(policy, host, port, pub)
        assert isinstance(decision, Refused) and "not in this agent's network" in decision.reason, (host, decision)
    # The address literal of a listed name is not the name.
    assert isinstance(decide(policy, "151.101.0.223", 443, pub), Refused)
    # A listed name that resolves to loopback or the metadata service is refused.
    for address in ("127.0.0.1", "169.254.169.254"):
        decision = decide(policy, "api.anthropic.com", 443, A(address))
        assert isinstance(decision, Refused) and "resolves to" in decision.reason, decision


def test_model_is_the_adapters_hosts_and_the_configured_base_url() -> None:
    policy = parse_policy("model", model_hosts=["api.anthropic.com"], base_urls=["http://127.0.0.1:4000/v1"])
    assert policy.label == "model"
    assert isinstance(decide(policy, "api.anthropic.com", 443, A("160.79.104.10")), Allowed)
    assert isinstance(decide(policy, "127.0.0.1", 4000, A("127.0.0.1")), Allowed)
    assert isinstance(decide(policy, "127.0.0.1", 4001, A("127.0.0.1")), Refused)
    assert isinstance(decide(policy, "pypi.org", 443, A("151.101.0.223")), Refused)
    with pytest.raises(PolicyError, match="names no model API host"):
        parse_policy("model")


def test_host_allows_everything_and_none_nothing() -> None:
    host, none = parse_policy("host"), parse_policy("none")
    assert not host.proxied and not none.proxied and INTERNET.proxied
    for address in ("127.0.0.1", "8.8.8.8", "169.254.169.254"):
        assert isinstance(decide(host, "x", 1, A(address)), Allowed)
        assert isinstance(decide(none, "x", 1, A(address)), Refused)


@pytest.mark.parametrize(("text", "rule"), [
    ("pypi.org", NameRule("pypi.org")),
    ("PyPI.org.:443", NameRule("pypi.org", 443)),
    ("*.example.com", NameRule("*.example.com")),
    ("127.0.0.1:8080", NetRule(ipaddress.ip_network("127.0.0.1/32"), 8080)),
    ("10.0.0.0/8", NetRule(ipaddress.ip_network("10.0.0.0/8"))),
    ("[::1]:8080", NetRule(ipaddress.ip_network("::1/128"), 8080)),
    ("fd00::/8", NetRule(ipaddress.ip_network("fd00::/8"))),
    ("::1", NetRule(ipaddress.ip_network("::1/128"))),
])
def test_rules_parse(text: str, rule: object) -> None:
    assert parse_rule(text) == rule
    assert parse_rule(str(rule)) == rule  # what status shows parses back to the same rule


@pytest.mark.parametrize("text", ["", "*", "a:b", "host:0", "host:70000", "[::1]8080", "a..b", "*.*.com",
                                  "ex ample.com", "10.0.0.0/33", "a/b"])
def test_bad_rules_say_what_is_wrong(text: str) -> None:
    with pytest.raises(PolicyError):
        parse_rule(text)


def test_bad_policies_say_the_fix() -> None:
    with pytest.raises(PolicyError, match="internet"):
        parse_policy("everything")
    with pytest.raises(PolicyError, match='"none"'):
        parse_policy([])


def test_the_migration_finds_local_base_urls_and_words_the_grant() -> None:
    env = {"ANTHROPIC_BASE_URL": "http://127.0.0.1:4000", "OPENAI_API_BASE": "http://localhost:11434/v1",
           "DOCS_URL": "https://example.org", "SOME_TOKEN": "http://not-a-url-key"}
    urls = configured_urls(env, {"base_url": "http://[::1]:9/v1"})
    assert sorted(urls) == sorted(["http://127.0.0.1:4000", "http://localhost:11434/v1", "https://example.org",
                                   "http://[::1]:9/v1"])
    local = local_urls(urls)
    assert "https://example.org" not in local and len(local) == 3
    assert [grant_for(u) for u in local] == ["127.0.0.1:4000", "127.0.0.1:11434", "[::1]:9"]
    for url in local:  # the line check prints is the grant that opens it
        policy = parse_policy("internet", [grant_for(url)])
        rule = policy.grants[0]
        assert isinstance(rule, NetRule)
        assert isinstance(decide(policy, str(rule.network.network_address), rule.port or 0,
                                 rule.network.network_address), Allowed)


# ------------------------------------------------------------------ properties

addresses = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6))


@given(addresses, st.integers(1, 65535))
def test_the_default_allows_an_address_exactly_when_it_is_public(address: ipaddress.IPv4Address, port: int) -> None:
    decision = decide(INTERNET, str(address), port, address)
    assert isinstance(decision, Allowed) == public(address)
    if not address.is_global:  # never more than is_global allows
        assert not public(address) or address.version == 6


@given(addresses)
def test_no_loopback_link_local_or_private_address_is_ever_public(address: ipaddress.IPv4Address) -> None:
    inner = address
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        inner = address.ipv4_mapped  # type: ignore[assignment]
    if inner.is_loopback or inner.is_link_local or inner.is_private or inner.is_multicast or inner.is_unspecified:
        assert not public(address)


@given(addresses, st.integers(1, 65535), st.sampled_from(["internet", "none", ["a.example"]]))
def test_a_grant_of_an_address_always_wins_except_under_none(address: ipaddress.IPv4Address, port: int,
                                                             network: str | list[str]) -> None:
    text = f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
    policy = parse_policy(network, [text])
    decision = decide(policy, str(address), port, address)
    assert isinstance(decision, Allowed) == (network != "none")
    other = port % 65535 + 1  # and only its port: another is judged as if ungranted
    expected = network == "internet" and public(address)
    assert isinstance(decide(policy, str(address), other, address), Allowed) == expected


@given(st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z][a-z0-9-]{0,10}){0,3}", fullmatch=True),
       st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z][a-z0-9-]{0,10}){0,3}", fullmatch=True))
def test_a_listed_name_allows_that_name_only(listed: str, asked: str) -> None:
    policy = parse_policy([listed])
    decision = decide(policy, asked, 443, A("8.8.8.8"))
    assert isinstance(decision, Allowed) == (asked == listed)
    wild = parse_policy([f"*.{listed}"])
    assert isinstance(decide(wild, asked, 443, A("8.8.8.8")), Allowed) == asked.endswith("." + listed)


def test_a_list_refuses_an_unlisted_name_before_it_is_resolved() -> None:
    from supervisor.core.netpolicy import screen

    policy = parse_policy(["api.anthropic.com", "*.example.com"], ["git.internal:443"])
    assert screen(policy, "api.anthropic.com", 443) is None
    assert screen(policy, "x.example.com", 80) is None
    assert screen(policy, "git.internal", 443) is None
    assert isinstance(screen(policy, "git.internal", 22), Refused)
    assert isinstance(screen(policy, "evil.org", 443), Refused)
    assert screen(policy, "1.2.3.4", 443) is None  # an address: judged once known (decide)
    assert screen(INTERNET, "anything.org", 443) is None  # judged by its address
    assert isinstance(screen(parse_policy("none"), "x", 1), Refused)
    with_net = parse_policy(["api.anthropic.com", "203.0.113.0/24"])
    assert screen(with_net, "elsewhere.org", 443) is None  # it might resolve into the network
