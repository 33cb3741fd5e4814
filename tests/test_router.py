"""The router's pure decisions: addressing, mentions, and hand-offs with the hop limit."""

from __future__ import annotations

import pytest

from supervisor.core.router import AddressError, address, did_you_mean, mentions, route

AGENTS = ("claude", "codex", "gemini")


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("@claude please", ("claude",)),
        ("thanks @claude, and @codex.", ("claude", "codex")),
        ("(@claude) wrote it", ("claude",)),
        ("@codex then @claude then @codex", ("codex", "claude")),
        ("mail me@claude.dev", ()),
        ("@claudette is someone else", ()),
        ("@claude-2 is not configured", ()),
        ("@nobody here", ()),
        ("claude without an at", ()),
    ],
)
def test_mentions_count_only_configured_names_on_a_word_boundary(text: str, found: tuple[str, ...]) -> None:
    assert mentions(text, AGENTS) == found


def test_explicit_targets_win_over_mentions_and_come_once() -> None:
    assert address("@codex", to=["claude", "claude"], members=AGENTS, default="claude", configured=AGENTS) == (
        "claude",
    )


def test_mentions_win_over_the_default_agent() -> None:
    assert address("@gemini look", to=[], members=AGENTS, default="claude", configured=AGENTS) == ("gemini",)
    assert address("no one named", to=[], members=AGENTS, default="codex", configured=AGENTS) == ("codex",)


def test_a_mention_of_a_non_member_is_plain_text() -> None:
    assert address("@gemini look", to=[], members=("claude",), default="claude", configured=AGENTS) == ("claude",)


def test_an_unknown_target_names_it_and_suggests_the_closest_agent() -> None:
    with pytest.raises(AddressError, match="unknown agent 'cladue'; did you mean 'claude'") as info:
        address("hi", to=["cladue"], members=AGENTS, default="claude", configured=AGENTS)
    assert info.value.suggestion == "claude"


def test_a_target_outside_a_configured_channel_is_refused() -> None:
    with pytest.raises(AddressError, match="'codex' is not a member of this channel"):
        address("hi", to=["codex"], members=("claude",), default="claude", configured=AGENTS)


def test_did_you_mean_says_nothing_when_nothing_is_close() -> None:
    assert did_you_mean("zzz", AGENTS) is None


def test_a_hand_off_goes_to_every_mentioned_member_but_its_author_one_hop_further() -> None:
    decision = route("@claude @codex @gemini over", author="codex", hops=2, members=AGENTS, may_route=True, max_hops=6)
    assert decision.targets == ("claude", "gemini") and decision.hops == 3 and decision.status() is None


def test_a_hand_off_beyond_max_hops_is_held_back_with_a_status() -> None:
    at_limit = route("@claude", author="codex", hops=5, members=AGENTS, may_route=True, max_hops=6)
    beyond = route("@claude", author="codex", hops=6, members=AGENTS, may_route=True, max_hops=6)
    assert at_limit.targets == ("claude",) and at_limit.hops == 6
    assert beyond.targets == () and beyond.chain_stopped_at == 6
    assert beyond.status() is not None and "stopped at 6 hops" in beyond.status()  # type: ignore[operator]


def test_contract_12_nothing_is_routed_while_the_channel_rests() -> None:
    decision = route("@claude", author="codex", hops=0, members=AGENTS, may_route=False, max_hops=6)
    assert decision.targets == () and decision.status() is None


def test_an_agent_mentioning_only_itself_routes_nowhere() -> None:
    decision = route("@codex note to self", author="codex", hops=0, members=AGENTS, may_route=True, max_hops=6)
    assert decision.targets == ()
