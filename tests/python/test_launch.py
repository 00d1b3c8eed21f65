"""ps-launch (ps_server.launch): shards and worker processes of a script on this machine;
the environment each worker gets, the summary, exit statuses, a failing worker, and the
shards' data plane (--data-plane)."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest
from conftest import assert_joined_late, joining_script, run_joiner, wait_past_round_5

SCRIPT = textwrap.dedent("""
    import os, sys
    import numpy as np
    import ps_server

    shards = os.environ["PS_SHARDS"].split(",")
    me = int(os.environ["PS_WORKER_ID"])
    n = int(os.environ["PS_NUM_WORKERS"])
    if len(sys.argv) > 1 and sys.argv[1] == "fail" and me == 1:
        sys.exit(3)
    w = ps_server.Worker(shards, me, [("w", 100)], initial=[np.zeros(100, np.float32)],
                         token_file=os.environ.get("PS_TOKEN_FILE", ""),
                         tls_ca=os.environ.get("PS_TLS_CA", ""),
                         tls_cert=os.environ.get("PS_TLS_CERT", ""),
                         tls_key=os.environ.get("PS_TLS_KEY", ""), connect_timeout=30)
    out = np.empty(100, np.float32)
    restart = int(os.environ["PS_RESTART_COUNT"])
    # From the shards' version on: 0 at the start, where the job is after a restart.
    for t in range(w.start_version, 3):
        w.pull_all(t, [out], timeout=30)
        if len(sys.argv) > 1 and sys.argv[1] == "crash" and me == 1 and t == 1 and not restart:
            os._exit(5)  # dies in round 1 before pushing, telling nobody
        w.push(0, t, np.full(100, me + 1, np.float32))
        w.wait_pushes()
    w.pull_all(3, [out], timeout=30)
    print(f"worker {me}/{n}: {out[0]:.3f} over {w.data_plane}, local rank "
          f"{os.environ['LOCAL_RANK']}, restart {restart}, from version {w.start_version}",
          flush=True)
    w.close()
