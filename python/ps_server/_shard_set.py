"""What ps-launch's loop needs of the shards it trains against, wherever they run: on
this machine (launch.Shards, AttachedShards) or on named hosts over ssh or srun
(_remote.RemoteShards)."""

import abc
import socket


def connect_error(address):
    """None when host:port (an IPv6 host in brackets too) accepts a TCP connection now,
    else why not (the exception)."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
        return None
    except (OSError, ValueError) as e:
        return e


def opens_data_ports(data_plane):
    """Whether shards started with `data_plane` ("grpc", "tcp", or None for ps-server's
    default, tcp) listen on a data port of their own."""
    return data_plane != "grpc"


class ShardSet(abc.ABC):
    """The shards of one launch and the way to start a worker beside them.

    Attributes every implementation sets: num_shards, addresses (host:port by shard id),
    data_ports (with the TCP data plane, by shard id; else empty), processes (the shard
    processes this object started, by shard id; empty when attached to running ones),
    max_workers (the shards' worker id space), log_dir."""

    # Whether every worker's output reaches this terminal with a prefix naming it
    # ([worker K@HOST]); else only the first worker's does, as it is, and the others'
    # go to their log files.
    prefixes_output = False

    @abc.abstractmethod
    def start(self):
        """Starts (or waits for) the shards until each serves; returns self."""

    @abc.abstractmethod
    def start_worker(self, worker, argv, extra_env, log_name, to_terminal, append=False):
        """Worker id `worker`: `argv` with its environment (PS_SHARDS, PS_WORKER_ID,
        PS_NUM_WORKERS, LOCAL_RANK, its credentials) and `extra_env`; output to
        `log_name` in log_dir (after what is there with `append`, a restarted worker)
        and, with `to_terminal`, to this terminal. Returns an object with poll(),
        wait(), returncode and send_signal(), as subprocess.Popen has."""

    def join_hint(self, script):
        """The command that adds a worker with a spare id (from the starting count to
        max_workers - 1) to the running job, ID standing for the id; None when no id is
        spare."""
        return None

    @abc.abstractmethod
    def alive(self):
        """Whether every shard this object started still runs."""

    @abc.abstractmethod
    def log_tail(self, shard, lines=20):
        """The last lines of shard `shard`'s log ("" when it has none here)."""

    @abc.abstractmethod
    def stop(self, timeout=10.0):
        """Stops what this object started (SIGTERM, SIGKILL after `timeout`) and removes
        what it made."""
