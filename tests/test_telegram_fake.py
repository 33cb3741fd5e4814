"""The fake Bot API server (``scripts/_telegram.py``) checked against python-telegram-bot, a
Telegram client no one here wrote: what the fake answers is what that library reads from
Telegram (its objects, its errors), so the bridge's tests run against the API as documented,
not against a fake shaped to the bridge."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
import telegram
from scripts._telegram import FakeBotApi
from telegram.error import BadRequest, InvalidToken, RetryAfter

pytestmark = pytest.mark.filterwarnings("ignore::telegram.warnings.PTBDeprecationWarning")

ALICE = {"id": 42, "is_bot": False, "first_name": "Alice", "username": "alice_here"}


def test_python_telegram_bot_reads_the_fakes_answers_as_telegrams(telegram_api: FakeBotApi) -> None:
    fake = telegram_api.bot()

    async def drive() -> None:
        async with telegram.Bot(fake.token, base_url=f"{telegram_api.url}/bot") as tg:
            me = await tg.get_me()
            assert me.is_bot and me.username == fake.user["username"] and me.id == fake.user["id"]
            fake.say(42, ALICE, "/stop@someone_bot now")
            updates = await tg.get_updates(timeout=0)
            [update] = updates
            assert update.message is not None and update.message.text == "/stop@someone_bot now"
            assert update.message.from_user is not None and update.message.from_user.id == 42
            assert [e.type for e in update.message.entities] == ["bot_command"]
            chat = await tg.get_chat(42)
            assert chat.type == "private"
            with pytest.raises(BadRequest, match=r"(?i)chat not found"):
                await tg.get_chat(43)

            keyboard = telegram.InlineKeyboardMarkup([[telegram.InlineKeyboardButton("Stop",
                                                                                     callback_data="corral:stop")]])
            sent = await tg.send_message(42, "ask @somebody_else", reply_markup=keyboard,
                                         reply_to_message_id=update.message.message_id)
            assert sent.text == "ask @somebody_else" and [e.type for e in sent.entities] == ["mention"]
            assert sent.reply_markup == keyboard and sent.reply_to_message is not None
            edited = await tg.edit_message_text("asked", chat_id=42, message_id=sent.message_id)
            assert isinstance(edited, telegram.Message) and edited.text == "asked" and edited.reply_markup is None
            assert edited.edit_date is not None
            with pytest.raises(BadRequest, match=r"(?i)message is not modified"):
                await tg.edit_message_text("asked", chat_id=42, message_id=sent.message_id)
            with pytest.raises(BadRequest, match=r"(?i)message text is empty"):
                await tg.send_message(42, "  ")
            with pytest.raises(BadRequest, match=r"(?i)message is too long"):
                await tg.send_message(42, "x" * 4097)

            query = fake.press(42, ALICE, sent.message_id, "corral:stop")
            [pressed] = await tg.get_updates(offset=update.update_id + 1, timeout=1)
            assert pressed.callback_query is not None and pressed.callback_query.id == query
            assert pressed.callback_query.data == "corral:stop"
            assert pressed.callback_query.message is not None
            assert pressed.callback_query.message.message_id == sent.message_id
            assert await tg.answer_callback_query(query)
            with pytest.raises(BadRequest, match=r"(?i)query is too old"):
                await tg.answer_callback_query(query)

            # Reactions come only to a poller that asks for them.
            fake.react(42, ALICE, sent.message_id, "👎")
            assert await tg.get_updates(offset=pressed.update_id + 1, timeout=0) == ()
            [reacted] = await tg.get_updates(offset=pressed.update_id + 1, timeout=0,
                                             allowed_updates=["message", "message_reaction"])
            assert reacted.message_reaction is not None
            assert reacted.message_reaction.new_reaction[0].emoji == "👎"  # type: ignore[union-attr]
            assert await tg.set_message_reaction(42, sent.message_id, "👍")

            # A confirmed update is gone; a negative offset keeps only the newest.
            fake.say(42, ALICE, "one")
            fake.say(42, ALICE, "two")
            [newest] = await tg.get_updates(offset=-1, timeout=0)
            assert newest.message is not None and newest.message.text == "two"

            fake.add_to(-100900, ALICE)
            # (allowed_updates is kept from the last poll that gave it, as Telegram keeps it)
            [added] = await tg.get_updates(offset=newest.update_id + 1, timeout=0,
                                           allowed_updates=["message", "my_chat_member"])
            assert added.my_chat_member is not None and added.my_chat_member.new_chat_member.status == "member"
            assert added.my_chat_member.chat.type == "supergroup" and added.my_chat_member.from_user.id == 42
            fake.say(42, ALICE, None, photo=[{"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1}])
            [photo] = await tg.get_updates(offset=added.update_id + 1, timeout=0)
            assert photo.message is not None and photo.message.photo and photo.message.text is None

            fake.fail("sendMessage", "429", retry_after=3)
            with pytest.raises(RetryAfter) as limited:
                await tg.send_message(42, "too fast")
            assert limited.value.retry_after in (3, timedelta(seconds=3))
        with pytest.raises(InvalidToken):
            async with telegram.Bot("1:not-a-token", base_url=f"{telegram_api.url}/bot") as stranger:
                await stranger.get_me()

    asyncio.run(drive())
