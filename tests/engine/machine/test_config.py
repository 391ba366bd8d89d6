from __future__ import annotations

import os

import pytest

from lucebox.engine.core.download import RetryPolicy
from lucebox.engine.core.errors import ConfigError, PathsError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import config
from lucebox.engine.machine.config import Settings
from lucebox.engine.models.pull import retry_policy


@pytest.fixture
def paths():
    return resolve_paths()


def test_missing_file_means_defaults(paths):
    assert config.load_settings(paths) == Settings()


def test_set_then_load_round_trips(paths):
    config.set_setting(paths, "server.port", "8081")
    config.set_setting(paths, "model.allow_base", "yes")
    config.set_setting(paths, "preset", "smoke")
    loaded = config.load_settings(paths)
    assert loaded == Settings(port=8081, allow_base=True, preset="smoke")
    text = paths.config_file.read_text()
    assert "[server]" in text and "port = 8081" in text


def test_rpc_peers_round_trip(paths):
    config.set_setting(paths, "rpc.peers", "10.0.0.2:50052, [::1]:50060")
    loaded = config.load_settings(paths)
    assert loaded.rpc_peers == ("10.0.0.2:50052", "[::1]:50060")
    assert "[rpc]" in paths.config_file.read_text()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[server]\nport = 'eighty'\n", "key 'server.port' should be a integer"),
        ("[server]\nport = true\n", "key 'server.port' should be a integer"),
        ("colour = 'blue'\n", "unknown key 'colour'"),
        ("[model]\nallow_base = 1\n", "key 'model.allow_base' should be a true/false"),
        ("[gpu]\nindex = -1\n", "must not be negative"),
        ("[rpc]\npeers = [50052]\n", "key 'rpc.peers' should be a list of strings"),
    ],
)
def test_bad_values_name_file_key_and_type(paths, text, fragment):
    paths.ensure(paths.config_dir)
    paths.config_file.write_text(text)
    with pytest.raises(ConfigError) as caught:
        config.load_settings(paths)
    message = str(caught.value)
    assert str(paths.config_file) in message
    assert fragment.replace("a integer", "an integer") in message.replace("a integer", "an integer")


def test_corrupt_file_is_refused_and_never_overwritten(paths):
    paths.ensure(paths.config_dir)
    corrupt = "[server\nport = = 3\n"
    paths.config_file.write_text(corrupt)
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load_settings(paths)
    with pytest.raises(ConfigError):
        config.set_setting(paths, "server.port", "9000")
    assert paths.config_file.read_text() == corrupt


def test_reset_keeps_the_bad_file_aside(paths):
    paths.ensure(paths.config_dir)
    paths.config_file.write_text("garbage = [")
    kept = config.reset_config(paths, now_s=0)
    assert kept is not None and kept.name.startswith("config.toml.bad-")
    assert kept.read_text() == "garbage = ["
    assert config.load_settings(paths) == Settings()


def test_failed_write_leaves_the_old_file_whole(paths, monkeypatch):
    config.set_setting(paths, "server.port", "8081")
    before = paths.config_file.read_bytes()

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(ConfigError, match="cannot write"):
        config.set_setting(paths, "server.port", "9000")
    assert paths.config_file.read_bytes() == before
    assert [p.name for p in paths.config_dir.iterdir()] == ["config.toml"]  # no temp file left


def test_config_dir_that_is_a_file(paths):
    paths.config_dir.parent.mkdir(parents=True)
    paths.config_dir.write_text("not a folder")
    with pytest.raises(ConfigError, match="not a folder"):
        config.set_setting(paths, "server.port", "9000")
    assert paths.config_dir.read_text() == "not a folder"


@pytest.mark.parametrize(
    ("key", "raw", "fragment"),
    [
        ("server.port", "x", "integer"),
        ("model.allow_base", "maybe", "true or false"),
        ("nope", "1", "unknown key"),
        ("rpc.peers", "10.0.0.2", "is not a peer address"),
        ("model.vision", "maybe", "takes one of auto, on, off"),
    ],
)
def test_parse_value_rejects_bad_input(key, raw, fragment):
    with pytest.raises(ConfigError, match=fragment):
        config.parse_value(key, raw)


def test_lucebox_home_pointing_to_a_file(tmp_path, monkeypatch):
    target = tmp_path / "a-file"
    target.write_text("keep me")
    monkeypatch.setenv("LUCEBOX_HOME", str(target))
    with pytest.raises(PathsError, match="is a file"):
        resolve_paths()
    assert target.read_text() == "keep me"


def test_lucebox_home_puts_every_folder_inside(tmp_path, monkeypatch):
    monkeypatch.setenv("LUCEBOX_HOME", str(tmp_path / "h"))
    paths = resolve_paths()
    for folder in (
        paths.config_dir,
        paths.data_dir,
        paths.cache_dir,
        paths.state_dir,
        paths.runtime_dir,
    ):
        assert folder.is_relative_to(tmp_path / "h")


def test_download_settings_take_numbers_and_become_the_retry_policy(paths):
    assert retry_policy(Settings()) == RetryPolicy()
    paths.ensure(paths.config_dir)
    paths.config_file.write_text(
        "[download]\nmax_idle_attempts = 4\nstall_s = 2\nbackoff_max_s = 0.5\n"
    )
    loaded = config.load_settings(paths)
    assert retry_policy(loaded) == RetryPolicy(max_idle_attempts=4, stall_s=2.0, backoff_max_s=0.5)
    assert config.set_setting(paths, "download.stall_s", "0.25").download_stall_s == 0.25
    assert "stall_s = 0.25" in paths.config_file.read_text()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[download]\nstall_s = -1\n", "must not be negative"),
        ("[download]\nstall_s = nan\n", "must not be negative"),
        ("[download]\nbackoff_max_s = 'soon'\n", "should be a number"),
        ("[download]\nmax_idle_attempts = 2.5\n", "should be a integer"),
    ],
)
def test_bad_download_settings_are_refused(paths, text, fragment):
    paths.ensure(paths.config_dir)
    paths.config_file.write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        config.load_settings(paths)


def test_a_zero_stall_time_is_refused_before_any_download(paths):
    with pytest.raises(ConfigError, match=r"download.stall_s must be above 0"):
        retry_policy(Settings(download_stall_s=0.0))


def test_lucebox_settings_layer_over_the_file_without_changing_it(paths):
    config.set_setting(paths, "server.port", "9000")
    environ = {config.SETTINGS_ENV: "spec.calibrate_idle_s = 2\nspec.probe_max_tokens = 16"}
    layered = config.load_settings(paths, environ)
    assert (layered.port, layered.calibrate_idle_s, layered.probe_max_tokens) == (9000, 2.0, 16)
    assert config.load_settings(paths, {}).calibrate_idle_s == 30.0
    # A setting changed meanwhile is saved alone: the layer never reaches the file.
    config.set_setting(paths, "server.users", "2")
    assert "calibrate_idle_s" not in paths.config_file.read_text()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("spec.calibrate_idle_s = -1", "must not be negative"), ("spec.nope = 1", "unknown key")],
)
def test_bad_lucebox_settings_name_the_variable(paths, text, fragment):
    with pytest.raises(ConfigError, match=fragment) as caught:
        config.load_settings(paths, {config.SETTINGS_ENV: text})
    assert "$LUCEBOX_SETTINGS" in caught.value.message
