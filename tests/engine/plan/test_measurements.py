"""The measurement store: one JSON file keyed by file, build, card, context and KV type; the
planner's reading of its verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan.speculation import measurements
from lucebox.engine.plan.speculation.measurements import (
    OFF,
    STORE_VERSION,
    Measurement,
    MeasurementKey,
    ProbeRate,
    StoreVersionError,
    TrialRate,
    config_label,
    file_identity,
    measured_choice,
    read_measurement,
    write_measurement,
)
from lucebox.engine.plan.speculation.speculation import SpecCandidate

KEY = MeasurementKey("a.gguf:10:00", None, "cpu b11434", "CPU", 2048, "f16/f16")


def trial(label: str, tokens: int, seconds: float) -> TrialRate:
    spec_type = None if label == OFF else label.split()[0]
    return TrialRate(label, spec_type, None, None, (ProbeRate("edit", tokens, seconds, 4, 2),), 7.0)


def test_a_measurement_is_kept_per_key_and_read_back_whole(lucebox_home: Path):
    paths = resolve_paths({"LUCEBOX_HOME": str(lucebox_home)})
    other = MeasurementKey("a.gguf:10:00", None, "cpu b11434", "CPU", 4096, "f16/f16")
    first = Measurement(KEY).with_trial(trial(OFF, 100, 2.0))
    write_measurement(paths, first)
    write_measurement(paths, Measurement(other).with_trial(trial(OFF, 50, 2.0)))
    done = first.with_trial(trial("ngram-mod", 150, 2.0))
    write_measurement(paths, Measurement(KEY, done.trials, "ngram-mod", "measured"))
    back = read_measurement(paths, KEY)
    assert back is not None and back.chosen == "ngram-mod" and back.why == "measured"
    assert back.ratio("ngram-mod") == 1.5 and back.baseline == trial(OFF, 100, 2.0)
    again = read_measurement(paths, other)
    assert again is not None and again.baseline is not None and again.baseline.tok_s == 25
    document = json.loads(measurements.store_file(paths).read_text())
    assert document["version"] == STORE_VERSION == 2 and len(document["entries"]) == 2


def test_a_broken_or_foreign_store_reads_as_nothing_measured(lucebox_home: Path):
    paths = resolve_paths({"LUCEBOX_HOME": str(lucebox_home)})
    assert read_measurement(paths, KEY) is None
    paths.ensure(paths.data_dir)
    measurements.store_file(paths).write_text("{not json")
    assert read_measurement(paths, KEY) is None
    measurements.store_file(paths).write_text(json.dumps({"version": "x", "entries": {}}))
    assert read_measurement(paths, KEY) is None
    write_measurement(paths, Measurement(KEY))  # a bad file is replaced, not a crash
    assert read_measurement(paths, KEY) == Measurement(KEY)


def test_a_newer_store_is_refused_for_reading_and_writing_and_left_as_it_is(lucebox_home: Path):
    paths = resolve_paths({"LUCEBOX_HOME": str(lucebox_home)})
    paths.ensure(paths.data_dir)
    newer = json.dumps({"version": STORE_VERSION + 1, "entries": {}, "verdicts": {"k": 1}})
    measurements.store_file(paths).write_text(newer)
    for act in (
        lambda: read_measurement(paths, KEY),
        lambda: write_measurement(paths, Measurement(KEY)),
    ):
        with pytest.raises(StoreVersionError) as refused:
            act()
        assert f"is version {STORE_VERSION + 1}, written by a newer lucebox" in str(refused.value)
        assert "move spec-measurements.json aside" in str(refused.value)
    assert measurements.store_file(paths).read_text() == newer


def test_a_version_1_store_is_read_and_rewritten_as_this_version_keeping_its_entries(
    lucebox_home: Path,
):
    paths = resolve_paths({"LUCEBOX_HOME": str(lucebox_home)})
    paths.ensure(paths.data_dir)
    old = Measurement(KEY).with_trial(trial(OFF, 100, 2.0)).to_json()
    del old["guard_off"]
    for probe in old["trials"][0]["probes"]:
        del probe["prefill_s"]
    document = {"version": 1, "entries": {KEY.text(): old}, "prefill": {"m": {"tokens": 1}}}
    measurements.store_file(paths).write_text(json.dumps(document))
    back = read_measurement(paths, KEY)
    assert back is not None and back.guard_off == () and back.baseline == trial(OFF, 100, 2.0)
    write_measurement(paths, back.with_guard_off("ngram-mod", "0.8x of none"))
    stored = json.loads(measurements.store_file(paths).read_text())
    assert stored["version"] == STORE_VERSION and stored["prefill"] == {"m": {"tokens": 1}}
    assert stored["entries"][KEY.text()]["guard_off"] == {"ngram-mod": "0.8x of none"}


def test_a_guard_switch_off_holds_until_the_served_mix_moves():
    m = Measurement(KEY, (trial(OFF, 100, 2.0), trial("ngram-mod", 150, 2.0)), "ngram-mod", "1.5x")
    ngram = SpecCandidate("ngram-mod", False, None, None, "ngram")
    assert measured_choice([ngram], m) is not None and measured_choice([ngram], m) != []
    off = m.with_guard_off("ngram-mod", "decoding at 0.7x of none")
    assert measured_choice([ngram], off) == []
    assert off.switched_off("ngram-mod") == "decoding at 0.7x of none"
    assert Measurement.from_json(json.loads(json.dumps(off.to_json()))) == off
    # Without a verdict (no calibration ran) the switch-off still holds.
    assert measured_choice([ngram], Measurement(KEY).with_guard_off("ngram-mod", "x")) == []
    moved = off.remeasure({"chat": 1.0}, "the mix moved", 9.0)
    assert moved.guard_off == () and measured_choice([ngram], moved) != []


def test_a_file_is_known_by_name_size_and_head_not_by_its_path(tmp_path: Path):
    one, two = tmp_path / "m.gguf", tmp_path / "copy" / "m.gguf"
    two.parent.mkdir()
    one.write_bytes(b"GGUF" + b"\0" * 100)
    two.write_bytes(b"GGUF" + b"\0" * 100)
    assert file_identity(one) == file_identity(two)
    two.write_bytes(b"GGUF" + b"\1" * 100)
    assert file_identity(one) != file_identity(two)
    assert file_identity(tmp_path / "gone.gguf") == "gone.gguf"


def test_labels_name_the_mode_draft_length_and_p_min():
    assert config_label(None, None, None) == OFF
    assert config_label("draft-mtp", 3, 0.75) == "draft-mtp n3 p0.75"
    assert config_label("draft-mtp", 3, 0.0) == "draft-mtp n3 p0"
    assert config_label("ngram-mod", None, None) == "ngram-mod"


def test_the_planner_takes_the_measured_winner_with_its_draft_length_and_p_min():
    mtp = SpecCandidate("draft-mtp", False, 3, 0.75, "the head")
    ngram = SpecCandidate("ngram-mod", False, None, None, "n-gram")
    winner = TrialRate("draft-mtp n3 p0", "draft-mtp", 3, 0.0, (), 1.0)
    m = Measurement(KEY, (trial(OFF, 1, 1.0), winner), "draft-mtp n3 p0", "measured: 1.4x")
    (chosen,) = measurements.measured_choice([mtp, ngram], m) or []
    assert chosen.spec_type == "draft-mtp" and chosen.p_min == 0.0
    assert chosen.why == "the head; served as draft-mtp n3 p0: measured: 1.4x"
    assert measurements.measured_choice([mtp, ngram], Measurement(KEY, (), OFF, "")) == []
    assert measurements.measured_choice([ngram], m) is None  # the winner is not possible now
    assert measurements.measured_choice([mtp], Measurement(KEY)) is None  # no verdict yet
