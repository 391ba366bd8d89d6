from __future__ import annotations

import json

import pytest

from tests.conftest import assert_one_line_error, run_lucebox

PLAN_KEYS = {
    "fits",
    "ctx",
    "cache_type_k",
    "cache_type_v",
    "n_gpu_layers",
    "memory_bytes",
    "kvflash_pool_tokens",
    "argv",
    "reasons",
}
MEMORY_KEYS = {"weights", "kv", "draft", "compute", "reserve", "total", "available"}


def test_presets_for_a_24_gib_card():
    result = run_lucebox("presets", "--json", "--vram-mib", "24576")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    # A Lucebox set of the tier first; of those, the largest gain its publisher reported (3.43x
    # against the Gemma 4 pairs' 3.2x and 1.31x), as each one's long context ties them.
    assert report["best"] == "qwen3.6-27b-lucebox"
    for entry in report["presets"]:
        assert entry["reason"] in (("",) if entry["fits"] else ("vram", "offload"))
        assert entry["evidence"]
        assert entry["engine"] == (
            "lucebox" if entry["id"].endswith("-lucebox") else "llama-server"
        )
    small = json.loads(run_lucebox("presets", "--json", "--vram-mib", "4096").stdout)
    assert {e["id"]: e["fits"] for e in small["presets"]}["qwen3.6-27b"] is False


