"""`plan` of a served set through the command line: the document, the refusal, the setting."""

from __future__ import annotations

import json

from tests.conftest import assert_one_line_error, run_lucebox


def test_plan_json_of_a_set_on_two_cards():
    result = run_lucebox(
        "plan", "--model", "qwen3.6-27b", "--model", "qwen3-4b",
        "--vram-mib", "24576,24576", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["fits"] is True and document["models_max"] == 2
    assert [m["alias"] for m in document["models"]] == ["qwen3.6-27b", "qwen3-4b"]
    assert {m["env"]["CUDA_VISIBLE_DEVICES"] for m in document["models"]} == {"0", "1"}
    assert "models_max" in document["reasons"]


def test_a_set_that_cannot_fit_is_refused_with_exit_3():
    result = run_lucebox(
        "plan", "--model", "qwen3-4b", "--model", "smollm2", "--vram-mib", "1024", "--json"
    )
    assert result.returncode == 3
    assert_one_line_error(result)
    assert "qwen3-4b needs" in result.stderr
    assert json.loads(result.stdout)["fits"] is False


def test_one_model_is_planned_as_before_and_the_setting_names_a_set():
    one = json.loads(run_lucebox("plan", "--preset", "smollm2", "--json").stdout)
    assert "models" not in one and one["alias"] == "smollm2"
    assert "--models-preset" not in one["argv"]
    setting = run_lucebox("config", "set", "models.served", "smollm2,smoke")
    assert setting.returncode == 0, setting.stderr
    both = json.loads(run_lucebox("plan", "--json").stdout)
    assert [m["alias"] for m in both["models"]] == ["smollm2", "smoke"]


def test_several_model_flags_make_a_set_and_travel_to_a_detached_serve():
    from lucebox.app.cli.args import serve_options
    from lucebox.app.cli.parser import build_parser
    from lucebox.engine.core.paths import resolve_paths

    args = build_parser().parse_args(["serve", "--model", "a.gguf", "--model", "smoke"])
    options = serve_options(args, resolve_paths())
    assert (options.model, options.models) == (None, ("a.gguf", "smoke"))
    assert options.to_args() == ["--model", "a.gguf", "--model", "smoke"]
    one = serve_options(build_parser().parse_args(["serve", "--model", "a.gguf"]), resolve_paths())
    assert (one.model, one.models) == ("a.gguf", ())
