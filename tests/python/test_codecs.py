"""ps_server.codecs: the server's codecs from Python: round trips, the exact bytes the
C++ codecs write (the seed corpus the C++ fuzz targets start from), hostile payloads,
and bad input."""

import pathlib
import re

import numpy as np
import pytest

from ps_server import codecs

RNG = np.random.default_rng(3)
GRAD = RNG.normal(size=4096).astype(np.float32)


@pytest.mark.parametrize(
    "spec,max_error",
    [("fp32", 0.0), ("fp16", 2e-3), ("bf16", 2e-2), ("int8", 0.05)],
)
def test_dense_codecs_round_trip(spec, max_error):
    payload = codecs.encode(spec, GRAD)
    assert isinstance(payload, bytes)
    back = codecs.decode(spec, payload, GRAD.size)
    assert back.dtype == np.float32 and back.shape == GRAD.shape
    assert np.max(np.abs(back - GRAD)) <= max_error * max(1.0, np.max(np.abs(GRAD)))


def test_topk_keeps_the_largest_coordinates():
    codec = codecs.Codec("topk(0.01)+varint+fp16")
    assert codec.spec.startswith("topk(ratio=0.01")
    payload = codec.encode(GRAD)
    assert len(payload) < 0.05 * 4 * GRAD.size
    back = codec.decode(payload, GRAD.size)
    kept = np.flatnonzero(back)
    assert len(kept) == int(0.01 * GRAD.size) or abs(len(kept) - 0.01 * GRAD.size) <= 1
    largest = np.argsort(-np.abs(GRAD), kind="stable")[: len(kept)]
    assert set(kept) == set(largest)
    np.testing.assert_allclose(back[kept], GRAD[kept], rtol=1e-3)


def test_stochastic_codecs_depend_on_seed_worker_round_and_slice():
    a = codecs.Codec("qsgd(s=4)", seed=1)
    same = codecs.Codec("qsgd(s=4)", seed=1)
    assert a.encode(GRAD, round=3, slice=2, worker=1) == same.encode(GRAD, round=3, slice=2, worker=1)
    assert a.encode(GRAD, round=3, slice=2, worker=1) != a.encode(GRAD, round=4, slice=2, worker=1)
    assert a.encode(GRAD, worker=1) != codecs.Codec("qsgd(s=4)", seed=2).encode(GRAD, worker=1)


def test_decode_into_writes_a_torch_tensor_in_place():
    torch = pytest.importorskip("torch")
    grad = torch.from_numpy(GRAD.copy())
    payload = codecs.encode("fp16", grad)
    assert payload == codecs.encode("fp16", GRAD)
    out = torch.zeros(GRAD.size)
    assert codecs.Codec("fp16").decode(payload, GRAD.size, out=out) is out
    np.testing.assert_allclose(out.numpy(), GRAD, atol=2e-3)


TESTS = pathlib.Path(__file__).resolve().parent.parent
MASK = (1 << 64) - 1


def example_specs():
    """The spec list of tests/codecs/example_specs.h, in order (byte 0 of a seed file
    indexes it)."""
    text = (TESTS / "codecs" / "example_specs.h").read_text()
    body = text[text.index("ExampleSpecs()"):]
    return re.findall(r'^\s*\{"([^"]+)",', body, flags=re.M)


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def seed_gaussian(n, stream):
    """tests/fuzz/codec_seeds.cc's Gaussian(n, stream), bit for bit."""
    base = splitmix64(stream)
    out = np.empty(n, dtype=np.float32)
    scale = np.float32(1.7320508) / np.float32(65536.0)
    for j in range(n):
        r = splitmix64((base + j) & MASK)
        s = (r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48)
        out[j] = np.float32(s - 131070) * scale
    return out