def test_plan_json_shape():
    result = run_lucebox("plan", "--preset", "qwen3.6-27b", "--vram-mib", "24576", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert set(plan) >= PLAN_KEYS
    assert set(plan["memory_bytes"]) >= MEMORY_KEYS
    assert plan["ctx"] % 256 == 0 and plan["fits"]
    assert plan["argv"][plan["argv"].index("-c") + 1] == str(plan["ctx"])
    assert "not available on llama-server" in plan["reasons"]["kvflash_pool"]


def test_a_context_that_does_not_fit_is_refused_not_shrunk():
    result = run_lucebox(
        "plan", "--preset", "qwen3.6-27b", "--vram-mib", "20480", "--ctx", "262144", "--json",
        "--engine", "llama-server",
    )  # fmt: skip
    assert result.returncode == 3
    assert_one_line_error(result)
    assert "largest context that fits is" in result.stderr
    assert json.loads(result.stdout)["ctx"] == 262144


def test_unknown_preset_and_missing_model():
    unknown = run_lucebox("plan", "--preset", "nope")
    assert unknown.returncode == 2 and "known presets" in unknown.stderr
    missing = run_lucebox("plan", "--model", "hf:acme/none/x.gguf")
    assert missing.returncode == 2 and "models pull" in missing.stderr


@pytest.mark.slow
def test_plan_from_the_real_gemma_header_matches_llama_fit_params(built_engine_home):
    from support.realmodels import gemma_model

    result = run_lucebox(
        "plan",
        "--model",
        str(gemma_model()),
        "--ctx",
        "32768",
        "--allow-base",
        "--cache",
        "off",
        "--json",
        env={"LUCEBOX_HOME": str(built_engine_home)},
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["memory_bytes"]["kv"] == 111 * 2**20
    fit = plan["fit_check"]
    assert fit is not None and fit["context_mib"] == 111


def _main_json(capsys, *argv: str) -> tuple[int, dict]:
    from lucebox.app.cli.parser import main

    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


CARDS_GIB = (8, 12, 16, 24, 32, 48, 80)


@pytest.mark.parametrize("gib", CARDS_GIB)
def test_dry_run_launches_exactly_what_plan_prints_for_every_preset(capsys, gib):
    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.models.presets import load_presets

    vram = str(gib * 1024)
    for preset in load_presets(resolve_paths()):
        plan_code, planned = _main_json(capsys, "plan", "--preset", preset.id, "--vram-mib", vram)
        serve_code, dry = _main_json(
            capsys, "serve", "--preset", preset.id, "--vram-mib", vram, "--dry-run"
        )
        assert (plan_code, planned) == (serve_code, dry), preset.id
        argv = planned["argv"]
        if planned["engine"]["kind"] == "lucebox":  # a Lucebox set on its engine: DDTree
            assert argv[argv.index("--draft") + 1] == planned["draft"]["path"]
            assert "--ddtree" in argv and planned["spec"]["type"] == "ddtree"
            assert argv[argv.index("--host") + 1] == "127.0.0.1"
        elif planned["memory_bytes"]["draft"] and planned["spec"]["type"] != "draft-mtp":
            assert argv[argv.index("-md") + 1] == planned["draft"]["path"]
            assert argv[argv.index("-ctkd") + 1] == planned["cache_type_k"]
            assert argv[argv.index("--spec-type") + 1] == planned["spec"]["type"]
        if planned["engine"]["kind"] == "lucebox":
            pass
        elif planned["spec"]["type"]:
            assert argv[argv.index("--spec-type") + 1] == planned["spec"]["type"]
        else:
            assert "--spec-type" not in argv and not planned["memory_bytes"]["draft"]
        assert planned["target"]["path"].endswith(".gguf") and not planned["target"]["present"]
        assert plan_code == (0 if planned["fits"] else 3)


def test_up_dry_run_prints_the_same_document(capsys):
    plan_code, planned = _main_json(capsys, "plan", "--preset", "qwen3-14b", "--vram-mib", "16384")
    up_code, dry = _main_json(
        capsys, "up", "--preset", "qwen3-14b", "--vram-mib", "16384", "--dry-run"
    )
    assert (plan_code, planned) == (up_code, dry) == (0, planned)


def test_the_draft_is_priced_at_the_targets_kv_type_and_shown_why(capsys):
    code, planned = _main_json(capsys, "plan", "--preset", "qwen3-14b", "--vram-mib", "16384")
    assert code == 0 and planned["spec"]["type"] == "draft-simple"
    assert planned["memory_bytes"]["draft"] > 600 * 2**20
    assert planned["cache_type_k"] in planned["reasons"]["draft"]
    squeezed = _main_json(capsys, "plan", "--preset", "qwen3-14b", "--vram-mib", "12288")[1]
    assert squeezed["spec"]["type"] == "ngram-mod"
    assert "not draft-simple: its memory would leave" in squeezed["reasons"]["spec"]


def test_printed_command_is_shell_quoted(capsys, tmp_path):
    import shlex

    from support.ggufgen import write_llama

    model = write_llama(tmp_path / "my model's copy.gguf")
    code, planned = _main_json(capsys, "plan", "--model", str(model), "--allow-base")
    assert code == 0, capsys.readouterr().err
    assert shlex.split(planned["command"]) == planned["argv"]
    assert planned["alias"] == "my model's copy"


def test_plan_refuses_a_truncated_file_as_serve_would(tmp_path):
    from support.ggufgen import write_llama

    model = write_llama(tmp_path / "cut.gguf")
    with model.open("r+b") as handle:
        handle.truncate(model.stat().st_size // 2)
    planned = run_lucebox("plan", "--model", str(model), "--json")
    assert planned.returncode == 3
    assert_one_line_error(planned)
    document = json.loads(planned.stdout)
    assert not document["fits"]
    assert "truncated" in {p["code"] for p in document["target"]["problems"]}
    dry = run_lucebox("serve", "--model", str(model), "--dry-run")
    assert dry.returncode == 3 and "refused by the model check" in dry.stderr


@pytest.mark.slow
def test_the_pinned_capabilities_beside_the_pin_are_the_built_engines(built_engine_home):
    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.engines.registry import list_engines
    from lucebox.engine.plan.engineview import pinned_engine

    engines = list_engines(resolve_paths({"LUCEBOX_HOME": str(built_engine_home)}))
    pinned = pinned_engine().capabilities
    assert engines
    for built in engines:  # earlier builds of the same pin (other options) count too
        assert pinned.spec_types == built.capabilities.spec_types
        assert pinned.kv_cache_types == built.capabilities.kv_cache_types
        assert pinned.model_archs == built.capabilities.model_archs
        assert pinned.swa_patterns == built.capabilities.swa_patterns


@pytest.mark.slow
def test_a_plan_before_the_first_build_is_the_launch_after_it(built_engine_home, tmp_path):
    from support.realmodels import smol_model

    model = str(smol_model())
    before = run_lucebox("plan", "--model", model, "--json")
    after = run_lucebox(
        "plan", "--model", model, "--json", env={"LUCEBOX_HOME": str(built_engine_home)}
    )
    assert before.returncode == after.returncode == 0, before.stderr + after.stderr
    planned, built = json.loads(before.stdout), json.loads(after.stdout)
    assert planned["engine"]["id"] is None and built["engine"]["id"]

    def launch_flags(argv: list[str]) -> list[str]:  # the two homes keep slots apart
        at = argv.index("--slot-save-path")
        return argv[1:at] + argv[at + 2 :]

    assert launch_flags(planned["argv"]) == launch_flags(built["argv"])


def test_a_detached_child_gets_back_every_launch_flag_the_parser_read():
    # One table builds the parser and writes the child's argv: parse, write, parse again.
    from lucebox.app.cli.parser import build_parser
    from lucebox.engine.plan.options import options_from

    given = [
        "serve", "--model", "/m/a.gguf", "--draft", "/m/d.gguf", "--spec", "ngram",
        "--cache", "off", "--ctx", "8192", "--host", "0.0.0.0", "--port", "9000",
        "--gpu", "1", "--allow-base", "--vram-mib", "8192,4096", "--rpc", "h:50052",
        "--mmproj", "/m/mmproj-F16.gguf", "--vision", "on",
    ]  # fmt: skip
    parser = build_parser()
    first = options_from(vars(parser.parse_args(given)))
    again = options_from(vars(parser.parse_args(["serve", *first.to_args()])))
    assert again == first
    assert first.gpus == (1,) and first.vram_mib == (8192, 4096) and first.allow_base
    assert first.mmproj == "/m/mmproj-F16.gguf" and first.vision == "on"


def test_plan_for_several_users_states_each_persons_context():
    result = run_lucebox(
        "plan", "--preset", "qwen3.6-27b", "--vram-mib", "24576", "--engine", "llama-server",
        "--users", "4",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "users: 4 slots share one" in result.stdout
    assert "-np 4" in result.stdout and "--kv-unified" in result.stdout
    shown = run_lucebox(
        "plan", "--preset", "qwen3.6-27b", "--vram-mib", "24576", "--engine", "lucebox",
        "--users", "4", "--json",
    )  # fmt: skip
    users = json.loads(shown.stdout)["users"]
    assert (users["slots"], users["queued"]) == (1, 3) and "queue" in users["reason"]
    refused = run_lucebox("plan", "--preset", "qwen3.6-27b", "--users", "0")
    assert refused.returncode == 2 and "--users" in refused.stderr
