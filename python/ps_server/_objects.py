"""Objects as bytes for the shards' object store (docs/objects.md), without pickle.

Another worker's bytes are data, never code: pickle would let a Byzantine root run code
on every worker that loads its broadcast. This format holds what optimizer states, module
buffers and small settings are made of: None, bool, int, float, str, bytes, lists,
tuples, dicts (keys of those kinds), numpy arrays and CPU torch tensors of plain numeric
dtypes. Anything else is a TypeError on the writer's side; bytes that do not decode into
exactly such a value are a ValueError on the reader's.

Layout: 8-byte magic, u32 little-endian length of a JSON header, the header, then every
array's bytes back to back. In the header arrays are {"__array__": i, "dtype": d,
"shape": [...], "torch": bool}, tuples {"__tuple__": [...]}, bytes {"__bytes__": hex},
dicts {"__dict__": [[key, value], ...]}.
"""

import json
import math
import struct

import numpy as np

MAGIC = b"psobj\x00v1"
_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
           "bool")
_MAX_DEPTH = 64

try:
    import torch
except ImportError:  # the format works without torch; tensors need it
    torch = None


def dumps(value):
    arrays = []

    def enc(v, depth):
        if depth > _MAX_DEPTH:
            raise TypeError("object nested deeper than 64 levels")
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            return {"__float__": v.hex()}  # exact, and inf/nan survive
        if isinstance(v, bytes):
            return {"__bytes__": v.hex()}
        if isinstance(v, (list, tuple)):
            items = [enc(x, depth + 1) for x in v]
            return items if isinstance(v, list) else {"__tuple__": items}
        if isinstance(v, dict):
            return {"__dict__": [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]}
        is_torch = torch is not None and isinstance(v, torch.Tensor)
        if is_torch or isinstance(v, np.ndarray):
            a = v.detach().cpu().numpy() if is_torch else v
            if str(a.dtype) not in _DTYPES:
                raise TypeError(f"an array of dtype {a.dtype} cannot be sent (one of "
                                f"{', '.join(_DTYPES)})")
            arrays.append(np.ascontiguousarray(a))
            return {"__array__": len(arrays) - 1, "dtype": str(a.dtype),
                    "shape": list(a.shape), "torch": is_torch}
        raise TypeError(f"a {type(v).__name__} cannot be sent to other workers (None, bool, "
                        "int, float, str, bytes, list, tuple, dict, numpy arrays and CPU "
                        "torch tensors can; no pickle: another worker's bytes stay data)")

    header = json.dumps(enc(value, 0), separators=(",", ":")).encode()
    return b"".join([MAGIC, struct.pack("<I", len(header)), header] +
                    [a.tobytes() for a in arrays])


def loads(data):
    def bad(why):
        return ValueError(f"not an object from ps_server: {why}")

    if len(data) < len(MAGIC) + 4 or data[:len(MAGIC)] != MAGIC:
        raise bad("no magic")
    n, = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    if n > len(data) - start:
        raise bad("header longer than the bytes")
    try:
        tree = json.loads(data[start:start + n].decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(f"header: {e}") from None
    offset = start + n
    arrays = []  # taken in the order dumps() wrote them

    def dec(v, depth):
        nonlocal offset
        if depth > _MAX_DEPTH:
            raise bad("nested deeper than 64 levels")
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, list):
            return [dec(x, depth + 1) for x in v]
        if not isinstance(v, dict) or len(v) == 0:
            raise bad(f"unexpected {type(v).__name__}")
        if "__float__" in v and len(v) == 1 and isinstance(v["__float__"], str):
            try:
                return float.fromhex(v["__float__"])
            except ValueError:
                raise bad("a float") from None
        if "__bytes__" in v and len(v) == 1 and isinstance(v["__bytes__"], str):
            try:
                return bytes.fromhex(v["__bytes__"])
            except ValueError:
                raise bad("bytes") from None
        if "__tuple__" in v and len(v) == 1 and isinstance(v["__tuple__"], list):
            return tuple(dec(x, depth + 1) for x in v["__tuple__"])
        if "__dict__" in v and len(v) == 1 and isinstance(v["__dict__"], list):
            out = {}
            for pair in v["__dict__"]:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise bad("a dict entry")
                key = dec(pair[0], depth + 1)
                try:
                    out[key] = dec(pair[1], depth + 1)
                except TypeError:
                    raise bad("an unhashable dict key") from None
            return out
        if set(v) == {"__array__", "dtype", "shape", "torch"}:
            if v["__array__"] != len(arrays) or v["dtype"] not in _DTYPES or \
                    not isinstance(v["shape"], list) or \
                    not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40
                            for d in v["shape"]):
                raise bad("an array's header")
            dtype = np.dtype(v["dtype"])
            count = math.prod(v["shape"])  # exact: a huge claim is refused below
            size = count * dtype.itemsize
            if size > len(data) - offset:
                raise bad("an array longer than the bytes")
            a = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(v["shape"])
            a = a.copy()
            offset += size
            arrays.append(a)
            if v["torch"]:
                if torch is None:
                    raise bad("a torch tensor, and torch is not installed")
                return torch.from_numpy(a)
            return a
        raise bad(f"unknown entry {sorted(v)[:3]}")

    value = dec(tree, 0)
    if offset != len(data):
        raise bad(f"{len(data) - offset} bytes after the last array")
    return value