""")


def launch(tmp_path, server_bin, *args, workers=3, launcher_args=()):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "ps_server.launch", "--shards", "2", "--workers",
           str(workers), "--lr", "1", "--momentum", "0", "--server", server_bin,
           "--log-dir", str(tmp_path / "logs"), *launcher_args, str(script), *args]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=240)


def test_workers_train_through_the_launcher(tmp_path, server_bin):
    # On the default data plane, TCP: every shard gets a data port of its own, and the
    # workers (no data_plane of their own) follow the shards onto it.
    done = launch(tmp_path, server_bin)
    assert done.returncode == 0, done.stderr
    # Worker 0 prints here; mean of 1, 2, 3 is 2, three steps of lr 1: -6.
    assert "worker 0/3: -6.000 over tcp, local rank 0" in done.stdout
    # Every worker is on this host: torchrun's LOCAL_RANK is the worker id.
    assert "worker 2/3: -6.000 over tcp, local rank 2" in \
        (tmp_path / "logs" / "worker-2.log").read_text()
    line = next(l for l in done.stderr.splitlines() if "shard(s) at" in l)
    control = [int(a.rsplit(":", 1)[1]) for a in line.split(" at ")[1].split(" ")[0].split(",")]
    data = [int(p) for p in line.split("data plane tcp on ports ")[1].split(")")[0].split(",")]
    assert len(control) == len(data) == 2 and len(set(control + data)) == 4, line
    for w in range(3):
        assert f"  worker {w}: ok" in done.stderr


def test_data_plane_grpc_moves_the_tensors_over_the_control_port(tmp_path, server_bin):
    # The workers follow the shards onto gRPC and train to the same values; no data port.
    done = launch(tmp_path, server_bin, launcher_args=["--data-plane", "grpc"])
    assert done.returncode == 0, done.stderr
    assert "worker 0/3: -6.000 over grpc" in done.stdout
    assert "worker 2/3: -6.000 over grpc" in (tmp_path / "logs" / "worker-2.log").read_text()
    assert "2 shard(s) at 127.0.0.1:" in done.stderr and "data plane" not in done.stderr


@pytest.mark.parametrize("plane", ["grpc", "tcp"])
def test_tls_dir_serves_mutual_tls_and_hands_workers_their_certificates(tmp_path, server_bin,
                                                                        plane):
    # On either data plane: the TCP plane's ports serve the same mutual TLS.
    certs = tmp_path / "certs"
    make_certs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy",
                              "tls", "make-certs.sh")
    subprocess.run(["bash", make_certs, str(certs), "2", "2"], check=True,
                   stdout=subprocess.DEVNULL, timeout=120)
    done = launch(tmp_path, server_bin, workers=2,
                  launcher_args=["--tls-dir", str(certs), "--data-plane", plane])
    assert done.returncode == 0, done.stderr
    assert f"worker 0/2: -4.500 over {plane}" in done.stdout  # mean of 1 and 2, 3 steps of lr 1
    # Without the certificates the launcher says what is missing.
    done = launch(tmp_path, server_bin, workers=2,
                  launcher_args=["--tls-dir", str(tmp_path / "nothing")])
    assert done.returncode == 1 and "lacks ca.pem" in done.stderr, done.stderr


def test_a_failing_worker_fails_the_launch_and_stops_the_others(tmp_path, server_bin):
    done = launch(tmp_path, server_bin, "fail")
    assert done.returncode == 1, done.stderr
    assert "worker 1 exited with status 3; stopping the others" in done.stderr
    assert "  worker 1: exit status 3" in done.stderr


def test_max_restarts_restarts_a_failed_worker_which_resumes_at_the_shards_version(
        tmp_path, server_bin):
    # Worker 1 dies in round 1; restarted in place, it joins at version 1 (round 1 waits
    # for it: f = 0) and the job ends as if nothing happened: -6 as in the first test.
    done = launch(tmp_path, server_bin, "crash", launcher_args=["--max-restarts", "2"])
    assert done.returncode == 0, done.stderr
    assert ("worker 1 exited with status 5; restarting it (restart 1 of --max-restarts 2)"
            in done.stderr), done.stderr
    assert "worker 0/3: -6.000 over tcp, local rank 0, restart 0" in done.stdout
    log = (tmp_path / "logs" / "worker-1.log").read_text()
    assert "worker 1/3: -6.000 over tcp, local rank 1, restart 1, from version 1" in log, log
    assert "  worker 1: ok (restarted 1 time)" in done.stderr
    # Without restarts left the failure stops the job as before.
    done = launch(tmp_path, server_bin, "fail", launcher_args=["--max-restarts", "1"])
    assert done.returncode == 1
    assert "restarting it (restart 1 of --max-restarts 1)" in done.stderr
    assert "worker 1 exited with status 3; stopping the others" in done.stderr
    assert "  worker 1: exit status 3 (restarted 1 time)" in done.stderr


def test_the_ps_launch_command_is_the_module(tmp_path, server_bin):
    # build/bin/ps-launch finds the package of its build tree and the ps-server beside it.
    command = os.path.join(os.path.dirname(server_bin), "ps-launch")
    done = subprocess.run([command, "--help"], stdout=subprocess.PIPE, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0 and "--workers" in done.stdout


def test_max_workers_lets_a_worker_join_the_running_job_through_job_env(tmp_path, server_bin):
    script = tmp_path / "train.py"
    script.write_text(joining_script(rounds=100, pause=0.03, hold=tmp_path / "joined"))
    logs = tmp_path / "logs"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ps_server.launch", "--shards", "2", "--workers", "2",
         "--max-workers", "3", "--lr", "0.01", "--momentum", "0", "--server", server_bin,
         "--log-dir", str(logs), str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_past_round_5(logs / "worker-1.log", launcher)  # the job is under way
        assert (logs / "job.env").exists()  # written before any worker starts
        shared = dict(line.split("=", 1) for line in
                      (logs / "job.env").read_text().splitlines())
        assert shared["PS_NUM_WORKERS"] == "3" and "PS_RUN_DIR" in shared, shared
        assert not any("TOKEN" in k for k in shared), "job.env holds no token"
        joined = run_joiner([sys.executable, str(script)],
                            [logs / f"shard-{i}.log" for i in range(2)], tmp_path / "joined",
                            env=dict(os.environ, **shared, PS_WORKER_ID="2"))
        out, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
        launcher.wait()
    assert joined.returncode == 0, joined.stderr
    assert launcher.returncode == 0, err
    assert "worker ids 2 to 2 may join: env $(cat " in err, err
    assert joined.stdout.startswith("worker 2 of 3: from version "), joined.stdout
    assert_joined_late(joined.stdout, out, rounds=100)


def test_shards_at_runs_workers_against_shards_that_already_run(tmp_path, server_bin):
    from ps_server.launch import Shards
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    with Shards(2, 3, lr=1, momentum=0, server=server_bin) as shards:
        # Here, then through the hosts' wrapper (the token files over its channel): the
        # second job finds the model at version 3 and trains no further.
        for hosts, expected in (
                ([], "worker 0/3: -6.000 over tcp, local rank 0, restart 0, from version 0"),
                (["-H", "localhost:3"], "[worker 0@localhost] worker 0/3: -6.000 over tcp, "
                                        "local rank 0, restart 0, from version 3")):
            done = subprocess.run(
                [sys.executable, "-m", "ps_server.launch", "--workers", "3", "--shards-at",
                 ",".join(shards.addresses), "--run-dir", shards.run_dir, *hosts,
                 "--log-dir", str(tmp_path / f"logs{len(hosts)}"), str(script)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=240)
            assert done.returncode == 0, done.stderr
            assert f"2 shard(s) at {','.join(shards.addresses)}" in done.stderr
            assert expected in done.stdout, done.stdout
    done = subprocess.run([sys.executable, "-m", "ps_server.launch", "--workers", "1",
                           "--shards-at", "127.0.0.1:1", str(script)],
                          stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 1 and "needs the workers' credentials" in done.stderr, done.stderr


def test_bad_arguments(tmp_path, server_bin):
    done = subprocess.run([sys.executable, "-m", "ps_server.launch", "--workers", "2",
                           str(tmp_path / "missing.py")], stderr=subprocess.PIPE, text=True)
    assert done.returncode == 2 and "no script" in done.stderr
    script = tmp_path / "x.py"
    script.write_text("")
    done = subprocess.run([sys.executable, "-m", "ps_server.launch", "--workers", "2",
                           "--aggregator", "krum", "--server", server_bin, str(script)],
                          stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 1 and "krum" in done.stderr, done.stderr
    done = subprocess.run([sys.executable, "-m", "ps_server.launch", "--workers", "2",
                           "--data-plane", "udp", str(script)],
                          stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 2 and "invalid choice: 'udp'" in done.stderr, done.stderr
    # The plane as a shard flag would leave the launcher's data ports and start line
    # wrong: refused, naming ps-launch's own flag.
    for server_arg in (["--server-arg=--data-plane", "--server-arg=grpc"],
                       ["--server-arg=--data-port=7072"]):
        done = subprocess.run([sys.executable, "-m", "ps_server.launch", "--workers", "2",
                               *server_arg, str(script)],
                              stderr=subprocess.PIPE, text=True, timeout=60)
        assert done.returncode == 2 and "give the plane as ps-launch --data-plane" in \
            done.stderr, done.stderr
    done = subprocess.run([sys.executable, "-m", "ps_server.launch", "--workers", "2",
                           "--max-restarts", "-1", str(script)],
                          stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 2 and "--max-restarts -1: must be 0 or more" in done.stderr
    done = subprocess.run([sys.executable, "-m", "ps_server.launch", "--workers", "2",
                           "--max-workers", "1", str(script)],
                          stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 2 and "--max-workers 1: must be at least --workers 2" in \
        done.stderr, done.stderr
    from ps_server.launch import Shards
    with pytest.raises(ValueError, match="data_plane must be one of grpc, tcp or None"):
        Shards(1, 1, server=server_bin, data_plane="TCP")


def test_a_port_taken_before_the_shard_binds_is_picked_again(tmp_path, server_bin, monkeypatch):
    from ps_server import launch as launch_module
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    real = launch_module.free_ports
    calls = []

    def first_taken(count):
        ports = real(count)
        calls.append(ports)
        if len(calls) == 1:
            ports[1] = taken
        return ports

    try:
        monkeypatch.setattr(launch_module, "free_ports", first_taken)
        with launch_module.Shards(2, 1, server=server_bin, log_dir=str(tmp_path / "a")) as shards:
            assert len(calls) == 2
            assert shards.alive() and f"127.0.0.1:{taken}" not in shards.addresses

        def always_taken(count):
            return [taken] + real(count)[1:]

        monkeypatch.setattr(launch_module, "free_ports", always_taken)
        with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{taken}"):
            launch_module.Shards(2, 1, server=server_bin, log_dir=str(tmp_path / "b")).start()

        # On the TCP data plane the launcher picks a data port per shard (after the S
        # control ports); one taken (here shard 0's) is picked again the same way.
        calls.clear()

        def data_port_taken(count):
            ports = real(count)
            calls.append(ports)
            if len(calls) == 1:
                assert count == 4
                ports[2] = taken
            return ports

        monkeypatch.setattr(launch_module, "free_ports", data_port_taken)
        with launch_module.Shards(2, 1, server=server_bin, log_dir=str(tmp_path / "c"),
                                  data_plane="tcp") as shards:
            assert len(calls) == 2 and shards.alive()
            assert len(shards.data_ports) == 2 and taken not in shards.data_ports
            assert "cannot listen on" in open(tmp_path / "c" / "shard-0.log").read()
    finally:
        holder.close()


def test_shards_at_an_address_where_nothing_listens_is_an_error_naming_it(tmp_path):
    from ps_server.launch import AttachedShards
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
        shards = AttachedShards([address], 1, insecure=True, log_dir=str(tmp_path),
                                startup_timeout=0.3)
        with pytest.raises(RuntimeError, match=f"shard 0 at {address} does not accept "
                                                "connections: .*[Rr]efused"):
            shards.start()
