"""ps-launch: shards and workers of a training script on this machine, like torchrun.

    ps-launch --shards 2 --workers 6 --byzantine 1 --aggregator trimmed_mean \\
        train.py --epochs 3
    python3 -m ps_server.launch ...           # the same

It starts S ps-server processes on free loopback ports (authenticated, as by default:
they share a private run directory holding the cluster secret and one token file per
worker; each also gets a free --data-port for the native TCP data plane, the default,
which the workers follow), waits until each serves, then starts W copies of the
script with
`sys.executable`, each with the environment ps_server.torch.init() reads:

    PS_SHARDS        host:port of every shard, comma-separated, by shard id
    PS_WORKER_ID     this process's worker id, in [0, W)
    PS_NUM_WORKERS   W
    PS_TOKEN_FILE    this worker's token file (absent with --insecure or --tls-dir)
    PS_TLS_CA, PS_TLS_CERT, PS_TLS_KEY
                     with --tls-dir: the CA and this worker's certificate and key

The same variables are the contract of the Kubernetes worker Job (docs/deploy.md), which
authenticates with TLS client certificates as --tls-dir does.
Worker 0's output goes to this terminal, every process's to a log file in --log-dir.
SIGINT and SIGTERM are forwarded to every process. At the end it prints one line per
process (exit status, seconds) and exits 0 only when every worker exited 0 and no shard
died meanwhile. docs/python.md, "ps-launch".
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ._launch_args import DATA_PLANES, parse_args
from ._remote import RemoteShards, Srun, Ssh, parse_hosts, read_hostfile, slurm_hosts
from ._shard_set import ShardSet, connect_error, opens_data_ports

__all__ = ["DATA_PLANES", "Shards", "find_server", "main"]

ENV_SHARDS = "PS_SHARDS"
ENV_WORKER_ID = "PS_WORKER_ID"
ENV_NUM_WORKERS = "PS_NUM_WORKERS"
ENV_TOKEN_FILE = "PS_TOKEN_FILE"
ENV_RUN_DIR = "PS_RUN_DIR"  # the shards' --run-dir: init() finds token-worker-RANK there
ENV_LOCAL_RANK = "LOCAL_RANK"  # as torchrun sets it: every ps-launch worker is on this host
# TLS, where the shards use it (the Kubernetes worker Job: docs/deploy.md).
ENV_TLS_CA = "PS_TLS_CA"
ENV_TLS_CERT = "PS_TLS_CERT"
ENV_TLS_KEY = "PS_TLS_KEY"


def find_server(explicit=None):
    """The ps-server binary: `explicit`, $PS_SERVER_BIN, the build tree this package was
    built in (<build>/bin/ps-server), or ps-server on $PATH."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [explicit, os.environ.get("PS_SERVER_BIN"),
                  os.path.join(here, "..", "..", "bin", "ps-server"), shutil.which("ps-server")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise FileNotFoundError("no ps-server binary: pass --server or set PS_SERVER_BIN")


