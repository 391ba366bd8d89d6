"""A key per person: made, shown once, stored hashed (0600), revoked; the front asks each
request's key and scope, and sees a change of the file on the next request."""

from __future__ import annotations

import json
import os
import stat

import pytest

from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine.personkeys import KeyWatch, add_key, keys_path, read_keys, revoke_key
from lucebox.engine.run.front.frontguard import Caller, FrontPolicy, Refusal, admit

CHAT = ("POST", "/v1/chat/completions")


def _call(policy: FrontPolicy, key: str | None, method: str, path: str) -> Refusal | Caller:
    headers = {"host": "192.168.1.5:8080"} | ({"authorization": f"Bearer {key}"} if key else {})
    return admit(policy, method, path, headers)


def test_a_key_is_shown_once_and_kept_hashed_and_private():
    paths = resolve_paths()
    made, secret = add_key(paths, "phone", "chat")
    text = keys_path(paths).read_text()
    assert secret not in text and made.sha256 in text
    assert stat.S_IMODE(os.stat(keys_path(paths)).st_mode) == 0o600
    assert read_keys(keys_path(paths)).who(secret) == made
    assert read_keys(keys_path(paths)).who(secret + "x") is None
    with pytest.raises(UsageError, match="a key named 'phone' exists"):
        add_key(paths, "phone", "admin")
    with pytest.raises(UsageError, match="not a key name"):
        add_key(paths, "my phone", "chat")
    with pytest.raises(UsageError, match="no key named 'tablet'") as caught:
        revoke_key(paths, "tablet")
    assert "keys: phone" in (caught.value.hint or "")


def test_the_front_admits_each_key_by_scope_and_forgets_a_revoked_one_at_once():
    paths = resolve_paths()
    watch = KeyWatch(keys_path(paths))
    policy = FrontPolicy("0.0.0.0", 8080, "server-key", people=watch.ring)
    _, phone = add_key(paths, "phone", "chat")
    _, laptop = add_key(paths, "laptop", "models")
    assert _call(policy, phone, *CHAT) == Caller("phone", "chat")
    assert _call(policy, phone, "GET", "/v1/models") == Caller("phone", "chat")
    # What the chat page reads at start: a chat key opens the page.
    assert _call(policy, phone, "GET", "/props") == Caller("phone", "chat")
    props_set = _call(policy, phone, "POST", "/props")
    assert isinstance(props_set, Refusal) and props_set.status == 403
    refused = _call(policy, phone, "POST", "/models/load")
    assert isinstance(refused, Refusal) and refused.status == 403
    assert "has the chat scope; POST /models/load needs models" in refused.message
    assert _call(policy, laptop, "POST", "/models/load") == Caller("laptop", "models")
    slots = _call(policy, laptop, "GET", "/slots")
    assert isinstance(slots, Refusal) and slots.status == 403
    assert _call(policy, "server-key", "GET", "/slots") == Caller("server.api_key", "admin")

    revoke_key(paths, "phone")
    gone = _call(policy, phone, *CHAT)
    assert isinstance(gone, Refusal) and gone.status == 401
    assert _call(policy, laptop, *CHAT) == Caller("laptop", "models")


def test_person_keys_alone_make_a_key_needed_even_on_loopback():
    paths = resolve_paths()
    watch = KeyWatch(keys_path(paths))
    policy = FrontPolicy("127.0.0.1", 8080, None, people=watch.ring)
    assert _call(policy, None, *CHAT) == Caller(None, "admin")
    _, phone = add_key(paths, "phone", "chat")
    refused = _call(policy, None, *CHAT)
    assert isinstance(refused, Refusal) and refused.status == 401
    assert _call(policy, phone, *CHAT) == Caller("phone", "chat")


def test_a_broken_keys_file_admits_no_person_key():
    paths = resolve_paths()
    add_key(paths, "phone", "chat")
    keys_path(paths).write_text(json.dumps({"keys": [{"name": "x"}]}))
    watch = KeyWatch(keys_path(paths))
    assert watch.ring().keys == () and watch.problem is not None
    assert "cannot read the keys file" in watch.problem


def test_replies_count_the_tokens_they_report_else_their_token_events():
    from lucebox.engine.run.front.frontwire import ReplyTokens
    from lucebox.engine.run.front.keyuse import KeyTally

    reported = ReplyTokens()
    reported.see(b'{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":7}}')
    streamed = ReplyTokens()
    for word in ("Hel", "lo", "!"):
        streamed.see(f'data: {{"choices":[{{"delta":{{"content":"{word}"}}}}]}}\n\n'.encode())
    streamed.see(b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n')
    assert (reported.tokens, streamed.tokens) == (7, 3)
    tally = KeyTally()
    tally.count("phone", reported.tokens)
    tally.count("phone", streamed.tokens)
    tally.count(None, 99)  # a request that needed no key belongs to no one
    (use,) = tally.status()
    assert (use.name, use.requests, use.tokens) == ("phone", 2, 10)


def test_the_keys_command_makes_lists_and_revokes():
    from tests.conftest import run_lucebox

    made = run_lucebox("keys", "add", "phone", "--json")
    assert made.returncode == 0, made.stderr
    secret = json.loads(made.stdout)["key"]
    assert secret.startswith("lbk-") and secret not in keys_path(resolve_paths()).read_text()
    listed = run_lucebox("keys", "list", "--json")
    assert [k["name"] for k in json.loads(listed.stdout)["keys"]] == ["phone"]
    again = run_lucebox("keys", "add", "phone")
    assert again.returncode == 2 and "exists" in again.stderr
    gone = run_lucebox("keys", "revoke", "phone")
    assert gone.returncode == 0 and "revoked" in gone.stderr
    assert json.loads(run_lucebox("keys", "list", "--json").stdout)["keys"] == []
