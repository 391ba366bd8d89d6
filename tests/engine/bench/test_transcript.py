"""Claude Code JSONL -> chat messages: the shipped session converted exactly, bad lines warned."""

from __future__ import annotations

import json
from pathlib import Path

from lucebox.engine.bench.transcript import parse_transcript

SESSION = Path(__file__).resolve().parents[3] / "assets" / "agent-session.jsonl"


def shipped():
    return parse_transcript(SESSION.read_text("utf-8").splitlines())


def test_the_shipped_session_converts_exactly():
    transcript = shipped()
    assert transcript.warnings == ()
    roles = [m["role"] for m in transcript.messages]
    assert roles == ["user"] + ["assistant", "tool"] * 7 + ["assistant", "user"] + [
        "assistant",
        "tool",
    ] * 4 + ["assistant"]
    assert transcript.call_starts == (1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25)
    assert transcript.tool_names == ("Bash", "Read", "Edit", "Grep")
    first_call = transcript.prompt_of(0)
    assert first_call == [
        {
            "role": "user",
            "content": "Two tests fail in the ledger project: balances with an `until` date and "
            "European amounts like `1.234,56`. Please find the causes and fix them, then run "
            "the tests.",
        }
    ]
    # Thinking, text and tool_use arrive as three records of one streamed message: one turn.
    assert transcript.messages[1] == {
        "role": "assistant",
        "content": "I'll run the tests first to see both failures.",
        "tool_calls": [
            {
                "id": "toolu_01Lbx0001",
                "type": "function",
                "function": {
                    "name": "Bash",
                    "arguments": json.dumps(
                        {"command": "python -m pytest -q", "description": "Run the test suite"}
                    ),
                },
            }
        ],
    }
    assert transcript.messages[2]["tool_call_id"] == "toolu_01Lbx0001"
    assert transcript.messages[2]["content"].startswith("=" * 29 + " test session starts")
    # A turn of only thinking + tool_use keeps no text.
    assert transcript.messages[13]["content"] is None
    assert transcript.messages[13]["tool_calls"][0]["function"]["name"] == "Bash"
    for index, message in enumerate(transcript.messages):
        if message["role"] == "tool":
            calls = transcript.messages[index - 1].get("tool_calls", [])
            assert message["tool_call_id"] in {c["id"] for c in calls}
        assert "thinking" not in json.dumps(message)
    # The summary and snapshot records are no turn; the second task is its own user turn.
    assert transcript.messages[16]["content"].startswith("Thanks. Can you also add")
    assert len(transcript.prompt_of(12)) == 25


def test_bad_lines_warn_with_their_line_and_never_stop_the_conversion():
    lines = [
        json.dumps({"type": "user", "message": {"role": "user", "content": "hi"}}),
        "{not json",
        json.dumps(
            {
                "type": "assistant",
                "message": {
                    "content": [
                        {"type": "text", "text": "calling"},
                        {"type": "server_tool_use", "id": "s1"},
                        {"type": "tool_use", "id": "t1", "name": "Read", "input": {"p": 1}},
                    ]
                },
            }
        ),
        json.dumps(
            {
                "type": "user",
                "message": {
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                        {"type": "tool_result", "tool_use_id": "nope", "content": "orphan"},
                        {"type": "image", "source": {}},
                        {"type": "text", "text": "go on"},
                    ]
                },
            }
        ),
        json.dumps({"type": "assistant", "message": {"role": "assistant"}}),
        "[1, 2]",
        "",
        json.dumps({"type": "assistant", "message": {"content": "done"}}),
    ]
    transcript = parse_transcript(lines)
    assert transcript.warnings == (
        "line 2: not valid JSON; skipped",
        "line 3: skipped an unknown 'server_tool_use' assistant block",
        "line 4: tool_result 'nope' has no tool_use before it; skipped",
        "line 4: skipped an unknown 'image' user block",
        "line 5: assistant record without message content; skipped",
        "line 6: not a JSON object; skipped",
    )
    assert [m["role"] for m in transcript.messages] == [
        "user",
        "assistant",
        "tool",
        "user",
        "assistant",
    ]
    assert transcript.messages[2] == {"role": "tool", "tool_call_id": "t1", "content": "ok"}
    assert transcript.messages[3]["content"] == "go on"
    assert transcript.call_starts == (1, 4)


def test_merged_user_records_and_block_tool_results():
    lines = [
        json.dumps({"type": "user", "message": {"content": "one"}}),
        json.dumps({"type": "user", "message": {"content": [{"type": "text", "text": "two"}]}}),
        json.dumps(
            {
                "type": "assistant",
                "message": {
                    "content": [{"type": "tool_use", "id": "a", "name": "Bash", "input": {}}]
                },
            }
        ),
        json.dumps(
            {
                "type": "assistant",
                "message": {
                    "content": [{"type": "tool_use", "id": "b", "name": "Bash", "input": {}}]
                },
            }
        ),
        json.dumps(
            {
                "type": "user",
                "message": {
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "a",
                            "content": [
                                {"type": "text", "text": "x"},
                                {"type": "text", "text": "y"},
                            ],
                        },
                        {"type": "tool_result", "tool_use_id": "b", "content": "z"},
                    ]
                },
            }
        ),
    ]
    transcript = parse_transcript(lines)
    assert transcript.warnings == ()
    assert transcript.messages[0] == {"role": "user", "content": "one\n\ntwo"}
    assert [c["id"] for c in transcript.messages[1]["tool_calls"]] == ["a", "b"]
    assert transcript.messages[2]["content"] == "x\ny"
    assert transcript.messages[3] == {"role": "tool", "tool_call_id": "b", "content": "z"}
    assert transcript.call_starts == (1,)


def test_an_opening_assistant_turn_is_no_call():
    lines = [
        json.dumps({"type": "assistant", "message": {"content": "hello"}}),
        json.dumps({"type": "user", "message": {"content": "hi"}}),
        json.dumps({"type": "assistant", "message": {"content": "yes"}}),
    ]
    transcript = parse_transcript(lines)
    assert transcript.call_starts == (2,)
    assert transcript.warnings == (
        "the transcript opens with an assistant turn; that call skipped",
    )
