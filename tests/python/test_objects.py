"""ps_server._objects, the format of the objects workers send each other through shard 0
(broadcast_object, broadcast_optimizer_state, buffers): what it carries comes back equal,
what it cannot carry is refused on the writer's side, and bytes from another worker decode
into such a value or a ValueError, never anything else (no pickle), whatever they are: a
mutation loop below stands in for a fuzz target."""

import math
import random

import numpy as np
import pytest

from ps_server import _objects

torch = pytest.importorskip("torch")


def sample():
    return {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.arange(6.0).view(2, 3)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1],
                              "foreach": None, "maximize": False}],
            "raw": b"\x00\xff", "inf": float("inf"), "ints": np.arange(4, dtype=np.int64),
            "half": torch.ones(2, dtype=torch.float16), "nested": [[[]], ()], 7: "seven"}


def test_what_it_carries_comes_back_equal():
    v = sample()
    w = _objects.loads(_objects.dumps(v))
    assert w["param_groups"] == v["param_groups"]
    assert isinstance(w["param_groups"][0]["betas"], tuple)
    assert torch.equal(w["state"][0]["exp_avg"], v["state"][0]["exp_avg"])
    assert w["state"][0]["step"].dtype == torch.float32
    assert w["half"].dtype == torch.float16
    assert w["raw"] == b"\x00\xff" and math.isinf(w["inf"]) and w[7] == "seven"
    assert isinstance(w["ints"], np.ndarray) and w["ints"].tolist() == [0, 1, 2, 3]
    assert w["nested"] == [[[]], ()]
    nan = _objects.loads(_objects.dumps(float("nan")))
    assert math.isnan(nan)


@pytest.mark.parametrize("value", [object(), {1, 2}, torch.zeros(2, dtype=torch.complex64),
                                   lambda: 0])
def test_what_would_need_pickle_is_refused_by_the_writer(value):
    with pytest.raises(TypeError, match="cannot be sent"):
        _objects.dumps({"x": value})


def test_any_bytes_decode_or_raise_value_error():
    good = _objects.dumps(sample())
    rng = random.Random(1)
    outcomes = {"decoded": 0, "refused": 0}
    for i in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            kind = rng.random()
            at = rng.randrange(len(data) + 1)
            if kind < 0.5 and data:
                data[min(at, len(data) - 1)] = rng.randrange(256)
            elif kind < 0.75:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            else:
                del data[at:at + rng.randint(1, 16)]
        try:
            _objects.loads(bytes(data))
            outcomes["decoded"] += 1
        except ValueError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 1000, outcomes
    for bad in [b"", b"psobj\x00v1", b"psobj\x00v1\xff\xff\xff\xff", b"x" * 100,
                _objects.MAGIC + b"\x02\x00\x00\x00{}",
                _objects.MAGIC + b'\x40\x00\x00\x00{"__array__":0,"dtype":"float32",'
                                 b'"shape":[1099511627775,1099511627775],"torch":true}']:
        with pytest.raises(ValueError):
            _objects.loads(bad)
