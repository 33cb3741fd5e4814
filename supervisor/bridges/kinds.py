"""corral's own platforms, as its ``corral.bridges`` entry points name them (``pyproject.toml``).

Light on purpose: the config check loads this module, never a platform's (which imports its
HTTP client). Matrix's and IRC's tables are read by the config itself (typed fields of
``BridgeConfig``); Telegram's, Slack's and Discord's are read as a third party's would be,
through :attr:`BridgeType.check`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from .registry import BridgeType, ConfigProblem

MATRIX = BridgeType(
    name="matrix", platform="supervisor.bridges.matrix:MatrixPlatform",
    keys=frozenset({"homeserver", "user", "token_file", "agents"}), secret_keys=frozenset({"token_file"}),
)
IRC = BridgeType(
    name="irc", platform="supervisor.bridges.irc:IrcPlatform",
    keys=frozenset({"server", "nick", "password_file", "tls"}), secret_keys=frozenset({"password_file"}),
)

#: Telegram's own Bot API server (a local ``telegram-bot-api`` server is the other real setup).
TELEGRAM_API = "https://api.telegram.org"
#: How long one ``getUpdates`` waits for an update, by default (seconds).
TELEGRAM_POLL = 30


def _telegram_check(options: Mapping[str, Any], rooms: Mapping[str, str]) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    if "token_file" not in options:
        problems.append(ConfigProblem("token_file", "missing",
                                      'write token_file = "telegram.token" holding the token @BotFather gave'))
    url = options.get("api_url", TELEGRAM_API)
    if not isinstance(url, str) or not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", url):
        problems.append(ConfigProblem("api_url", f"expected the Bot API server's URL, got {url!r}",
                                      f'write api_url = "{TELEGRAM_API}" (or your local Bot API server\'s)'))
    elif url.startswith("http://") and urlsplit(url).hostname not in ("localhost", "127.0.0.1", "::1"):
        problems.append(ConfigProblem("api_url", f"{url} is plain HTTP: the token is in every request's URL",
                                      "use https://, or plain http:// to a Bot API server on this machine only"))
    poll = options.get("poll_timeout", TELEGRAM_POLL)
    # (0 would be short polling: a request after another, as fast as they come back)
    if isinstance(poll, bool) or not isinstance(poll, int) or not 1 <= poll <= 50:
        problems.append(ConfigProblem("poll_timeout", f"expected whole seconds from 1 to 50, got {poll!r}",
                                      f"write poll_timeout = {TELEGRAM_POLL:g}"))
    reaction = options.get("stop_reaction", "🛑")
    if not isinstance(reaction, str) or not reaction.strip() or len(reaction) > 8:
        problems.append(ConfigProblem("stop_reaction", f"expected one emoji, got {reaction!r}",
                                      'write stop_reaction = "🛑" (or one of Telegram\'s reactions, e.g. "👎")'))
    for room in rooms:
        if not re.fullmatch(r"-?[0-9]{1,20}", room):
            problems.append(ConfigProblem(f"rooms.{room}", "is not a Telegram chat id (a number)",
                                          'write "-1001234567890" = "dev" (a group) or "123456789" = "me" '
                                          "(a private chat: the user's id)"))
    return problems


TELEGRAM = BridgeType(
    name="telegram", platform="supervisor.bridges.telegram:TelegramPlatform",
    keys=frozenset({"token_file", "api_url", "poll_timeout", "stop_reaction"}),
    secret_keys=frozenset({"token_file"}), check=_telegram_check,
)

#: Discord's REST API, version 10 (the Gateway's URL comes from its ``GET /gateway/bot``).
DISCORD_API = "https://discord.com/api/v10"
#: A Discord id: a snowflake, a 64-bit number written in decimal.
SNOWFLAKE = r"[0-9]{1,20}"


def _discord_check(options: Mapping[str, Any], rooms: Mapping[str, str]) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    if "token_file" not in options:
        problems.append(ConfigProblem("token_file", "missing", 'write token_file = "discord.token" holding the bot '
                                      "token (Developer Portal → your application → Bot → Reset Token)"))
    url = options.get("api_url", DISCORD_API)
    if not isinstance(url, str) or not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", url):
        problems.append(ConfigProblem("api_url", f"expected Discord's REST API URL, got {url!r}",
                                      f'write api_url = "{DISCORD_API}" (or leave it out)'))
    elif url.startswith("http://") and urlsplit(url).hostname not in ("localhost", "127.0.0.1", "::1"):
        problems.append(ConfigProblem("api_url", f"{url} is plain HTTP: the token is in every request",
                                      "use https://, or plain http:// to a server on this machine only"))
    for room in rooms:
        if not re.fullmatch(SNOWFLAKE, room):
            problems.append(ConfigProblem(f"rooms.{room}", "is not a Discord channel id (a number)",
                                          'write "1234567890123456789" = "dev" (Discord: User Settings → Advanced → '
                                          "Developer Mode, then right-click the channel → Copy Channel ID)"))
    return problems


DISCORD = BridgeType(
    name="discord", platform="supervisor.bridges.discord:DiscordPlatform",
    keys=frozenset({"token_file", "api_url"}), secret_keys=frozenset({"token_file"}), check=_discord_check,
    user_id=SNOWFLAKE,
)

#: Slack's Web API (its ``api_url``; a test's fake Slack is the other).
SLACK_API = "https://slack.com/api"


def _slack_check(options: Mapping[str, Any], rooms: Mapping[str, str]) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    for key, what, prefix in (("bot_token_file", "the Bot User OAuth Token", "xoxb-"),
                              ("app_token_file", "the app-level token (connections:write)", "xapp-")):
        if key not in options:
            problems.append(ConfigProblem(key, "missing", f'write {key} = "slack-{key[:3]}.token" holding {what} '
                                                          f"({prefix}…)"))
    url = options.get("api_url", SLACK_API)
    if not isinstance(url, str) or not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", url):
        problems.append(ConfigProblem("api_url", f"expected the Web API's URL, got {url!r}",
                                      f'write api_url = "{SLACK_API}"'))
    elif url.startswith("http://") and urlsplit(url).hostname not in ("localhost", "127.0.0.1", "::1"):
        problems.append(ConfigProblem("api_url", f"{url} is plain HTTP: the tokens are in every request",
                                      "use https://, or plain http:// to a server on this machine only"))
    if not isinstance(options.get("threads", False), bool):
        problems.append(ConfigProblem("threads", f"expected true or false, got {options['threads']!r}",
                                      "write threads = true (answers in threads) or leave it out"))
    for room in rooms:
        if not re.fullmatch(r"[CGD][A-Z0-9]{2,}", room):
            problems.append(ConfigProblem(f"rooms.{room}", "is not a Slack channel id",
                                          'write "C0123456789" = "dev" (the id is at the bottom of the '
                                          "channel's details, not its #name)"))
    return problems


SLACK = BridgeType(
    name="slack", platform="supervisor.bridges.slack:SlackPlatform",
    keys=frozenset({"bot_token_file", "app_token_file", "api_url", "threads"}),
    secret_keys=frozenset({"bot_token_file", "app_token_file"}), check=_slack_check,
)
