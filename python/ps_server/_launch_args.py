"""ps-launch's command line (launch.py): its options and the checks between them, which
end the launcher with argparse's message before anything starts. docs/python.md,
"ps-launch"."""

import argparse
import os

# ps-server --data-plane (docs/data-plane.md): the native TCP plane on a port of its own
# (the shards' default), or gRPC on the control port.
DATA_PLANES = ("grpc", "tcp")


def parse_args(argv, description):
    """ps-launch's arguments, checked: argparse's exit with the reason on a bad one."""
    parser = argparse.ArgumentParser(
        prog="ps-launch", description=description,
        epilog="Options after the script are the script's. docs/python.md, 'ps-launch'.")
    parser.add_argument("--shards", type=int, default=1, help="ps-server processes (default 1)")
    parser.add_argument("--workers", type=int,
                        help="copies of the script (n); with --worker-ids, their count")
    parser.add_argument("--max-workers", type=int, metavar="M",
                        help="the shards' --max-workers: ids --workers to M-1 may join the "
                             "running job later (the launcher prints how); workers' "
                             "PS_NUM_WORKERS is then M (default: --workers)")
    parser.add_argument("--byzantine", type=int, default=0, help="f, the shards' --byzantine")
    parser.add_argument("--aggregator", default="mean", help="the shards' rule (default mean)")
    parser.add_argument("--lr", type=float, default=0.1, help="the shards' SGD step (default 0.1)")
    parser.add_argument("--momentum", type=float, default=0.9, help="the shards' SGD momentum")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="a further ps-server argument (repeat: --server-arg=--pull-codec "
                             "--server-arg=fp16)")
    parser.add_argument("--server", help="the ps-server binary (default: found, see docs)")
    parser.add_argument("--log-dir", help="where every process's log goes (default: a new "
                                          "temporary directory, printed)")
    parser.add_argument("--insecure", action="store_true",
                        help="shards without authentication (loopback only)")
    parser.add_argument("--tls-dir", help="serve mutual TLS with the certificates in this "
                                          "directory (deploy/tls/make-certs.sh DIR S W): "
                                          "workers get PS_TLS_CA/CERT/KEY instead of tokens")
    parser.add_argument("--data-plane", choices=DATA_PLANES,
                        help="every shard's --data-plane: tcp (the native plane, on a free "
                             "--data-port per shard; the default) or grpc (on the shard's "
                             "port, for links that pass only HTTP/2); workers follow the "
                             "shards' plane")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="restart a worker that fails (exits non-zero or is killed) in "
                             "place, up to N times over the job, instead of stopping the "
                             "others; it rejoins at the shards' current version, "
                             "PS_RESTART_COUNT says how often it was restarted (default 0)")
    hosts = parser.add_argument_group(
        "hosts", "shards and workers on other machines, over ssh (docs/python.md, "
        "'ps-launch across hosts'); the shards then serve mutual TLS with certificates made "
        "for the job")
    hosts.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...",
                       help="the machines and how many workers each takes (horovodrun's -H)")
    hosts.add_argument("--hostfile", help="'HOST slots=N' lines instead of -H")
    hosts.add_argument("--slurm", action="store_true",
                       help="inside a Slurm allocation (sbatch, salloc): its nodes and task "
                            "slots are the hosts, and every process is a job step (srun) "
                            "instead of an ssh session")
    hosts.add_argument("--shard-hosts", metavar="HOST,...",
                       help="where shard i runs (default: the hosts in turn)")
    hosts.add_argument("--shard-port", type=int, default=7070,
                       help="shard i listens on this port + i (default 7070); on the "
                            "TCP data plane (the default) its data port is this port + "
                            "shards + i")
    parser.add_argument("--shards-at", metavar="HOST:PORT,...",
                        help="run the workers against shards that already run (by shard id) "
                             "instead of starting any; the workers' credentials come from "
                             "--run-dir (the shards' token files) or --tls-dir")
    parser.add_argument("--run-dir", help="with --shards-at: the shards' --run-dir, whose "
                                          "token-worker-K files the workers use")
    parser.add_argument("--worker-ids", metavar="K,...",
                        help="with --shards-at: the worker ids to start (default 0 to "
                             "--workers - 1), e.g. spares joining a running job; ids from "
                             "--workers on need --max-workers")
    hosts.add_argument("--ssh-port", type=int, help="ssh's -p")
    hosts.add_argument("--ssh-identity-file", help="ssh's -i")
    hosts.add_argument("--ssh-config", help="ssh's -F (an ssh_config file)")
    parser.add_argument("script", help="the training script, run with this Python")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.worker_ids is not None:
        if not args.shards_at:
            parser.error("--worker-ids is for --shards-at (workers joining shards that run)")
        try:
            args.worker_ids = [int(k) for k in args.worker_ids.split(",")]
        except ValueError:
            parser.error(f"--worker-ids {args.worker_ids!r}: want comma-separated integers")
        if len(set(args.worker_ids)) != len(args.worker_ids) or min(args.worker_ids) < 0:
            parser.error("--worker-ids: each id once, none negative")
        if args.workers is not None and args.workers != len(args.worker_ids):
            parser.error(f"--workers {args.workers} but --worker-ids names "
                         f"{len(args.worker_ids)}")
        args.workers = len(args.worker_ids)
        space = args.max_workers or args.workers
        if max(args.worker_ids) >= space:
            parser.error(f"--worker-ids {max(args.worker_ids)}: ids must be below "
                         f"--max-workers (the shards' id space; now {space})")
    elif args.workers is None:
        parser.error("--workers is required")
    else:
        args.worker_ids = list(range(args.workers))
    if args.workers < 1 or args.shards < 1:
        parser.error("--workers and --shards must be at least 1")
    if args.insecure and args.tls_dir:
        parser.error("--insecure and --tls-dir exclude each other")
    if not os.path.isfile(args.script):
        parser.error(f"no script {args.script!r}")
    if args.max_workers is not None and args.max_workers < args.workers:
        parser.error(f"--max-workers {args.max_workers}: must be at least --workers "
                     f"{args.workers}")
    if args.shards_at and args.server_arg:
        parser.error("--shards-at runs workers against shards that already run: their flags "
                     "are theirs (--server-arg does not apply)")
    if args.run_dir and not args.shards_at:
        parser.error("--run-dir is for --shards-at (ps-launch makes its own otherwise)")
    if sum(bool(x) for x in (args.hosts, args.hostfile, args.slurm)) > 1:
        parser.error("-H, --hostfile and --slurm exclude each other")
    remote = args.hosts or args.hostfile or args.slurm
    if remote and (args.insecure or (args.tls_dir and not args.shards_at)):
        parser.error("with -H/--hostfile/--slurm the shards serve mutual TLS with certificates "
                     "made for the job: --insecure and --tls-dir are not available there")
    if args.shards_at and args.data_plane:
        parser.error("--shards-at runs workers against shards that already run: the data "
                     "plane is theirs (the workers follow it; --data-plane does not apply)")
    for arg in args.server_arg:
        if arg.split("=", 1)[0] in ("--data-plane", "--data-port"):
            parser.error(f"--server-arg={arg}: give the plane as ps-launch --data-plane, which "
                         "also picks each shard's data port")
    if args.max_restarts < 0:
        parser.error(f"--max-restarts {args.max_restarts}: must be 0 or more")
    return args
