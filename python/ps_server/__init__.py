"""ps-server from Python (docs/python.md).

ps_server.Worker        a training process's connection to the shards
ps_server.aggregators   the server's robust rules on numpy arrays and torch tensors
ps_server.codecs        the server's gradient codecs: the bytes a push carries
ps_server.launch        start shards and worker processes on this machine (ps-launch)

Errors: ValueError and TypeError for bad arguments (a wrong dtype, shape or spec);
ps_server.Refused (an Error) for a shard's refusal, with its `reason` and, for a push,
`tensor`, `slice`, `round` and `shard`; ps_server.Error (a RuntimeError with a `code`
naming the status) for the rest.
"""

from ._ps_server import Error, Refused
from .worker import Worker

__all__ = ["Error", "Refused", "Worker", "aggregators", "codecs", "launch"]
__version__ = "0.1.0"


def __getattr__(name):
    # Submodules load on first use: `import ps_server; ps_server.codecs.encode(...)`.
    if name in ("aggregators", "codecs", "launch"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
