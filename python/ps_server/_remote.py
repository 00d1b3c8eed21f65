"""ps-launch's hosts (docs/python.md, "ps-launch across hosts"): the -H / --hostfile
placement of shards and workers, and processes started on other machines over the
system's OpenSSH.

A remote process is `ssh HOST -- bash -c WRAPPER ...`: the wrapper makes a private
directory (mode 0700) on the remote host, reads the process's secret files (keys,
tokens) from ssh's standard input into it, so they never appear on a command line or in
an environment, replaces "@DIR@" in the command with that directory, and runs the
command. Its standard input then stays a control channel: a line "TERM", "INT" or "KILL"
sends that signal to the process, and its end (the launcher exited, or its ssh died)
sends SIGTERM and, 10 s later, SIGKILL; the directory is removed when the process ends.
"""

import base64
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time

from ._shard_set import ShardSet, connect_error, opens_data_ports

# bash, on the remote host. Arguments: the command. Standard input: "FILE name base64"
# lines, "END", then control lines.
WRAPPER = r"""
set -u
umask 077
d=$(mktemp -d) || exit 97
trap 'rm -rf "$d"' EXIT
while IFS=' ' read -r kind name data; do
  [ "$kind" = END ] && break
  case "$name" in *[!A-Za-z0-9._-]* | '' | .*) echo "ps-launch: bad file name" >&2; exit 97 ;; esac
  printf '%s' "$data" | base64 -d > "$d/$name" || exit 97
done
args=("${@//@DIR@/$d}")
"${args[@]}" <&- &
pid=$!
# A background job's standard input is /dev/null unless redirected: the watcher reads
# the channel through descriptor 3.
exec 3<&0
(
  while IFS= read -r line <&3; do
    case "$line" in TERM|INT|KILL) kill -s "$line" "$pid" 2>/dev/null ;; esac
  done
  kill -s TERM "$pid" 2>/dev/null && sleep 10 && kill -s KILL "$pid" 2>/dev/null
) >/dev/null 2>&1 &
watcher=$!
wait "$pid"
status=$?
kill "$watcher" 2>/dev/null
exit "$status"
"""

_FILE_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def parse_hosts(spec):
    """"a:2,b:4" (horovodrun's -H) as [("a", 2), ("b", 4)]; a host without :N has 1 slot."""
    hosts = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, slots = item.rpartition(":") if ":" in item and not item.startswith("[") \
            else (item, "", "1")
        if not name:
            name, slots = item, "1"
        hosts.append(_host(name, slots, f"-H {spec!r}"))
    if not hosts:
        raise ValueError(f"-H {spec!r} names no host")
    return hosts


def read_hostfile(path):
    """A horovodrun/MPI host file: one "HOST slots=N" (or "HOST:N", or "HOST") a line,
    # comments."""
    hosts = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            where = f"--hostfile {path} line {number}"
            parts = line.split()
            if len(parts) == 2 and parts[1].startswith("slots="):
                hosts.append(_host(parts[0], parts[1][len("slots="):], where))
            elif len(parts) == 1:
                hosts += parse_hosts(parts[0])
            else:
                raise ValueError(f"{where}: want 'HOST slots=N', got {line!r}")
    if not hosts:
        raise ValueError(f"--hostfile {path} names no host")
    return hosts


def _host(name, slots, where):
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.:-]*[A-Za-z0-9])?", name):
        raise ValueError(f"{where}: {name!r} is not a host name or address")
    if not slots.isdigit() or int(slots) < 1:
        raise ValueError(f"{where}: {name}'s slots {slots!r} must be a positive integer")
    return name, int(slots)


