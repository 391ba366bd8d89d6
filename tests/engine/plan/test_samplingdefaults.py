"""The sampling a request that says none gets: preset, else GGUF header, else llama.cpp's rule."""

from __future__ import annotations

import json

import pytest

from lucebox.engine.engines import kinds
from lucebox.engine.models.headerinfo import inspect_model
from lucebox.engine.plan.samplingdefaults import RULE, SamplingDefaults, sampling_defaults
from lucebox.engine.run.front.apishape import shape_request
from lucebox.engine.run.front.shapecontext import ShapeContext


@pytest.mark.parametrize(
    ("preset", "gguf", "wanted"),
    [
        (None, None, (0.8, 0.95, 40, 0.05, "rule")),
        (None, {"temperature": 0.7, "top_k": 20.0}, (0.7, 0.95, 20, 0.05, "gguf")),
        ({"temperature": 0.2, "top_p": 0.9}, {"temperature": 0.7}, (0.2, 0.9, 40, 0.05, "preset")),
        ({"temperature": 0.0}, None, (0.0, 0.95, 40, 0.05, "preset")),
    ],
)
def test_each_field_from_the_preset_else_the_gguf_else_the_rule(preset, gguf, wanted):
    found = sampling_defaults(preset, gguf)
    assert (found.temperature, found.top_p, found.top_k, found.min_p, found.source) == wanted
    assert found.greedy is (wanted[0] == 0.0)
    assert set(found.fields()) == set(RULE)


DEFAULTS = SamplingDefaults(0.6, 0.95, 20, 0.0, "preset")


@pytest.mark.parametrize("engine", ["llama-server", "lucebox"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_unset_sampling_is_filled_the_same_on_both_engines(engine, path):
    context = ShapeContext(kinds.kind(engine), path, "m", 4096, None, DEFAULTS)
    body = {"messages": [{"role": "user", "content": "Hi"}], "top_p": None}
    sent = json.loads(shape_request(context, json.dumps(body).encode()))
    assert {k: sent[k] for k in DEFAULTS.fields()} == DEFAULTS.fields()
    own = {"messages": [], "temperature": 0, "top_k": 1}
    sent = json.loads(shape_request(context, json.dumps(own).encode()))
    assert (sent["temperature"], sent["top_k"], sent["top_p"]) == (0, 1, 0.95)


def test_without_defaults_the_body_passes_byte_for_byte():
    context = ShapeContext(kinds.kind("lucebox"), "/v1/chat/completions", "m", 4096, None)
    body = b'{"messages": [], "temperature": 0.3}'
    assert shape_request(context, body) == body


def test_the_gguf_header_keys_are_read(tmp_path):
    from support.ggufgen import ModelSpec, write_gguf

    extra: dict[str, object] = {"general.sampling.temp": 0.7, "general.sampling.top_k": 20}
    path = write_gguf(tmp_path / "m.gguf", ModelSpec(extra_kv=extra))
    info = inspect_model(path)
    assert info.sampling == {"temperature": pytest.approx(0.7), "top_k": 20.0}
    assert sampling_defaults(None, info.sampling).top_k == 20
