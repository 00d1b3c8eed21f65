"""ps-server's gradient codecs on numpy arrays and CPU torch tensors: the bytes a push
carries and the values a shard decodes from them (docs/codecs.md).

    >>> import numpy as np, ps_server.codecs as codecs
    >>> grad = np.random.default_rng(0).normal(size=4096).astype(np.float32)
    >>> payload = codecs.encode("topk(0.01)+varint+fp16", grad)
    >>> codecs.decode("topk(0.01)+varint+fp16", payload, grad.size).shape
    (4096,)

A payload from an untrusted source is checked as a shard checks it: a malformed one
raises ValueError and writes nothing.
"""

from . import _arrays
from ._ps_server import Codec as _Codec
from ._ps_server import codec_names, stage_names

__all__ = ["Codec", "encode", "decode", "names", "stages"]


def names():
    """Codec names a spec may start with."""
    return codec_names()


def stages():
    """Every stage name a spec may contain (a shard's --allowed-codecs names these)."""
    return stage_names()


class Codec:
    """One codec instance. Encodes of one instance take turns (PowerSGD keeps a warm
    start between them); decodes may run concurrently."""

    def __init__(self, spec, seed=0):
        self._codec = _Codec(spec, seed=seed)

    @property
    def spec(self):
        """The canonical spec, every argument written out (pushes carry it)."""
        return self._codec.spec

    def encode(self, values, round=0, slice=0, worker=0, matrix_cols=0):
        """The payload (bytes) the worker library would push for `values` (1-D float32)."""
        array = _arrays.as_float32(values, "values", 1)
        if self.spec.startswith("powersgd") and (matrix_cols <= 0 or array.size % matrix_cols):
            # The codec would send these values raw: say so instead of doing it silently.
            raise ValueError(
                f"{self.spec} compresses a matrix: pass matrix_cols, the row length of the "
                f"values as a row-major matrix (a divisor of their {array.size}); without "
                "one they would go as raw fp32")
        return self._codec.encode(array, round=round, slice=slice, worker=worker,
                                  matrix_cols=matrix_cols)

    def decode(self, payload, numel, out=None):
        """The values `payload` carries (numel float32): a new array, or written into
        `out` (a writable 1-D float32 array or CPU tensor of numel values) and returned."""
        if out is None:
            return self._codec.decode(bytes(payload), numel)
        array = _arrays.as_float32(out, "out", 1)
        if array.size != numel:
            raise ValueError(f"out holds {array.size} values, numel is {numel}")
        self._codec.decode_into(bytes(payload), array)
        return out

    def max_encoded_bytes(self, numel):
        return self._codec.max_encoded_bytes(numel)

    def __repr__(self):
        return f"Codec({self.spec!r})"


def encode(spec, values, seed=0, **context):
    """Codec(spec, seed).encode(values, **context)."""
    return Codec(spec, seed).encode(values, **context)


def decode(spec, payload, numel):
    """Codec(spec).decode(payload, numel)."""
    return Codec(spec).decode(payload, numel)