def place(hosts, workers, shards, shard_hosts=None):
    """Worker k on the host whose slots it falls in, in order (horovodrun's placement);
    shard i on shard_hosts[i] (default: the hosts in turn). Returns (worker hosts, shard
    hosts); ValueError when the slots are fewer than the workers."""
    slots = sum(n for _, n in hosts)
    if slots < workers:
        raise ValueError(f"{workers} workers but only {slots} slots on "
                         f"{','.join(f'{h}:{n}' for h, n in hosts)}")
    worker_hosts = [h for h, n in hosts for _ in range(n)][:workers]
    if shard_hosts is None:
        shard_hosts = [hosts[i % len(hosts)][0] for i in range(shards)]
    elif len(shard_hosts) != shards:
        raise ValueError(f"--shard-hosts names {len(shard_hosts)} hosts for {shards} shards")
    return worker_hosts, list(shard_hosts)


class Ssh:
    """How to reach other hosts: the system's ssh with these options (horovodrun's
    --ssh-port and --ssh-identity-file, and an ssh_config file)."""

    def __init__(self, port=None, identity_file=None, config=None, program="ssh"):
        self._flags = [*(["--ssh-port", str(port)] if port else []),
                       *(["--ssh-identity-file", identity_file] if identity_file else []),
                       *(["--ssh-config", config] if config else [])]
        self.options = ["-o", "BatchMode=yes"]
        if config:
            self.options += ["-F", config]
        if port:
            self.options += ["-p", str(port)]
        if identity_file:
            self.options += ["-i", identity_file]
        self.program = program

    def launch_flags(self):
        """The ps-launch flags that reach a host of one's choice the same way."""
        return ["-H", "HOST:1", *self._flags]

    def argv(self, host, command):
        """The wrapper running `command` on `host`: over ssh, or directly for this host
        (localhost, 127.0.0.1, ::1)."""
        wrapped = ["bash", "-c", WRAPPER, "ps-remote", *command]
        if host in LOCAL_HOSTS:
            return wrapped
        return [self.program, *self.options, host, "--",
                " ".join(shlex.quote(a) for a in wrapped)]


class Srun:
    """Inside a Slurm allocation (ps-launch --slurm): a process on a node of the job is a
    job step of one task there (`srun --overlap`, so steps share the job's CPUs), its
    standard input the wrapper's channel as over ssh."""

    def launch_flags(self):
        """The ps-launch flags that place a worker in this allocation."""
        return ["--slurm"]

    def argv(self, host, command):
        return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--overlap",
                "--quiet", "--kill-on-bad-exit=1", "bash", "-c", WRAPPER, "ps-remote", *command]


def slurm_hosts(environ=None):
    """The allocation's nodes and task slots ([(node, slots)]), from SLURM_JOB_NODELIST
    (expanded by `scontrol show hostnames`) and SLURM_TASKS_PER_NODE ("2(x3),1");
    ValueError outside an allocation."""
    env = os.environ if environ is None else environ
    nodelist, per_node = env.get("SLURM_JOB_NODELIST"), env.get("SLURM_TASKS_PER_NODE")
    if not env.get("SLURM_JOB_ID") or not nodelist or not per_node:
        raise ValueError("--slurm: not inside a Slurm allocation (no SLURM_JOB_ID, "
                         "SLURM_JOB_NODELIST or SLURM_TASKS_PER_NODE): run ps-launch from an "
                         "sbatch script or an salloc shell")
    nodes = subprocess.run(["scontrol", "show", "hostnames", nodelist], stdout=subprocess.PIPE,
                           text=True, check=True).stdout.split()
    slots = []
    for item in per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not m:
            raise ValueError(f"--slurm: SLURM_TASKS_PER_NODE {per_node!r} does not parse")
        slots += [int(m.group(1))] * int(m.group(2) or 1)
    if len(slots) != len(nodes):
        raise ValueError(f"--slurm: {len(nodes)} nodes in {nodelist!r} but {len(slots)} "
                         f"task counts in {per_node!r}")
    return list(zip(nodes, slots))


