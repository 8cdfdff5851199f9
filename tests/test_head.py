"""The local Ray head: one owner per sweep dir (a lock), heads of different dirs side by side on their
own ports, every socket on loopback, a lost head said as one line, and no process left behind."""

import contextlib
import http.client
import ipaddress
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from isoflop_cli.dispatch import sweep_lock
from isoflop_cli.errors import ConfigError, HeadLost

# One cell whose run trains for some seconds (its job is alive long enough to be looked at).
TINY = ["grid.n=[2]", "grid.B_p=[2]", "grid.eval_points=2", "eval.problems=8", "eval.samples=4", "cluster.local_cpus=1"]


def isoflop_cmd(out: Path, budget: int) -> list[str]:
    return [sys.executable, "-m", "isoflop_cli", "sweep", "--root", str(out), *TINY, f"grid.budgets=[{budget}]"]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def read_head(sweep_dir: Path) -> dict | None:
    try:
        return json.loads((sweep_dir / "ray-head.json").read_text())
    except (OSError, ValueError):
        return None


def job_procs(sweep_dir: Path) -> list[psutil.Process]:
    """The `isoflop run` processes of this sweep's jobs."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "run" in cmd and "isoflop_cli" in cmd and any(str(sweep_dir) in a for a in cmd):
            found.append(p)
    return found


def head_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def non_loopback_listeners(procs: list[psutil.Process]) -> list[str]:
    """'name (pid N) listens on ADDR:PORT' for every TCP listener or unconnected UDP socket not on loopback."""
    bad = []
    for p in procs:
        try:
            conns, name = p.net_connections(kind="inet"), p.name()
        except psutil.Error:
            continue
        for c in conns:
            listens = c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and not c.raddr)
            if not listens:
                continue
            ip = ipaddress.ip_address(c.laddr.ip)
            ip = getattr(ip, "ipv4_mapped", None) or ip
            if not ip.is_loopback:
                bad.append(f"{name} (pid {p.pid}) listens on {c.laddr.ip}:{c.laddr.port}")
    return bad


def tokenless_answers(procs: list[psutil.Process]) -> list[str]:
    """'name (pid N) port P serves PATH' for every TCP listener that answers an HTTP GET of /metrics
    or of the jobs API without the token: a Prometheus exporter, an open dashboard. (The dashboard's
    / is its static page; gRPC servers answer HTTP/1 with nothing and ask for the token themselves.)"""
    bad = []
    for p in procs:
        try:
            ports, name = (
                [c.laddr.port for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN],
                p.name(),
            )
        except psutil.Error:
            continue
        for port, path in itertools.product(ports, ("/metrics", "/api/jobs/")):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                    bad.append(f"{name} (pid {p.pid}) port {port} serves {path} ({r.status})")
            except (OSError, http.client.HTTPException):  # 401, 404, a refused or empty answer
                pass
    return bad


def listeners(procs: list[psutil.Process]) -> int:
    n = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            n += sum(c.status == psutil.CONN_LISTEN for c in p.net_connections(kind="inet"))
    return n


def alive(procs) -> list[str]:
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
        except psutil.Error:
            pass
    return left


def cleanup(clis: list[subprocess.Popen], seen: dict[int, psutil.Process], head_pids: set[int]) -> None:
    """After a failed assertion too: nothing this test started keeps running (each by its own pid)."""
    for cli in clis:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    for pid in head_pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for p in seen.values():
        with contextlib.suppress(psutil.Error):
            p.kill()


def assert_all_gone(seen: dict[int, psutil.Process], sweep_dirs: list[Path], temp_dirs: list[str]) -> None:
    deadline = time.time() + 30
    while alive(seen.values()) and time.time() < deadline:
        time.sleep(0.5)
    assert not alive(seen.values()), f"processes left: {alive(seen.values())}"
    for d in sweep_dirs:
        assert not (d / "ray-head.json").exists()
    for t in temp_dirs:
        assert not os.path.exists(t), f"Ray temp dir left: {t}"


# Fast: no Ray head.


@contextlib.contextmanager
def lock_held_elsewhere(path: Path):
    """Another process holds the sweep lock on `path` until the block ends, then dies by kill -9."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from isoflop_cli.dispatch import sweep_lock\n"
            "with sweep_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(300)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()  # -9: the kernel drops its lock
        holder.wait()


