"""ps_server.torch's place of this process in the job: init() and what it read (rank,
size, local rank, the shards). Public through ps_server.torch."""

import os

from .launch import (ENV_NUM_WORKERS, ENV_RUN_DIR, ENV_SHARDS, ENV_TLS_CA, ENV_TLS_CERT,
                     ENV_TLS_KEY, ENV_TOKEN_FILE, ENV_WORKER_ID)

_context = {}


def init(shards=None, worker_id=None, num_workers=None, token_file=None):
    """Reads this process's place in the job: the arguments, else the environment ps-launch
    (and the Kubernetes worker Job) sets: PS_SHARDS (host:port,...), PS_WORKER_ID,
    PS_NUM_WORKERS, PS_TOKEN_FILE (absent: no token, for --insecure shards), and for TLS
    PS_TLS_CA, PS_TLS_CERT, PS_TLS_KEY (the shards' CA, this worker's certificate and
    key). Under torchrun, its RANK, WORLD_SIZE and LOCAL_RANK stand in for PS_WORKER_ID,
    PS_NUM_WORKERS and the local rank (a PS_ value and torchrun's that disagree are an
    error); where neither is set, a Slurm task's SLURM_PROCID, SLURM_NTASKS and
    SLURM_LOCALID do (`srun python train.py`). PS_RUN_DIR (the shards' --run-dir) gives
    the token file of this rank, PS_RUN_DIR/token-worker-RANK, when PS_TOKEN_FILE is not
    set. PS_SHARDS has no torchrun or Slurm counterpart: it is always needed. PS_RUN_ID,
    when set, is the training run the workers join (shards started with --run-id refuse
    any other)."""
    env = os.environ

    def need(value, name, torchrun=None, slurm=None):
        if value is None:
            value = env.get(name) or None
            other = env.get(torchrun) or None if torchrun else None
            if value is not None and other is not None and int(value) != int(other):
                raise ValueError(f"ps_server.torch.init: {name}={value} but torchrun's "
                                 f"{torchrun}={other}; set one of them")
            if value is None:
                value = other
            # Slurm's only where neither is set: every step of an allocation has them,
            # including the one-task steps ps-launch --slurm starts with PS_ values.
            if value is None and slurm:
                value = env.get(slurm) or None
        if value is None or value == "":
            others = [f"{who}'s {var}" for who, var in (("torchrun", torchrun), ("Slurm", slurm))
                      if var]
            also = f" (or {', or '.join(others)})" if others else ""
            raise ValueError(f"ps_server.torch.init: {name}{also} is not set; run under "
                             "ps-launch, torchrun or srun, or pass it")
        return value

    shard_list = shards if shards is not None else need(None, ENV_SHARDS)
    if isinstance(shard_list, str):
        shard_list = [s for s in shard_list.split(",") if s]
    rank_ = int(need(worker_id, ENV_WORKER_ID, "RANK", "SLURM_PROCID"))
    if token_file is None:
        token_file = env.get(ENV_TOKEN_FILE) or None
    if token_file is None and env.get(ENV_RUN_DIR):
        token_file = os.path.join(env[ENV_RUN_DIR], f"token-worker-{rank_}")
    _context.clear()
    _context.update(shards=list(shard_list), rank=rank_,
                    size=int(need(num_workers, ENV_NUM_WORKERS, "WORLD_SIZE", "SLURM_NTASKS")),
                    local_rank=_local_rank(env),
                    token_file=token_file, run_id=env.get("PS_RUN_ID", ""),
                    tls={k: env.get(v, "") for k, v in (("tls_ca", ENV_TLS_CA),
                                                         ("tls_cert", ENV_TLS_CERT),
                                                         ("tls_key", ENV_TLS_KEY))})
    if not 0 <= _context["rank"] < _context["size"]:
        raise ValueError(f"worker id {_context['rank']} outside [0, {_context['size']})")


def _local_rank(env):
    """LOCAL_RANK (torchrun, ps-launch), else, where no PS_ or torchrun rank says
    otherwise, a Slurm task's SLURM_LOCALID, else 0."""
    if env.get("LOCAL_RANK"):
        return int(env["LOCAL_RANK"])
    if env.get(ENV_WORKER_ID) or env.get("RANK"):
        return 0
    return int(env.get("SLURM_LOCALID") or 0)


def _need_init():
    if not _context:
        raise ValueError("call ps_server.torch.init() first")
    return _context


def rank():
    return _need_init()["rank"]


def size():
    return _need_init()["size"]


def local_rank():
    """This worker's rank among the workers on its host: torchrun's and ps-launch's
    LOCAL_RANK, else 0 (one worker per host, as in the Kubernetes worker Job)."""
    return _need_init()["local_rank"]


def shards():
    return list(_need_init()["shards"])