class RemoteProcess:
    """`command` on `host` over `ssh`, with `files` ({name: bytes}) in its private
    directory (@DIR@ in the command). Its output lines go to `sink(line)` (a thread
    reads them). poll(), wait(), returncode, send_signal() and kill() as a Popen's."""

    def __init__(self, ssh, host, command, files, sink):
        for name in files:
            if not _FILE_NAME.match(name):
                raise ValueError(f"bad file name {name!r}")
        self.host = host
        self._p = subprocess.Popen(ssh.argv(host, command), stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        frames = b"".join(b"FILE " + name.encode() + b" " + base64.b64encode(data) + b"\n"
                          for name, data in files.items())
        self._control(frames + b"END\n")
        self._reader = threading.Thread(target=self._read, args=(sink,), daemon=True)
        self._reader.start()

    def _control(self, data):
        try:
            self._p.stdin.write(data)
            self._p.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # ssh is gone: poll() says so

    def _read(self, sink):
        try:
            for raw in self._p.stdout:
                sink(raw.decode(errors="replace").rstrip("\n"))
        finally:
            close = getattr(sink, "close", None)
            if close is not None:
                close()

    @property
    def returncode(self):
        return self._p.returncode

    def poll(self):
        return self._p.poll()

    def wait(self, timeout=None):
        code = self._p.wait(timeout)
        self._reader.join(timeout=5)
        return code

    def send_signal(self, signum):
        """SIGTERM, SIGINT or SIGKILL to the remote process."""
        name = {2: "INT", 9: "KILL", 15: "TERM"}.get(int(signum), "TERM")
        self._control(name.encode() + b"\n")

    def terminate(self):
        self.send_signal(15)

    def kill(self):
        """Ends the channel: the wrapper stops the process (SIGTERM, SIGKILL 10 s later);
        then kills the local ssh."""
        try:
            self._p.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        try:
            self._p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._p.kill()
            self._p.wait()


def read_files(paths):
    """{basename: bytes} of `paths`."""
    out = {}
    for p in paths:
        with open(p, "rb") as f:
            out[os.path.basename(p)] = f.read()
    return out


def find_make_certs():
    """ps-make-certs (deploy/tls/make-certs.sh): next to this package's ps-server in its
    build tree, or on $PATH."""
    here = os.path.dirname(os.path.abspath(__file__))
    for c in (os.path.join(here, "..", "..", "bin", "ps-make-certs"),
              shutil.which("ps-make-certs")):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise FileNotFoundError("no ps-make-certs (deploy/tls/make-certs.sh) on $PATH")


class RemoteShards(ShardSet):
    """S ps-server processes on named hosts, started over ssh, and the workers' places
    (ps-launch -H). The shards serve mutual TLS with certificates this object makes for
    the job (ps-make-certs --hosts: the shard hosts' names), each process receiving only
    its own key over its ssh channel; shard i listens on every address of its host at
    `shard_port` + i (on the TCP plane, the default, its data port at `shard_port` + S + i,
    under the same certificates). ps-launch's loop uses it as a ShardSet."""

    prefixes_output = True  # [worker K@HOST] on every line

    def __init__(self, hosts, num_shards, workers, server_args, server, log_dir, ssh,
                 shard_hosts=None, shard_port=7070, max_workers=None, startup_timeout=60.0,
                 attach=None, run_dir=None, tls_dir=None, data_plane=None, worker_ids=None):
        """`attach`: the addresses of shards that already run (--shards-at): none is
        started, and the workers' credentials come from `tls_dir` (ps-make-certs' files)
        or `run_dir` (the shards' token files); `worker_ids` are then the ids to place
        (default 0 to workers - 1)."""
        self.max_workers = max_workers or workers
        if attach:
            if not (tls_dir or run_dir):
                raise ValueError("--shards-at with -H needs the workers' credentials: "
                                 "--tls-dir (certificates) or --run-dir (token files)")
            num_shards = len(attach)
            ids = worker_ids if worker_ids is not None else list(range(workers))
            placed, _ = place(hosts, len(ids), 0, [])
            self.worker_hosts = dict(zip(ids, placed))
            self.shard_hosts = [a.rsplit(":", 1)[0].strip("[]") for a in attach]
            self.addresses = list(attach)
        else:
            # The spares (ids from `workers` to max_workers - 1) join later from a launch
            # of their own (--shards-at --worker-ids), placed there.
            placed, self.shard_hosts = place(hosts, workers, num_shards, shard_hosts)
            self.worker_hosts = dict(enumerate(placed))
            self.addresses = [f"{_bracket(h)}:{shard_port + i}"
                              for i, h in enumerate(self.shard_hosts)]
        self.num_shards, self.workers = num_shards, workers
        self.log_dir = log_dir
        self.ssh = ssh
        self.data_plane = data_plane
        self.data_ports = ([shard_port + num_shards + i for i in range(num_shards)]
                           if opens_data_ports(data_plane) and not attach else [])
        self._server = server
        self._args = list(server_args)
        self._port = shard_port
        self._startup_timeout = startup_timeout
        self.processes = []
        self._attached = bool(attach)
        self._run_dir = run_dir
        # The certificates: made for this job (and removed with it), or the given ones.
        self._owns_certs = not attach
        self._certs = tempfile.mkdtemp(prefix="ps-launch-certs.") if not attach else tls_dir
        self._terminal_lock = threading.Lock()

    def start(self):
        if self._attached:
            self._wait_serving()
            return self
        hosts = sorted(set(self.shard_hosts) | {"localhost"})
        done = subprocess.run([find_make_certs(), "--hosts", ",".join(hosts), self._certs,
                               str(self.num_shards), str(self.max_workers)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"ps-make-certs failed: {done.stderr.strip()}")
        for i, host in enumerate(self.shard_hosts):
            command = [self._server, "--host", "0.0.0.0" if host not in LOCAL_HOSTS else host,
                       "--port", str(self._port + i), "--shard-id", str(i),
                       "--num-shards", str(self.num_shards), "--peers", ",".join(self.addresses),
                       *(["--data-plane", self.data_plane] if self.data_plane else []),
                       *(["--data-port", str(self.data_ports[i])] if self.data_ports else []),
                       *self._args, *_run_id_args(), "--tls-cert", f"@DIR@/shard-{i}.pem",
                       "--tls-key", f"@DIR@/shard-{i}.key", "--tls-ca", "@DIR@/ca.pem"]
            files = self._files("ca.pem", f"shard-{i}.pem", f"shard-{i}.key")
            self.processes.append(RemoteProcess(self.ssh, host, command, files,
                                                self._sink(f"shard-{i}.log", None)))
        self._wait_serving()
        return self

    def _files(self, *names):
        return read_files([os.path.join(self._certs, n) for n in names])

    def _sink(self, log_name, terminal_prefix, append=False):
        return _LineSink(os.path.join(self.log_dir, log_name), terminal_prefix,
                         self._terminal_lock, append)

    def _wait_serving(self):
        deadline = time.monotonic() + self._startup_timeout
        pending = set(range(self.num_shards))
        while pending:
            for i in sorted(pending):
                p = self.processes[i] if i < len(self.processes) else None  # none attached
                if p is not None and p.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"shard {i} on {self.shard_hosts[i]} exited during "
                                       f"start-up with status {p.returncode}:\n"
                                       f"{self.log_tail(i)}")
                if connect_error(self.addresses[i]) is None:
                    pending.discard(i)
            if pending and time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"shards {sorted(pending)} did not serve within "
                                   f"{self._startup_timeout} s; logs in {self.log_dir}")
            time.sleep(0.05)

    def join_hint(self, script):
        """Across hosts a joining worker needs its key on its host: another ps-launch
        hands it over its ssh channel, from this job's certificates (kept while it runs)."""
        if self._attached or self.max_workers <= self.workers:
            return None
        run_id = f"PS_RUN_ID={os.environ['PS_RUN_ID']} " if os.environ.get("PS_RUN_ID") else ""
        place = " ".join(shlex.quote(f) for f in self.ssh.launch_flags())
        return (f"{run_id}ps-launch --shards-at {','.join(self.addresses)} --tls-dir "
                f"{self.tls_dir} --max-workers {self.max_workers} --worker-ids ID "
                f"{place} {script}")

    @property
    def tls_dir(self):
        """The job's certificates (ps-make-certs' files): made for it, or the given ones."""
        return self._certs

    def env(self, worker):
        host = self.worker_hosts[worker]
        local_rank = sum(1 for k, h in self.worker_hosts.items() if k < worker and h == host)
        env = {"PS_SHARDS": ",".join(self.addresses), "PS_WORKER_ID": str(worker),
               "PS_NUM_WORKERS": str(self.max_workers), "LOCAL_RANK": str(local_rank)}
        if os.environ.get("PS_RUN_ID"):
            env["PS_RUN_ID"] = os.environ["PS_RUN_ID"]  # ssh passes no environment
        if self._certs is None:
            env["PS_TOKEN_FILE"] = f"@DIR@/token-worker-{worker}"
        else:
            env.update({"PS_TLS_CA": "@DIR@/ca.pem", "PS_TLS_CERT": f"@DIR@/worker-{worker}.pem",
                        "PS_TLS_KEY": f"@DIR@/worker-{worker}.key"})
        return env

    def _worker_files(self, worker):
        if self._certs is None:
            return read_files([os.path.join(self._run_dir, f"token-worker-{worker}")])
        return self._files("ca.pem", f"worker-{worker}.pem", f"worker-{worker}.key")

    def start_worker(self, worker, argv, extra_env, log_name, to_terminal, append=False):
        """Worker `worker` on its host: `argv` with env(worker) and `extra_env`, its
        certificate and key over the ssh channel; output to `log_name` in the log
        directory and, with `to_terminal`, to this terminal prefixed [worker K@HOST]."""
        host = self.worker_hosts[worker]
        env = dict(self.env(worker), **extra_env)
        command = ["env", *(f"{k}={v}" for k, v in sorted(env.items())), *argv]
        return RemoteProcess(self.ssh, host, command, self._worker_files(worker),
                             self._sink(log_name, f"[worker {worker}@{host}] "
                                        if to_terminal else None, append))

    def alive(self):
        return all(p.poll() is None for p in self.processes)

    def log_tail(self, shard, lines=20):
        try:
            with open(os.path.join(self.log_dir, f"shard-{shard}.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout=10.0):
        """SIGTERM to every shard, then the channels' end (SIGKILL 10 s later); the
        certificates are removed."""
        for p in self.processes:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + timeout
        for p in self.processes:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            p.kill()
        if self._owns_certs:
            shutil.rmtree(self._certs, ignore_errors=True)


def _run_id_args():
    """The launcher's PS_RUN_ID as the remote shards' --run-id (ssh passes no environment;
    docs/operations.md, "One model per run")."""
    run_id = os.environ.get("PS_RUN_ID")
    return ["--run-id", run_id] if run_id else []


class _LineSink:
    """A process's output lines: appended to its log file and, with a prefix, printed
    on this terminal (one line at a time over all processes); closed at the output's end."""

    def __init__(self, path, terminal_prefix, lock, append=False):
        self._log = open(path, "a" if append else "w", buffering=1)
        self._prefix = terminal_prefix
        self._lock = lock

    def __call__(self, line):
        self._log.write(line + "\n")
        if self._prefix is not None:
            with self._lock:
                print(f"{self._prefix}{line}", flush=True)

    def close(self):
        self._log.close()


def _bracket(host):
    return f"[{host}]" if ":" in host else host