def test_lock_names_its_holder_and_dies_with_it(tmp_path):
    with (
        lock_held_elsewhere(tmp_path) as holder,
        pytest.raises(
            ConfigError,
            match=rf"sweep dir {tmp_path} is in use by isoflop pid {holder.pid} \(started .*\); wait for it or stop it",
        ),
        sweep_lock(tmp_path),
    ):
        pass
    with sweep_lock(tmp_path):
        pass
    with sweep_lock(tmp_path):  # released on exit, in the same process too
        pass


def test_second_sweep_on_a_held_dir_exits_2_and_touches_nothing(tmp_path):
    sweep_dir = tmp_path / "default"
    sweep_dir.mkdir()
    head_file = sweep_dir / "ray-head.json"
    head_file.write_text('{"address": "http://127.0.0.1:1", "pid": 1}\n')
    with lock_held_elsewhere(sweep_dir) as holder:
        result = subprocess.run(isoflop_cmd(tmp_path, 16), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"is in use by isoflop pid {holder.pid}" in lines[0], result.stderr
    assert head_file.read_text() == '{"address": "http://127.0.0.1:1", "pid": 1}\n'
    assert not (sweep_dir / "manifest.json").exists()


def test_a_head_that_does_not_answer_is_lost_in_one_line(tmp_path):
    from isoflop_cli import config
    from isoflop_cli.dispatch import Dispatcher
    from isoflop_cli.store import SweepDir

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    t = time.time()
    with pytest.raises(HeadLost) as e:
        Dispatcher(SweepDir(tmp_path), config.load().cluster, f"http://127.0.0.1:{port}", head_grace_s=2)
    assert 2 <= time.time() - t < 30
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"lost the Ray head at http://127.0.0.1:{port} (no answer for 2s")
    assert str(e.value).endswith("rerun the same command to resume")


def test_a_head_lost_during_the_preflight_is_lost_in_one_line(tmp_path):
    """The preflight probe's requests are as patient as the dispatcher's: a head that stops answering
    while it probes is HeadLost after the grace (one line, exit 1), not a requests traceback."""
    import requests

    from isoflop_cli import config
    from isoflop_cli.dispatch import Dispatcher
    from isoflop_cli.store import CellState, Manifest, SweepDir

    class Gone:  # what Ray's job client raises once its head's process is dead
        def __getattr__(self, name):
            def call(*args, **kwargs):
                raise requests.exceptions.ConnectionError(
                    "('Connection aborted.', ConnectionResetError(104, 'Connection reset by peer'))"
                )

            return call

    cfg = config.load()
    sweep = SweepDir(tmp_path)
    sweep.write_manifest(
        Manifest(
            cells={"a": CellState(state="submitted", submission_id="isoflop-a-1"), "b": CellState(state="finished")}
        )
    )
    dispatcher = Dispatcher(sweep, cfg.cluster, "http://127.0.0.1:1", head_grace_s=1, client=Gone())
    t = time.time()
    with pytest.raises(HeadLost) as e:
        dispatcher.preflight(cfg)
    assert 1 <= time.time() - t < 30
    assert str(e.value).startswith("lost the Ray head at http://127.0.0.1:1 (no answer for 1s: ConnectionError)")
    assert not (tmp_path / ".preflight").exists(), "the shared-dir check leaves nothing behind"
    cells = sweep.manifest().cells
    assert cells["a"].state == "stopped" and cells["b"].state == "finished", (
        "the lost head's job is stopped, a rerun resubmits it"
    )


