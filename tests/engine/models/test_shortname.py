"""Short names over the shipped presets: family, size, quant, ambiguity, the Hub's answer."""

from __future__ import annotations

import pytest

from lucebox.engine.core.errors import EXIT_USAGE
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.models.presets import load_presets
from lucebox.engine.models.shortname import (
    ModelNameError,
    is_short_name,
    match_name,
    parse_name,
    preset_size,
)
from lucebox.engine.plan.options import ServeOptions

HUB = ("unsloth/Llama-3.2-3B-Instruct-GGUF", "bartowski/Llama-3.2-1B-Instruct-GGUF")


def _hub(text: str) -> list[str]:
    """The Hub's search matches the text inside repo names, in any case."""
    return [repo for repo in HUB if text.lower() in repo.lower()]


def _match(text: str):
    return match_name(text, load_presets(resolve_paths()), _hub)


def test_full_sources_are_not_names(tmp_path):
    for text in ("unsloth/Qwen3-GGUF", "hf:a/b/c.gguf", "pypi:x==1", "model.gguf", "hf.co/a/b"):
        assert not is_short_name(text), text
    here = tmp_path / "qwen3"
    here.write_text("")
    assert not is_short_name(str(here))
    assert is_short_name("qwen3.6:27b-q4_k_m")


def test_tags_read_as_size_then_quant():
    assert (parse_name("gemma4:31b-q4_k_m").size, parse_name("gemma4:31b-q4_k_m").quant) == (
        "31b",
        "Q4_K_M",
    )
    assert parse_name("qwen3.6:35b-a3b").size == "35b-a3b"
    assert (parse_name("qwen3.6:iq3_xxs").size, parse_name("qwen3.6:iq3_xxs").quant) == (
        None,
        "IQ3_XXS",
    )
    with pytest.raises(ModelNameError, match="not a size or a quant: 'large'") as caught:
        parse_name("qwen3.6:large")
    assert caught.value.exit_code == EXIT_USAGE


def test_preset_sizes_come_from_their_ids():
    sizes = {p.id: preset_size(p) for p in load_presets(resolve_paths())}
    assert sizes["qwen3.6-27b-iq3"] == "27b" and sizes["qwen3.6-35b-a3b"] == "35b-a3b"
    assert sizes["gemma4-26b-a4b-lucebox"] == "26b-a4b" and sizes["smollm2"] is None


def test_a_family_names_its_presets_and_the_card_picks():
    found = _match("qwen3.6")
    assert set(found.preset_ids) == {
        "qwen3.6-27b-iq3",
        "qwen3.6-27b",
        "qwen3.6-27b-q6",
        "qwen3.6-27b-lucebox",
        "qwen3.6-35b-a3b",
    }
    assert "the plan picks the one for this card" in found.why
    assert ServeOptions().named(found).preset_among == found.preset_ids
    assert _match("QWEN36").preset_ids == found.preset_ids  # no dot, any case


def test_the_qwen38_family_names_its_three_cards_sets():
    found = _match("qwen3.8")
    assert set(found.preset_ids) == {"qwen3.8-27b-iq3", "qwen3.8-27b", "qwen3.8-27b-q6"}
    assert _match("Qwen38:27b").preset_ids == found.preset_ids
    assert _match("qwen3.8:iq3_xxs").preset_ids == ("qwen3.8-27b-iq3",)
    assert _match("qwen3.8:27b-q6_k").preset_ids == ("qwen3.8-27b-q6",)


def test_size_and_quant_narrow_the_presets():
    assert set(_match("qwen3.6:27b").preset_ids) == {
        "qwen3.6-27b-iq3",
        "qwen3.6-27b",
        "qwen3.6-27b-q6",
        "qwen3.6-27b-lucebox",
    }
    one = _match("gemma4:31b-q4_0")
    assert one.preset_ids == ("gemma4-31b",)
    assert ServeOptions().named(one).preset == "gemma4-31b"
    assert _match("qwen3.6:iq3_xxs").preset_ids == ("qwen3.6-27b-iq3",)  # UD- is the maker's


def test_a_quant_no_preset_has_is_the_presets_repo_at_that_quant():
    found = _match("qwen3.6:27b-q8_0")
    assert (found.preset_ids, found.quant) == ((), "Q8_0")
    assert found.source in {"unsloth/Qwen3.6-27B-MTP-GGUF", "unsloth/Qwen3.6-27B-GGUF"}
    assert "no preset is Q8_0" in found.why
    options = ServeOptions().named(found)
    assert (options.model, options.quant) == (found.source, "Q8_0")


def test_a_preset_id_is_that_preset():
    assert _match("qwen3.6-27b-q6").preset_ids == ("qwen3.6-27b-q6",)
    assert _match("smoke").preset_ids == ("smoke",)


def test_ambiguous_names_list_the_families():
    with pytest.raises(ModelNameError) as caught:
        _match("gemma")
    assert "gemma3: gemma3-12b" in caught.value.message and "gemma4: " in caught.value.message
    assert caught.value.exit_code == EXIT_USAGE


def test_no_preset_goes_to_the_hub_and_unknown_names_say_where_to_look():
    found = _match("llama3.2:1b")
    assert found.source == "bartowski/Llama-3.2-1B-Instruct-GGUF" and found.quant is None
    assert "most downloaded GGUF repo" in found.why
    with pytest.raises(ModelNameError, match="no preset or GGUF repo") as caught:
        _match("zebra")
    assert "lucebox models search zebra" in (caught.value.hint or "")


def test_a_name_and_a_model_flag_are_refused():
    from lucebox.engine.core.errors import UsageError

    with pytest.raises(UsageError, match="both name the model"):
        ServeOptions(model="x.gguf").named(_match("qwen3.6"))
