"""Which client's prompt a stop saves into the agent's slot when several people share the
engine: a short chat does not displace an agent's long conversation."""

from __future__ import annotations

from lucebox.engine.run.slots import KEEP_LONGER_S, ClientPrompt, kept_prompt

AGENT = ClientPrompt("/v1/chat/completions", b"x" * 90_000, 100.0)
CHAT = ClientPrompt("/v1/chat/completions", b"y" * 300, 160.0)


def test_one_slot_keeps_the_newest_prompt_as_before():
    assert kept_prompt(AGENT, CHAT, 1) is CHAT
    assert kept_prompt(None, CHAT, 1) is CHAT


def test_several_slots_keep_the_agents_long_conversation_over_a_short_chat():
    assert kept_prompt(AGENT, CHAT, 4) is AGENT
    grown = ClientPrompt(AGENT.path, AGENT.body + b"z" * 50, 200.0)  # the agent's next turn
    assert kept_prompt(AGENT, grown, 4) is grown
    assert kept_prompt(None, CHAT, 4) is CHAT


def test_a_long_prompt_left_alone_for_long_gives_way():
    later = ClientPrompt(CHAT.path, CHAT.body, AGENT.sent_s + KEEP_LONGER_S + 1)
    assert kept_prompt(AGENT, later, 4) is later