def test_head_ports_are_distinct_free_and_apart_from_kernel_picks():
    from isoflop_cli.head import free_ports

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first, second = free_ports(11), free_ports(11)  # two heads starting at once draw apart
    assert len(set(first + second)) == 22
    for port in first + second:
        assert port < low and not 23000 <= port < 24000
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_the_port_registry_is_the_users_own_and_nothing_in_it_stops_a_draw(tmp_path, monkeypatch, capsys):
    """The registry lives in a directory only this user writes ($XDG_RUNTIME_DIR, else a cache of the
    user's), not the shared temp dir. Entries that cannot be draws (times ahead of now, for every port) are
    ignored; a lock another process holds is waited for PORTS_LOCK_WAIT_S, then ports are drawn
    without it; with no directory of the user's alone the draw goes on without a registry. Each said
    on stderr where the registry is not used. Once: a held lock waited for ever, future entries
    marked every port taken ("no 3 free ports")."""
    import fcntl
    import json
    import time

    from isoflop_cli import head

    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    registry = run / f"isoflop-ray-ports-{os.getuid()}.json"
    registry.write_text(json.dumps({str(p): time.time() + 1e6 for p in range(1024, 65536)}))
    ports = head.free_ports(3)
    assert len(set(ports)) == 3 and set(json.loads(registry.read_text())) >= {str(p) for p in ports}
    assert capsys.readouterr().err == ""

    monkeypatch.setattr(head, "PORTS_LOCK_WAIT_S", 0.2)
    with open(registry) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        assert len(head.free_ports(3)) == 3 and time.monotonic() - started < 5
    assert "has been locked for 0.2 s by another process: ports drawn without it" in capsys.readouterr().err

    run.chmod(0o777)  # writable by others: not a registry's place, nor are caches like it
    for cache in (tmp_path / "home" / ".cache" / "isoflop", tmp_path / "cache"):
        cache.mkdir(parents=True)
        cache.chmod(0o777)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ISOFLOP_CACHE", str(tmp_path / "cache"))
    assert head._registry() is None and len(head.free_ports(3)) == 3
    assert "no directory of this user's alone for the port registry" in capsys.readouterr().err
    run.chmod(0o700)


def test_the_token_is_made_once_for_this_user_only(tmp_path, monkeypatch):
    from isoflop_cli.head import _ensure_token

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    _ensure_token()
    token = tmp_path / ".ray" / "auth_token"
    first = token.read_text()
    assert len(first) == 64 and int(first, 16) >= 0 and token.stat().st_mode & 0o777 == 0o600
    _ensure_token()
    assert token.read_text() == first and os.listdir(token.parent) == ["auth_token"]


# Slow: real heads.


@pytest.mark.e2e
def test_two_sweeps_at_once_run_their_own_heads_on_loopback(tmp_path):
    """Two sweeps in two dirs start together: each gets its own head (own ports), both finish; every
    socket their heads and jobs listen on is loopback; a third sweep on a held dir is refused without
    touching it; afterwards no process and no head is left. Each sweep's run is frozen (SIGSTOP) once
    checked, until both are: the two heads and runs are up side by side however short the runs."""
    outs = [tmp_path / "a", tmp_path / "b"]
    dirs = [out / "default" for out in outs]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    clis = [
        subprocess.Popen(isoflop_cmd(out, 128), stdout=log.open("w"), stderr=subprocess.STDOUT)
        for out, log in zip(outs, logs)
    ]
    seen: dict[int, psutil.Process] = {}
    heads: dict[int, dict] = {}
    frozen: list[psutil.Process] = []
    third = None
    try:
        checked = [False, False]
        deadline = time.time() + 400
        # Both CLIs (and so both heads) run through both checks: the heads were up side by side.
        while not all(checked) and time.time() < deadline and all(c.poll() is None for c in clis[:2]):
            for i, d in enumerate(dirs):
                head = read_head(d)
                if not head:
                    continue
                heads[i] = head
                if i == 0 and third is None:  # a third sweep on a's dir, while a's head runs
                    before = (d / "ray-head.json").read_bytes()
                    third = subprocess.Popen(
                        isoflop_cmd(outs[0], 128), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                    )
                    clis.append(third)
                jobs = job_procs(d)
                procs = head_tree(head["pid"]) + jobs
                seen.update((p.pid, p) for p in procs)
                if jobs and not checked[i]:
                    time.sleep(1)  # let the run's process settle (imports, model)
                    procs = head_tree(head["pid"]) + job_procs(d)
                    seen.update((p.pid, p) for p in procs)
                    assert not non_loopback_listeners(procs), non_loopback_listeners(procs)
                    assert listeners(procs) >= 8  # the check saw Ray's servers (gcs, raylet, dashboard, agents)
                    assert not tokenless_answers(procs), tokenless_answers(
                        procs
                    )  # no metrics exporter, no open endpoint
                    # The head's temp tree is this user's alone: Ray makes its own dirs 0777, inside a 0700 one.
                    temp = Path(head["temp_dir"])
                    assert temp.stat().st_mode & 0o077 == 0, f"{temp} is {oct(temp.stat().st_mode)}"
                    assert (temp / "ray" / "session_latest" / "sockets").is_dir()  # Ray's sockets and logs lie inside
                    checked[i] = True
                    for job in job_procs(d):  # held until the other sweep is checked too
                        with contextlib.suppress(psutil.NoSuchProcess):
                            job.suspend()
                            frozen.append(job)
            time.sleep(0.2)
        for job in frozen:
            with contextlib.suppress(psutil.NoSuchProcess):
                job.resume()
        assert all(checked), [(c.poll(), log.read_text()[-2000:]) for c, log in zip(clis, logs)]
        assert heads[0]["address"] != heads[1]["address"] and heads[0]["gcs_address"] != heads[1]["gcs_address"]

        out, err = third.communicate(timeout=120)
        assert third.returncode == 2, out[-3000:] + err
        assert err.strip().count("\n") == 0 and f"is in use by isoflop pid {clis[0].pid}" in err, err
        assert clis[0].poll() is None and (dirs[0] / "ray-head.json").read_bytes() == before

        for cli, log in zip(clis, logs):
            assert cli.wait(timeout=400) == 0, log.read_text()[-3000:]
        for d in dirs:
            manifest = json.loads((d / "manifest.json").read_text())
            assert [c["state"] for c in manifest["cells"].values()] == ["finished"]
        assert_all_gone(seen, dirs, [h["temp_dir"] for h in heads.values()])
    finally:
        for job in frozen:
            with contextlib.suppress(psutil.NoSuchProcess):
                job.resume()
        cleanup(clis, seen, {h["pid"] for h in heads.values()})