def free_ports(count):
    """`count` distinct free TCP ports on 127.0.0.1 (held open together while chosen)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Shards(ShardSet):
    """S ps-server processes on loopback for W workers (a context manager).

    `server_args` are further ps-server flags ("--pull-codec", "fp16", ...). With
    `insecure`, the shards run without authentication (loopback only). With `tls_dir` (the
    output of deploy/tls/make-certs.sh: ca.pem, shard-N.pem/.key, worker-N.pem/.key) they
    serve mutual TLS: shard N presents shard-N.pem, a worker is who its certificate
    names (tls(worker) gives a worker's options). Otherwise they share `run_dir` (a new
    private temporary directory by default), where each writes the token files
    (token_file(worker) names them). `data_plane` ("grpc" or "tcp"; None leaves the
    shards' default, tcp) is every shard's --data-plane; on tcp each shard also gets a
    free --data-port (data_ports lists them), kept across restart(); with `tls_dir` the
    data ports serve the same mutual TLS. `max_workers` (None: `workers`) is the shards'
    --max-workers: worker ids from `workers` on may join the running job later, and the
    workers' PS_NUM_WORKERS is then max_workers (the id space).
    """

    def __init__(self, num_shards, workers, byzantine=0, aggregator="mean", lr=0.1,
                 momentum=0.9, server_args=(), server=None, run_dir=None, log_dir=None,
                 insecure=False, tls_dir=None, startup_timeout=60.0, data_plane=None,
                 max_workers=None):
        if num_shards < 1 or workers < 1:
            raise ValueError("need at least one shard and one worker")
        if max_workers is not None and max_workers < workers:
            raise ValueError(f"max_workers {max_workers} is below workers {workers}")
        if insecure and tls_dir:
            raise ValueError("insecure and tls_dir exclude each other")
        if data_plane is not None and data_plane not in DATA_PLANES:
            raise ValueError(f"data_plane must be one of {', '.join(DATA_PLANES)} or None, "
                             f"got {data_plane!r}")
        self.data_plane = data_plane
        self.tls_dir = os.path.abspath(tls_dir) if tls_dir else None
        if self.tls_dir:
            missing = [f for f in ["ca.pem"] + [f"shard-{i}.{e}" for i in range(num_shards)
                                                for e in ("pem", "key")]
                       if not os.path.isfile(os.path.join(self.tls_dir, f))]
            if missing:
                raise ValueError(f"{tls_dir} lacks {', '.join(missing)} (make it with "
                                 f"deploy/tls/make-certs.sh DIR {num_shards} {workers})")
        self.num_shards, self.workers = num_shards, workers
        self.max_workers = max_workers or workers
        self._server = find_server(server)
        self._owned_dirs = []
        self.log_dir = log_dir or self._temp_dir("ps-launch-logs.")
        os.makedirs(self.log_dir, exist_ok=True)
        self.insecure = insecure
        self.run_dir = None if insecure or self.tls_dir else \
            (run_dir or self._temp_dir("ps-launch-run."))
        self._args = ["--workers", str(workers), "--byzantine", str(byzantine),
                      "--aggregator", aggregator, "--lr", repr(float(lr)),
                      "--momentum", repr(float(momentum)),
                      *(["--max-workers", str(max_workers)] if max_workers else []), *server_args]
        self._startup_timeout = startup_timeout
        self.processes = []
        self.addresses = []
        self.data_ports = []  # on the TCP plane: shard i's --data-port
        self._commands = []

    def _temp_dir(self, prefix):
        d = tempfile.mkdtemp(prefix=prefix)
        self._owned_dirs.append(d)
        return d

    def start(self):
        """Starts every shard and returns once each serves; raises RuntimeError (with the
        log's last lines) when one exits or does not serve within startup_timeout. A
        shard whose port (or data port) another process took between choosing and binding
        makes all start again on fresh ports (four attempts)."""
        attempts = 4
        per_shard = 2 if opens_data_ports(self.data_plane) else 1  # control port, data port
        for attempt in range(attempts):
            ports = free_ports(self.num_shards * per_shard)
            ports, self.data_ports = ports[:self.num_shards], ports[self.num_shards:]
            self.addresses = [f"127.0.0.1:{p}" for p in ports]
            self._commands = [self._command(i, port) for i, port in enumerate(ports)]
            self.processes = [self._spawn(i) for i in range(self.num_shards)]
            failed = self._wait_serving(range(self.num_shards))
            if failed is None:
                return self
            shard, message = failed
            taken = shard is not None and "cannot listen on" in self.log_tail(shard, lines=3)
            if not taken or attempt + 1 == attempts:
                self.stop()
                raise RuntimeError(message)
            self._terminate()
        return self

    def _command(self, i, port):
        cmd = [self._server, "--host", "127.0.0.1", "--port", str(port),
               "--port-file", self._port_file(i), "--shard-id", str(i),
               "--num-shards", str(self.num_shards), "--peers", ",".join(self.addresses),
               *self._args]
        if self.data_plane is not None:
            cmd += ["--data-plane", self.data_plane]
        if self.data_ports:
            cmd += ["--data-port", str(self.data_ports[i])]
        if self.insecure:
            cmd += ["--insecure"]
        elif self.tls_dir:
            cmd += ["--tls-cert", self._tls_file(f"shard-{i}.pem"),
                    "--tls-key", self._tls_file(f"shard-{i}.key"),
                    "--tls-ca", self._tls_file("ca.pem")]
        else:
            cmd += ["--run-dir", self.run_dir]
        return cmd

    def _spawn(self, i):
        port_file = self._port_file(i)
        if os.path.exists(port_file):
            os.remove(port_file)
        with open(os.path.join(self.log_dir, f"shard-{i}.log"), "ab") as log:
            return subprocess.Popen(self._commands[i], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)

    def _port_file(self, shard):
        return os.path.join(self.log_dir, f"shard-{shard}.port")

    def _wait_serving(self, shards):
        """None once every shard in `shards` serves, else (shard, why) for the first
        that exited during start-up (or (None, why) at the timeout)."""
        deadline = time.monotonic() + self._startup_timeout
        port_files = [self._port_file(i) for i in shards]
        while not all(os.path.exists(f) for f in port_files):
            for i in shards:
                p = self.processes[i]
                if p.poll() is not None:
                    return i, (f"shard {i} exited during start-up with status "
                               f"{p.returncode}:\n{self.log_tail(i)}")
            if time.monotonic() > deadline:
                return None, (f"shards did not serve within {self._startup_timeout} s; "
                              f"logs in {self.log_dir}")
            time.sleep(0.02)
        return None

    def restart(self, shard, sig=signal.SIGKILL):
        """Stops shard `shard` with `sig` (SIGKILL: as a crash) and starts it again with
        the same flags and port; returns once it serves. With --checkpoint-dir among the
        server_args it restores its last checkpoint."""
        p = self.processes[shard]
        if p.poll() is None:
            p.send_signal(sig)
            p.wait()
        self.processes[shard] = self._spawn(shard)
        failed = self._wait_serving([shard])
        if failed is not None:
            self.stop()
            raise RuntimeError(failed[1])

    def log_tail(self, shard, lines=20):
        path = os.path.join(self.log_dir, f"shard-{shard}.log")
        try:
            with open(path, errors="replace") as fh:
                return "".join(fh.readlines()[-lines:])
        except OSError:
            return ""

    def _tls_file(self, name):
        return os.path.join(self.tls_dir, name)

    def token_file(self, worker):
        """Worker `worker`'s token file (None with insecure or TLS shards)."""
        if self.run_dir is None:
            return None
        return os.path.join(self.run_dir, f"token-worker-{worker}")

    def tls(self, worker):
        """Worker `worker`'s TLS options for ps_server.Worker (tls_ca, tls_cert, tls_key;
        empty without tls_dir)."""
        if not self.tls_dir:
            return {}
        return {"tls_ca": self._tls_file("ca.pem"),
                "tls_cert": self._tls_file(f"worker-{worker}.pem"),
                "tls_key": self._tls_file(f"worker-{worker}.key")}

    def env(self, worker):
        """The environment variables a worker process gets (ps_server.torch.init reads
        them)."""
        env = {ENV_SHARDS: ",".join(self.addresses), ENV_WORKER_ID: str(worker),
               ENV_NUM_WORKERS: str(self.max_workers), ENV_LOCAL_RANK: str(worker)}
        if self.run_dir is not None:
            env[ENV_TOKEN_FILE] = self.token_file(worker)
        names = {"tls_ca": ENV_TLS_CA, "tls_cert": ENV_TLS_CERT, "tls_key": ENV_TLS_KEY}
        env.update({names[k]: v for k, v in self.tls(worker).items()})
        return env

    def join_hint(self, script):
        """Writes job.env (write_job_env) and names the command that adds worker ID."""
        if self.max_workers <= self.workers:
            return None
        return f"env $(cat {self.write_job_env()}) PS_WORKER_ID=ID {sys.executable} {script}"

    def write_job_env(self):
        """Writes LOG_DIR/job.env, the environment every worker of this job shares (one
        KEY=VALUE a line: PS_SHARDS, PS_NUM_WORKERS, PS_RUN_DIR, TLS paths; no secret, the
        tokens stay in the run directory), for workers that join later with their own
        PS_WORKER_ID; returns its path."""
        shared = {k: v for k, v in self.env(0).items()
                  if k not in (ENV_WORKER_ID, ENV_LOCAL_RANK, ENV_TOKEN_FILE,
                               ENV_TLS_CERT, ENV_TLS_KEY)}
        if self.run_dir is not None:
            shared[ENV_RUN_DIR] = self.run_dir
        path = os.path.join(self.log_dir, "job.env")
        with open(path, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in sorted(shared.items()))
        return path

    def start_worker(self, worker, argv, extra_env, log_name, to_terminal, append=False):
        """Worker `worker` on this machine (ShardSet.start_worker): its output on this
        terminal, else in its log file."""
        env = dict(os.environ, **self.env(worker), **extra_env)
        out = None if to_terminal else open(os.path.join(self.log_dir, log_name),
                                            "ab" if append else "wb")
        try:
            return subprocess.Popen(argv, env=env, stdout=out,
                                    stderr=None if out is None else subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        finally:
            if out is not None:
                out.close()

    def alive(self):
        return all(p.poll() is None for p in self.processes)

    def stop(self, timeout=10.0):
        """SIGTERM to every shard (they checkpoint if configured), SIGKILL after
        `timeout`; the temporary directories this object made are removed."""
        self._terminate(timeout)
        if self.run_dir in self._owned_dirs:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def _terminate(self, timeout=10.0):
        for p in self.processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.processes:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class AttachedShards(Shards):
    """Shards that already run (--shards-at), by shard id: nothing to start or stop;
    start() waits until each accepts connections. The workers' credentials are the
    shards' token files in `run_dir`, the certificates in `tls_dir`, or none (insecure)."""

    def __init__(self, addresses, workers, max_workers=None, log_dir=None, run_dir=None,
                 tls_dir=None, insecure=False, startup_timeout=60.0):
        if sum(bool(x) for x in (run_dir, tls_dir, insecure)) != 1:
            raise ValueError("--shards-at needs the workers' credentials: --run-dir (the "
                             "shards' token files), --tls-dir, or --insecure")
        self.num_shards, self.workers = len(addresses), workers
        self.max_workers = max_workers or workers
        self.addresses = list(addresses)
        self.data_ports = []
        self.processes = []
        self.data_plane = None
        self._owned_dirs = []
        self.log_dir = log_dir or self._temp_dir("ps-launch-logs.")
        os.makedirs(self.log_dir, exist_ok=True)
        self.insecure = insecure
        self.run_dir = os.path.abspath(run_dir) if run_dir else None
        self.tls_dir = os.path.abspath(tls_dir) if tls_dir else None
        self._startup_timeout = startup_timeout

    def start(self):
        deadline = time.monotonic() + self._startup_timeout
        for i, address in enumerate(self.addresses):
            while (e := connect_error(address)) is not None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"shard {i} at {address} does not accept "
                                       f"connections: {e}") from e
                time.sleep(0.1)
        return self

    def alive(self):
        return True

    def log_tail(self, shard, lines=20):
        return ""

    def stop(self, timeout=10.0):
        pass


def _start_shards(args):
    """The shards of this launch: on loopback (Shards), or over ssh on -H/--hostfile's
    hosts (RemoteShards)."""
    attach = [a.strip() for a in args.shards_at.split(",") if a.strip()] \
        if args.shards_at else None
    remote = args.hosts or args.hostfile or args.slurm
    if attach and not remote:
        return AttachedShards(attach, args.workers, args.max_workers or max(args.worker_ids) + 1,
                              args.log_dir,
                              run_dir=args.run_dir, tls_dir=args.tls_dir,
                              insecure=args.insecure).start()
    if not remote:
        return Shards(args.shards, args.workers, args.byzantine, args.aggregator, args.lr,
                      args.momentum, args.server_arg, args.server, log_dir=args.log_dir,
                      insecure=args.insecure, tls_dir=args.tls_dir,
                      data_plane=args.data_plane, max_workers=args.max_workers).start()
    if args.slurm:
        hosts, transport = slurm_hosts(), Srun()
    else:
        hosts = parse_hosts(args.hosts) if args.hosts else read_hostfile(args.hostfile)
        transport = Ssh(args.ssh_port, args.ssh_identity_file, args.ssh_config)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="ps-launch-logs.")
    os.makedirs(log_dir, exist_ok=True)
    server_args = ["--workers", str(args.workers), "--byzantine", str(args.byzantine),
                   "--aggregator", args.aggregator, "--lr", repr(float(args.lr)),
                   "--momentum", repr(float(args.momentum)),
                   *(["--max-workers", str(args.max_workers)] if args.max_workers else []),
                   *args.server_arg]
    return RemoteShards(hosts, args.shards, args.workers, server_args, find_server(args.server),
                        log_dir, transport,
                        shard_hosts=args.shard_hosts.split(",") if args.shard_hosts else None,
                        shard_port=args.shard_port, max_workers=args.max_workers,
                        attach=attach, run_dir=args.run_dir, tls_dir=args.tls_dir,
                        data_plane=args.data_plane, worker_ids=args.worker_ids).start()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv, __doc__.split("\n\n")[0])
    started = time.monotonic()
    try:
        shards = _start_shards(args)
    except (RuntimeError, FileNotFoundError, ValueError) as e:
        print(f"ps-launch: {e}", file=sys.stderr)
        return 1
    plane = (f" (data plane tcp on ports {','.join(map(str, shards.data_ports))})"
             if shards.data_ports else "")
    print(f"ps-launch: {shards.num_shards} shard(s) at {','.join(shards.addresses)}{plane}; "
          f"{args.workers} worker(s); logs in {shards.log_dir}", file=sys.stderr, flush=True)
    # Ids from --workers on are spares only when this launch started 0 to --workers - 1.
    ids = args.worker_ids  # worker i of this launch has id ids[i]
    hint = shards.join_hint(args.script) if ids == list(range(args.workers)) else None
    if hint is not None:
        print(f"ps-launch: worker ids {args.workers} to {shards.max_workers - 1} may join: "
              f"{hint}", file=sys.stderr, flush=True)
    workers = []
    interrupted = []  # signals this launcher received

    def terminate(signum):
        for p in workers:
            if p.poll() is None:
                p.send_signal(signum)

    def forward(signum, _frame):
        interrupted.append(signum)
        terminate(signum)

    restarts = [0] * len(ids)  # per worker of this launch

    # The workers import the ps_server package this launcher runs from.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pythonpath = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)

    def spawn(i):
        # The first on this terminal (every one, prefixed, where the shards say so); a
        # restarted worker's log goes on after its last words.
        w = ids[i]
        return shards.start_worker(
            w, [sys.executable, os.path.abspath(args.script), *args.script_args],
            {"PS_RESTART_COUNT": str(restarts[i]), "PYTHONPATH": pythonpath},
            f"worker-{w}.log", to_terminal=i == 0 or shards.prefixes_output,
            append=restarts[i] > 0)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for i in range(len(ids)):
            workers.append(spawn(i))
        shard_died = None
        worker_failed = False
        while any(p.poll() is None for p in workers):
            for i, p in enumerate(workers):
                if (p.poll() in (None, 0) or worker_failed or interrupted
                        or sum(restarts) >= args.max_restarts or shard_died is not None):
                    continue
                restarts[i] += 1
                print(f"ps-launch: worker {ids[i]} exited with status {p.returncode}; "
                      f"restarting it (restart {sum(restarts)} of --max-restarts "
                      f"{args.max_restarts})", file=sys.stderr, flush=True)
                workers[i] = spawn(i)
            if not worker_failed and any(p.poll() not in (None, 0) for p in workers):
                # The others would wait for its pushes until their deadlines: stop them.
                worker_failed = True
                i = next(i for i, p in enumerate(workers) if p.poll() not in (None, 0))
                print(f"ps-launch: worker {ids[i]} exited with status {workers[i].returncode}; "
                      "stopping the others", file=sys.stderr)
                terminate(signal.SIGTERM)
            if shard_died is None and not shards.alive():
                shard_died = next(i for i, p in enumerate(shards.processes)
                                  if p.poll() is not None)
                print(f"ps-launch: shard {shard_died} exited with status "
                      f"{shards.processes[shard_died].returncode}; stopping the workers:\n"
                      f"{shards.log_tail(shard_died)}", file=sys.stderr)
                terminate(signal.SIGTERM)
            time.sleep(0.05)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        shards.stop()
    seconds = time.monotonic() - started
    failed = [i for i, p in enumerate(workers) if p.returncode != 0]
    print(f"ps-launch: done in {seconds:.1f} s", file=sys.stderr)
    for i, p in enumerate(workers):
        status = "ok" if p.returncode == 0 else f"exit status {p.returncode}"
        again = f" (restarted {restarts[i]} time{'s' if restarts[i] > 1 else ''})" \
            if restarts[i] else ""
        print(f"  worker {ids[i]}: {status}{again}", file=sys.stderr)
    for i, p in enumerate(shards.processes):
        print(f"  shard {i}: exit status {p.returncode}", file=sys.stderr)
    if interrupted:
        return 128 + interrupted[0]
    return 1 if failed or shard_died is not None else 0


if __name__ == "__main__":
    sys.exit(main())
