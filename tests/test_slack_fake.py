"""The fake Slack (``scripts/_slack.py``) read by slack_sdk, Slack's own Python client: its
``WebClient`` for the Web API and its built-in Socket Mode client for the envelopes, so the
fake the Slack bridge is tested against speaks Slack as Slack's client expects it."""

from __future__ import annotations

import threading
import time

import pytest
from scripts._slack import FakeSlack
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.socket_mode.builtin.client import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse

ALICE = "UALICE001"


def test_the_web_api_as_slack_sdk_reads_it(slack_api: FakeSlack) -> None:
    app = slack_api.app()
    app.channel("C0DEV")
    app.channel("C0OUT", member=False)
    web = WebClient(token=app.bot_token, base_url=f"{slack_api.url}/api/")
    me = web.auth_test()
    assert me["user_id"] == app.user_id and me["bot_id"] == app.bot_id
    assert web.conversations_info(channel="C0DEV")["channel"]["is_member"] is True
    blocks = [{"type": "section", "text": {"type": "plain_text", "text": "hi"}}]
    posted = web.chat_postMessage(channel="C0DEV", text="hi &lt;!channel&gt;", blocks=blocks, mrkdwn=False)
    assert app.sent("C0DEV")[0]["text"] == "hi &lt;!channel&gt;" and app.sent("C0DEV")[0]["blocks"] == blocks
    web.chat_update(channel="C0DEV", ts=posted["ts"], text="edited", blocks=[])
    assert app.sent("C0DEV")[0]["text"] == "edited" and app.sent("C0DEV")[0]["blocks"] == []
    web.reactions_add(channel="C0DEV", timestamp=posted["ts"], name="eyes")
    for call, error in ((lambda: web.reactions_add(channel="C0DEV", timestamp=posted["ts"], name="eyes"),
                         "already_reacted"),
                        (lambda: web.chat_postMessage(channel="C0NONE", text="x"), "channel_not_found"),
                        (lambda: web.chat_postMessage(channel="C0OUT", text="x"), "not_in_channel"),
                        (lambda: WebClient(token="xoxb-nobody", base_url=f"{slack_api.url}/api/").auth_test(),
                         "invalid_auth"),
                        (lambda: web.apps_connections_open(app_token=app.bot_token), "not_allowed_token_type")):
        with pytest.raises(SlackApiError) as caught:
            call()
        assert caught.value.response["error"] == error
    app.fail("chat.postMessage", "429", retry_after=2)
    with pytest.raises(SlackApiError) as limited:
        web.chat_postMessage(channel="C0DEV", text="x")
    assert limited.value.response.status_code == 429 and limited.value.response.headers["Retry-After"] == "2"
    assert limited.value.response["error"] == "ratelimited"


def test_socket_mode_as_slack_sdks_client_reads_it(slack_api: FakeSlack) -> None:
    """hello, envelopes acknowledged by slack_sdk's own ack, an unacknowledged one sent again
    with its ``retry_attempt`` on the next connection."""
    app = slack_api.app()
    app.channel("C0DEV")
    got: list[SocketModeRequest] = []
    arrived = threading.Condition()
    ack = {"on": True}

    def listener(client: SocketModeClient, request: SocketModeRequest) -> None:
        with arrived:
            got.append(request)
            arrived.notify_all()
        if ack["on"]:
            client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))

    def wait(n: int) -> None:
        with arrived:
            assert arrived.wait_for(lambda: len(got) >= n, timeout=20), got

    web = WebClient(token=app.app_token, base_url=f"{slack_api.url}/api/")
    client = SocketModeClient(app_token=app.app_token, web_client=web, auto_reconnect_enabled=False,
                             ping_interval=0.5)
    client.socket_mode_request_listeners.append(listener)
    client.connect()
    try:
        said = app.say("C0DEV", ALICE, "hello <@UBOT>")
        wait(1)
        assert got[0].type == "events_api" and got[0].payload["event"]["ts"] == said["ts"]
        assert got[0].payload["event"]["text"] == "hello <@UBOT>" and got[0].retry_attempt == 0
        pressed = app.press("C0DEV", ALICE, said["ts"], "corral_stop")
        slash = app.slash("C0DEV", ALICE, "/corral", "stop")
        wait(3)
        assert got[1].type == "interactive" and got[1].payload["actions"][0]["action_id"] == "corral_stop"
        assert got[2].type == "slash_commands" and got[2].payload["text"] == "stop"
        deadline = time.monotonic() + 20
        while {pressed["envelope_id"], slash["envelope_id"]} - set(app.acked) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert {got[0].envelope_id, pressed["envelope_id"], slash["envelope_id"]} <= set(app.acked)
        ack["on"] = False
        app.react("C0DEV", ALICE, said["ts"], "octagonal_sign")
        wait(4)
        assert got[3].payload["event"]["reaction"] == "octagonal_sign"
        client.disconnect()  # (the socket goes: the reaction was never acknowledged)
        assert got[3].envelope_id not in app.acked
        ack["on"] = True
        client.wss_uri = None  # (a new URL for the new connection: a ticket is good for one)
        client.connect()
        wait(5)
        assert got[4].envelope_id == got[3].envelope_id and got[4].retry_attempt == 1
        assert got[4].retry_reason == "timeout"
    finally:
        client.close()