@pytest.mark.e2e
def test_a_cluster_asking_for_a_token_the_cli_lacks_is_one_line_before_anything_is_written(tmp_path, ray_address):
    """The suite's head takes token auth, as every head isoflop starts does; a sweep given its
    address without RAY_AUTH_MODE=token is refused in one line naming the fix (it was Ray's traceback)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    result = subprocess.run(
        [*isoflop_cmd(tmp_path, 64), f"cluster.address={ray_address}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: the Ray cluster at {ray_address} asks for a token: set RAY_AUTH_MODE=token, with the "
        "cluster's token in ~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
    ]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "limit, value, needle",
    [
        (
            "RLIMIT_NOFILE",
            256,
            "the open-files limit is 256 (ulimit -n); a local Ray head needs at least 1,024: raise it",
        ),
        ("RLIMIT_AS", 8 << 30, "the address-space limit is 8 GiB (ulimit -v)"),
    ],
)
def test_the_machines_limits_for_a_local_head_are_named_before_it_starts(tmp_path, monkeypatch, limit, value, needle):
    """Issue 46: under `ulimit -n 64` a sweep was silent for 120 s, then "no room even for it";
    under `ulimit -v` the head "exited (1) ... see ray-head.log". Variants: 256 open files, 8 GiB of
    address space; one line, exit 2, and no head started (no ray-head.json, no log)."""
    import resource

    from typer.testing import CliRunner

    from isoflop_cli.cli import app

    getrlimit = resource.getrlimit
    monkeypatch.setattr(
        resource,
        "getrlimit",
        lambda which: (value, resource.RLIM_INFINITY) if which == getattr(resource, limit) else getrlimit(which),
    )
    result = CliRunner().invoke(app, ["sweep", "--root", str(tmp_path / "out"), *TINY, "grid.budgets=[16]"])
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(lines) == 1 and needle in lines[0], result.output
    assert not list((tmp_path / "out").rglob("ray-head.*"))


def test_a_temp_dir_too_long_for_rays_sockets_is_named_before_a_head_starts(tmp_path, monkeypatch):
    """Issue 46: a TMPDIR longer than a unix socket's path allows gave "local Ray head exited (1)".
    Variant: a TMPDIR of nested directories, itself well under the limit (Ray's socket paths below
    it pass it), refused without starting anything; /tmp passes."""
    import tempfile

    from isoflop_cli import head

    deep = tmp_path.joinpath(*["d" * 9] * 8)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    monkeypatch.setenv("TMPDIR", str(deep))
    with pytest.raises(
        ConfigError,
        match=rf"the temp dir {deep} \(\$TMPDIR\) is too long for a local Ray head's unix sockets: .* set TMPDIR",
    ):
        head.check_limits()
    monkeypatch.setenv("TMPDIR", "/tmp")
    monkeypatch.setattr(tempfile, "tempdir", None)
    head.check_limits()
