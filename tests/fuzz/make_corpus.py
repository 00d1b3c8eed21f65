#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

The files are checked in; rerun this after changing an input layout:
    python3 tests/fuzz/make_corpus.py [--codec-seeds BUILD/fuzz/codec_seeds]
peer_share and aggregator_spec: see share() and AGGREGATOR_SPEC below.
codec_decode: written by the C++ tool tests/fuzz/codec_seeds.cc (every spec of
tests/codecs/example_specs.h encodes a few inputs), which this script runs when it
finds the binary (--codec-seeds, else build*/fuzz/codec_seeds); by hand:
    ninja -C build codec_seeds && build/fuzz/codec_seeds --out tests/fuzz/corpus/codec_decode
ctest fuzz_codec_seeds_current fails while that corpus is stale.
"""
import argparse
import pathlib
import struct
import subprocess

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def share(fix, layout_hash=0, shard_id=1, round_=0, participants=(), gram=()):
    """peer_share input: byte 0 (bit 0: harness fixes hash, shard id and round), then a
    ps.v1.RoundShareRequest in protobuf wire format."""
    msg = b"\x09" + struct.pack("<Q", layout_hash)
    msg += b"\x10" + varint(shard_id) + b"\x18" + varint(round_)
    packed = b"".join(varint(p) for p in participants)
    msg += b"\x22" + varint(len(packed)) + packed
    doubles = struct.pack(f"<{len(gram)}d", *gram)
    msg += b"\x2a" + varint(len(doubles)) + doubles
    return bytes([1 if fix else 0]) + msg


def identity(k, scale=1.0):
    return [scale if i == j else 0.0 for i in range(k) for j in range(k)]


PEER_SHARE = {
    "valid_identity": share(True, participants=range(7), gram=identity(7)),
    "valid_subset": share(True, participants=(0, 2, 3, 5, 6), gram=identity(5, 4.0)),
    "huge_values": share(True, participants=range(7), gram=identity(7, 1e300)),
    "negative_diagonal": share(True, participants=range(7), gram=identity(7, -5.0)),
    "too_few": share(True, participants=(1, 2), gram=identity(2)),
    "nan": share(True, participants=(0,), gram=[float("nan")]),
    "unsorted": share(True, participants=(3, 1, 2), gram=identity(3)),
    "wrong_size": share(True, participants=range(7), gram=identity(6)),
    "unfixed": share(False, layout_hash=12345, shard_id=0, round_=9, participants=range(7),
                     gram=identity(7)),
}

AGGREGATOR_SPEC = {
    name: spec.encode()
    for name, spec in {
        "mean": "mean",
        "chain": "clip(2)+nnm+trimmed_mean",
        "bucketing_cc": "bucketing(s=3)+centered_clipping(tau=10, iterations=3)",
        "multi_krum": "multi_krum(m=5, neighbours=byzfl)",
        "gm": "geometric_median(nu=1e-3, iterations=7, tolerance=0)",
        "arc_bulyan": "arc+bulyan",
        "mda": "mda(max_subsets=100)",
        "median_even": "median(even=lower)",
        "meamed_phocas": "nnm+meamed",
        "bad_paren": "clip(2+krum",
        "empty_arg": "krum(,)",
    }.items()
}


# Target name (tests/fuzz/CMakeLists.txt) -> {file name: input}. codec_decode: codec_seeds.
CORPORA = {"peer_share": PEER_SHARE, "aggregator_spec": AGGREGATOR_SPEC}


def main():
    parser = argparse.ArgumentParser(description="Writes the fuzz seed corpora.")
    parser.add_argument("--codec-seeds", type=pathlib.Path,
                        help="the codec_seeds binary (default: the newest build*/fuzz/codec_seeds)")
    args = parser.parse_args()
    for target, inputs in CORPORA.items():
        out = HERE / "corpus" / target
        out.mkdir(parents=True, exist_ok=True)
        for name, data in inputs.items():
            (out / name).write_bytes(data)
        print(f"wrote {len(inputs)} files to {out}")
    tool = args.codec_seeds
    if tool is None:
        found = sorted(ROOT.glob("build*/fuzz/codec_seeds"), key=lambda p: p.stat().st_mtime)
        tool = found[-1] if found else None
    if tool is None:
        print("codec_decode: no codec_seeds binary; build it (ninja -C build codec_seeds) and "
              "run build/fuzz/codec_seeds --out tests/fuzz/corpus/codec_decode")
        return
    subprocess.run([str(tool), "--out", str(HERE / "corpus" / "codec_decode")], check=True)


if __name__ == "__main__":
    main()
