"""A model named by its repo, against a real local HTTP server speaking the Hub's protocol.

The repo holds generated quants of one model (F16, Q8_0, Q4_0 whole; Q5_0 in split shards
written by gguf-py's own splitter), an MTP sidecar and a projector. gguf-py cannot quantize to
K-quants, so the 2-bit candidate is the Q4_0 file cut to a Q2_K's size: its name and size are
what the choice reads (the header comes from one file only, and its bytes are never pulled).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lucebox.engine.core.errors import GuardRefusal, UsageError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import config, gpu
from lucebox.engine.machine.budget import budget_for
from lucebox.engine.models import hubrepo, quant
from lucebox.engine.models.modelsource import parse_source
from lucebox.engine.models.records import StoreError
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.planner import installs_of
from lucebox.engine.plan.sources import quantchoice, repoplan
from support.ggufgen import ModelSpec, cached_gguf, write_gguf
from support.hubserver import COMMIT, HubFile, HubState, serve_hub
from tests.conftest import assert_one_line_error, run_lucebox

REPO = "acme/tiny-quants-GGUF"
SPEC = ModelSpec(
    n_layer=8, n_embd=512, n_ff=2048, n_head=4, n_head_kv=2, n_ctx=16384, basename="tiny-quants"
)


@pytest.fixture(scope="module")
def repo_files(tmp_path_factory) -> dict[str, bytes]:
    whole = {
        q or "F16": cached_gguf(dataclasses.replace(SPEC, quant=q)) for q in (None, "Q8_0", "Q4_0")
    }
    files = {f"tiny-quants-{q}.gguf": p.read_bytes() for q, p in whole.items()}
    folder = tmp_path_factory.mktemp("split")
    split = dataclasses.replace(SPEC, quant="Q5_0", split_max_tensors=40)
    write_gguf(folder / "tiny-quants-Q5_0.gguf", split)
    for shard in sorted(folder.glob("*.gguf")):
        files[shard.name] = shard.read_bytes()
    q4 = files["tiny-quants-Q4_0.gguf"]
    files["tiny-quants-Q2_K.gguf"] = q4[: len(q4) * 26 // 45]
    files["mtp-tiny-quants-Q8_0.gguf"] = files["tiny-quants-Q4_0.gguf"][:4096]
    files["mmproj-tiny-quants-F16.gguf"] = files["tiny-quants-Q4_0.gguf"][:2048]
    files["README.md"] = b"# tiny quants\n"
    return files


@pytest.fixture
def hub(monkeypatch, tmp_path, repo_files):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    state = HubState()
    for name, body in repo_files.items():
        state.add(REPO, name, HubFile(body))
    state.add("acme/locked-GGUF", "locked-Q4_0.gguf", HubFile(repo_files["tiny-quants-Q4_0.gguf"]))
    state.gated.add("acme/locked-GGUF")
    state.add("other/unrelated", "model.safetensors", HubFile(b"x" * 64))
    state.downloads.update({REPO: 500, "acme/locked-GGUF": 9000, "other/unrelated": 10**6})
    with serve_hub(state) as served:
        monkeypatch.setenv("HF_ENDPOINT", served.base_url)
        yield served


def test_sources_by_name_parse_to_repo_and_quant(tmp_path, monkeypatch):
    assert parse_source("hf:acme/x-GGUF").repo_id == "acme/x-GGUF"
    by_ollama = parse_source("hf.co/acme/x-GGUF:q4_k_m")
    assert (by_ollama.kind, by_ollama.repo_id, by_ollama.quant) == ("repo", "acme/x-GGUF", "Q4_K_M")
    assert parse_source("acme/x-GGUF:Q8_0").quant == "Q8_0"
    assert parse_source("hf:acme/x-GGUF/file.gguf").kind == "hf"
    # A local path that exists wins over a repo of the same spelling.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "x-GGUF").write_bytes(b"GGUF")
    assert parse_source("acme/x-GGUF").kind == "path"
    with pytest.raises(UsageError):
        parse_source("hf.co/not a repo")


def test_names_give_quants_split_groups_and_sidecars():
    assert quant.quant_from_name("Qwen3-8B-UD-Q4_K_XL.gguf") == "UD-Q4_K_XL"
    assert quant.quant_from_name("model.q8_0.gguf") == "Q8_0"
    assert quant.quant_from_name("BF16/model-00001-of-00002.gguf") == "BF16"
    assert quant.quant_from_name("model.gguf") is None
    rows = [
        quant.RepoFile("m-Q4_K_M.gguf", 10, None),
        quant.RepoFile("m-Q8_0-00002-of-00002.gguf", 5, None),
        quant.RepoFile("m-Q8_0-00001-of-00002.gguf", 6, None),
        quant.RepoFile("m-BF16-00001-of-00003.gguf", 6, None),
        quant.RepoFile("mmproj-m-F16.gguf", 1, None),
        quant.RepoFile("mtp-m-Q4_K_M.gguf", 1, None),
        quant.RepoFile("m-DFlash-draft.gguf", 1, None),
        quant.RepoFile("config.json", 1, None),
    ]
    found = quant.layout(rows)
    groups = {g.quant: [f.path for f in g.files] for g in found.candidates}
    assert groups == {
        "Q4_K_M": ["m-Q4_K_M.gguf"],
        "Q8_0": ["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"],
    }
    assert [s.kind for s in found.sidecars] == ["draft", "mmproj", "mtp"]
    assert found.skipped and "2, 3 of 3" in found.skipped[0]


def test_listing_pins_the_commit_and_reads_one_header_by_closed_ranges(hub, repo_files):
    source = parse_source(REPO)
    listing = hubrepo.list_repo(source)
    assert listing.revision == COMMIT
    quants = {g.quant: g for g in listing.layout.candidates}
    assert set(quants) == {"F16", "Q8_0", "Q5_0", "Q4_0", "Q2_K"}
    assert len(quants["Q5_0"].files) == 2
    assert quants["F16"].first.sha256 == HubFile(repo_files["tiny-quants-F16.gguf"]).sha256
    assert {s.kind for s in listing.layout.sidecars} == {"mtp", "mmproj"}

    header = hubrepo.read_header(listing, source)
    assert header.info.architecture == "llama"
    assert header.info.parameter_count > 30_000_000
    served = {path: n for (repo, path), n in hub.bytes_served.items() if repo == REPO}
    # One file's header, never the quants' weights: a megabyte read of one file.
    assert list(served) == [header.info.path.split("/", 2)[2].split("@")[0]]
    assert sum(served.values()) <= 1 << 20
    ranges = [r[2] for r in hub.requests if "/resolve/" in r[1]]
    assert ranges and all(r is not None and r.split("-")[1] for r in ranges)


def _options(vram_mib: int, **extra: object) -> ServeOptions:
    return ServeOptions(model=REPO, vram_mib=(vram_mib,), **extra)  # type: ignore[arg-type]


def _choose(vram_mib: int, **extra: object) -> repoplan.RepoChoice:
    paths = resolve_paths()
    options = _options(vram_mib, **extra)
    settings = config.load_settings(paths)
    budget = budget_for(gpu.probe_gpus(), (), options.vram_mib)
    source = repoplan.repo_source(options.model)
    assert source is not None
    return repoplan.choose_quant(
        paths,
        source,
        options,
        resolved=resolve(options, settings),
        budget=budget,
        installs=installs_of(),
    )


def test_the_choice_follows_the_budget(hub):
    # Budgets from roomy to tight: the most precise quant with the native 16K context, a split
    # one included; below that, the most context of 3 bits or more (never the 2-bit file).
    chosen = {mib: _choose(mib) for mib in (900, 880, 860, 840)}
    assert {mib: c.document["quant"] for mib, c in chosen.items()} == {
        900: "F16",
        880: "Q8_0",
        860: "Q5_0",
        840: "Q4_0",
    }
    assert chosen[860].source == f"hf:{REPO}/tiny-quants-Q5_0-00001-of-00002.gguf@{COMMIT}"

    def ctx_of(choice: repoplan.RepoChoice, quant: str) -> int:
        return next(c["ctx"] for c in choice.document["candidates"] if c["quant"] == quant)

    assert all(ctx_of(c, c.document["quant"]) == 16384 for mib, c in chosen.items() if mib != 840)
    tight = chosen[840]
    assert ctx_of(tight, "Q2_K") > ctx_of(tight, "Q4_0")
    assert "no quant of 3 bits or more fits with 16,384 tokens" in tight.why
    document = chosen[880].document
    assert document["revision"] == COMMIT and document["quant"] == "Q8_0"
    assert {c["quant"] for c in document["candidates"]} == {"F16", "Q8_0", "Q5_0", "Q4_0", "Q2_K"}
    assert "most precise" in document["why"] and "F16" in document["why"]
    assert {s["kind"] for s in document["sidecars"]} == {"mtp", "mmproj"}


def test_a_named_quant_is_used_or_refused_with_numbers(hub):
    assert _choose(2048, quant="Q4_0").document["quant"] == "Q4_0"
    with pytest.raises(GuardRefusal) as refused:
        _choose(760, quant="F16")
    assert "F16 does not fit" in refused.value.message
    assert "tokens of context" in refused.value.message
    with pytest.raises(UsageError, match="no quant Q6_K"):
        _choose(2048, quant="Q6_K")


def test_below_three_bits_only_when_named():
    def cand(q: str, bpw: float, fits: bool) -> quantchoice.Candidate:
        return quantchoice.Candidate(
            q,
            f"hf:a/b/{q}.gguf@c",
            int(bpw * 1e8),
            bpw,
            fits,
            8192 if fits else 0,
            8192 if fits else 0,
        )

    only_low = (cand("Q8_0", 8.5, False), cand("Q2_K", 2.6, True))
    with pytest.raises(GuardRefusal) as refused:
        quantchoice.choose(only_low, 8192, asked_quant=None, asked_ctx=None)
    assert ":Q2_K" in (refused.value.hint or "")
    named = quantchoice.choose(only_low, 8192, asked_quant="q2_k", asked_ctx=None)
    assert named.chosen.quant == "Q2_K"
    tie = (cand("Q4_K_M", 4.85, True), cand("UD-Q4_K_XL", 4.87, True))
    assert quantchoice.choose(tie, 8192, asked_quant=None, asked_ctx=None).chosen.quant == "Q4_K_M"


def test_gated_and_missing_repos_say_what_to_do(hub):
    with pytest.raises(StoreError, match="gated"):
        hubrepo.read_header(
            hubrepo.list_repo(parse_source("acme/locked-GGUF")), parse_source("acme/locked-GGUF")
        )
    with pytest.raises(StoreError, match="does not exist"):
        hubrepo.list_repo(parse_source("acme/nothing-here"))
    with pytest.raises(StoreError, match="no GGUF"):
        hubrepo.list_repo(parse_source("other/unrelated"))


def test_search_lists_gguf_repos_by_downloads(hub):
    hits = hubrepo.search("acme")
    assert [h.repo_id for h in hits] == ["acme/locked-GGUF", REPO]
    assert hits[0].gated and hits[0].downloads == 9000
    offline = run_lucebox("models", "search", "acme", env={"HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 1 and "HF_HUB_OFFLINE is set" in offline.stderr
    assert_one_line_error(offline)


def test_cli_plan_pull_search_and_quants(hub, tmp_path):
    env = {"HF_ENDPOINT": hub.base_url}
    plan = run_lucebox("plan", "--model", REPO, "--vram-mib", "860", "--json", env=env)
    assert plan.returncode == 0, plan.stderr
    document = json.loads(plan.stdout)
    assert document["source"]["repo"] == REPO and document["source"]["revision"] == COMMIT
    chosen = document["source"]["quant"]
    assert document["fits"] and document["ctx"] >= 16384

    refused = run_lucebox("plan", "--model", f"hf.co/{REPO}:F16", "--vram-mib", "760", env=env)
    assert refused.returncode == 3
    assert_one_line_error(refused)
    assert "F16 does not fit" in refused.stderr

    stray = run_lucebox("plan", "--preset", "smollm2", "--quant", "Q4_0", env=env)
    assert stray.returncode == 2
    assert_one_line_error(stray)

    quants = run_lucebox("models", "quants", REPO, "--vram-mib", "860", "--json", env=env)
    assert quants.returncode == 0, quants.stderr
    table = json.loads(quants.stdout)
    assert table["chosen"] == chosen
    assert all(c["spec"] for c in table["candidates"] if c["fits"])  # what runs beside it

    search = run_lucebox("models", "search", "tiny", env=env)
    assert search.returncode == 0 and REPO in search.stdout

    pulled = run_lucebox("models", "pull", f"{REPO}:Q4_0", "--json", env=env)
    assert pulled.returncode == 0, pulled.stderr
    record = json.loads(pulled.stdout)
    assert record["revision"] == COMMIT and record["sha256_source"] == "hub-lfs"
    assert Path(record["files"][0]["path"]).name == "tiny-quants-Q4_0.gguf"

    gated = run_lucebox("models", "pull", "acme/locked-GGUF", env=env)
    assert gated.returncode == 1
    assert_one_line_error(gated)
    assert "gated" in gated.stderr


def test_without_the_hub_the_last_pull_of_the_repo_serves(hub, monkeypatch):
    env = {"HF_ENDPOINT": hub.base_url}
    pulled = run_lucebox("models", "pull", f"{REPO}:Q4_0", env=env)
    assert pulled.returncode == 0, pulled.stderr
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    plan = run_lucebox("plan", "--model", REPO, "--json", env=offline)
    assert plan.returncode == 0, plan.stderr
    document = json.loads(plan.stdout)
    assert document["target"]["present"] and document["source"]["quant"] == "Q4_0"
    assert "cannot be reached" in document["source"]["why"]
    other = run_lucebox("plan", "--model", f"{REPO}:Q8_0", env=offline)
    assert other.returncode == 1 and "HF_HUB_OFFLINE" in other.stderr
    assert_one_line_error(other)