def test_payloads_are_the_bytes_the_cpp_codecs_write():
    # The codec fuzz target's seed corpus holds payloads written by the C++ codecs
    # (tests/fuzz/codec_seeds.cc: seed 1, round 1, slice 2, worker 3): Python's encode
    # of the same values must give the same bytes, for every example spec.
    specs = example_specs()
    corpus = TESTS / "fuzz" / "corpus" / "codec_decode"
    cases = {"gauss_5": (5, 0), "gauss_300": (300, 20)}
    checked = 0
    for path in sorted(corpus.iterdir()):
        name = path.name
        case = next((c for c in cases if name.endswith("_" + c)), None)
        if case is None or not name[:3].isdigit():
            continue
        data = path.read_bytes()
        spec = specs[data[0]]
        numel, cols = cases[case]
        assert data[1] | (data[2] << 8) == numel
        values = seed_gaussian(numel, numel)
        if spec.startswith("powersgd") and cols == 0:
            # The C++ codec sends such values raw; the Python call refuses to do so silently.
            with pytest.raises(ValueError, match="compresses a matrix: pass matrix_cols"):
                codecs.Codec(spec, seed=1).encode(values, matrix_cols=cols)
            payload = codecs.Codec(spec, seed=1)._codec.encode(values, round=1, slice=2,
                                                               worker=3, matrix_cols=cols)
        else:
            payload = codecs.Codec(spec, seed=1).encode(values, round=1, slice=2, worker=3,
                                                        matrix_cols=cols)
        assert payload == data[3:], f"{spec} ({name})"
        codecs.decode(spec, payload, numel)  # and a shard's decoder takes it
        checked += 1
    assert checked >= 2 * len(specs) - 4, f"only {checked} seed payloads for {len(specs)} specs"


def test_a_payload_of_another_codec_is_refused_naming_its_format():
    # fp16 and bf16 payloads of the same values have the same size: before payloads named
    # their codec, an fp16 payload decoded as bf16 gave other values without an error.
    payload = codecs.encode("fp16", GRAD)
    assert len(payload) == len(codecs.encode("bf16", GRAD))
    with pytest.raises(ValueError, match=r"bf16: payload in the fp16 format \(2\), "
                                         r"expected the bf16 format \(3\)"):
        codecs.decode("bf16", payload, GRAD.size)
    with pytest.raises(ValueError, match="payload in the fp16 format"):
        codecs.decode("int8", payload, GRAD.size)
    with pytest.raises(ValueError, match="payload in the int8 format"):
        codecs.decode("fp32", codecs.encode("int8", GRAD), GRAD.size)


def test_powersgd_without_a_matrix_shape_is_refused():
    grad = np.random.default_rng(2).normal(size=64).astype(np.float32)
    for cols in (0, 7):
        with pytest.raises(ValueError, match="compresses a matrix: pass matrix_cols"):
            codecs.encode("powersgd(rank=1)", grad, matrix_cols=cols)
    payload = codecs.encode("powersgd(rank=1)", grad, matrix_cols=8)  # 8 x 8, rank 1
    assert len(payload) < grad.size * 4 / 2
    assert codecs.decode("powersgd(rank=1)", payload, grad.size).shape == (64,)


def test_hostile_payloads_are_refused_and_write_nothing():
    codec = codecs.Codec("fp16")
    payload = bytearray(codec.encode(GRAD))
    out = np.full(GRAD.size, 7.0, dtype=np.float32)
    with pytest.raises(ValueError):
        codec.decode(bytes(payload[:-1]), GRAD.size)  # truncated
    with pytest.raises(ValueError):
        codec.decode(payload, GRAD.size + 1)  # wrong size
    payload[0] = 99  # a format no codec writes
    with pytest.raises(ValueError):
        codec.decode(bytes(payload), GRAD.size, out=out)
    assert np.all(out == 7.0)
    nan = np.full(16, np.nan, dtype=np.float32)
    with pytest.raises(ValueError, match="finite"):
        codecs.decode("fp32", codecs.encode("fp32", np.zeros(16, np.float32))[:1] + nan.tobytes(), 16)


def test_bad_arguments_are_refused_clearly():
    with pytest.raises(ValueError, match="unknown codec 'zip'"):
        codecs.Codec("zip")
    with pytest.raises(TypeError, match="float32"):
        codecs.encode("fp16", GRAD.astype(np.float64))
    with pytest.raises(ValueError, match="1 dimension"):
        codecs.encode("fp16", GRAD.reshape(64, 64))
    with pytest.raises(ValueError, match="contiguous"):
        codecs.encode("fp16", GRAD[::2])
    with pytest.raises(ValueError, match="holds 10 values"):
        codecs.Codec("fp16").decode(codecs.encode("fp16", GRAD), GRAD.size,
                                    out=np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="cannot encode value 3: not finite"):
        codecs.encode("fp16", np.array([0, 1, 2, np.inf], dtype=np.float32))
    assert "topk" in codecs.names() and "varint" in codecs.stages()
