"""ps-server from Python (docs/python.md).

ps_server.aggregators   the server's robust rules on numpy arrays and torch tensors
ps_server.codecs        the server's gradient codecs: the bytes a push carries

Errors: ValueError and TypeError for bad arguments (a wrong dtype, shape or spec);
ps_server.Error (a RuntimeError with a `code` naming the status) for the rest.
"""

from ._ps_server import Error

__all__ = ["Error", "aggregators", "codecs"]
__version__ = "0.1.0"


def __getattr__(name):
    # Submodules load on first use: `import ps_server; ps_server.codecs.encode(...)`.
    if name in ("aggregators", "codecs"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
