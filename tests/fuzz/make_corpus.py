#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

The files are checked in; rerun this after changing an input layout:
    python3 tests/fuzz/make_corpus.py
codec_decode input: byte 0 = codec index in CodecNames() (0 fp32, 1 fp16),
bytes 1-2 = declared element count (little-endian), then the payload.
"""
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent
FP32, FP16 = 0, 1
VERSION = 1


def codec_input(codec, numel, payload):
    return bytes([codec]) + struct.pack("<H", numel) + payload


def fp32(*values):
    return bytes([VERSION]) + struct.pack(f"<{len(values)}f", *values)


def fp32_bits(*bits):
    return bytes([VERSION]) + struct.pack(f"<{len(bits)}I", *bits)


def fp16_bits(*halves):
    return bytes([VERSION]) + struct.pack(f"<{len(halves)}H", *halves)


CODEC_DECODE = {
    "fp32_valid_0": codec_input(FP32, 0, bytes([VERSION])),
    "fp32_valid_2": codec_input(FP32, 2, fp32(1.0, -2.5)),
    "fp32_valid_9": codec_input(FP32, 9, fp32(0.0, -0.0, 1e-40, 3.0e38, -1.5, 0.1, 7, 8, 9)),
    "fp32_nan": codec_input(FP32, 2, fp32_bits(0x3F800000, 0x7FC00000)),
    "fp32_inf": codec_input(FP32, 1, fp32_bits(0xFF800000)),
    "fp32_truncated": codec_input(FP32, 2, fp32(1.0, 2.0)[:-1]),
    "fp16_valid_4": codec_input(FP16, 4, fp16_bits(0x3C00, 0x7BFF, 0x0001, 0x8000)),
    "fp16_valid_9": codec_input(FP16, 9, fp16_bits(*range(0x3C00, 0x3C09))),
    "fp16_inf": codec_input(FP16, 2, fp16_bits(0x3C00, 0x7C00)),
    "fp16_nan": codec_input(FP16, 9, fp16_bits(*([0] * 8 + [0xFE01]))),
    "fp16_bad_version": codec_input(FP16, 1, bytes([2]) + struct.pack("<H", 0x3C00)),
    "fp16_empty_payload": codec_input(FP16, 1, b""),
    "fp16_too_long": codec_input(FP16, 1, fp16_bits(0x3C00) + b"\x00"),
}


# Target name (tests/fuzz/CMakeLists.txt) -> {file name: input}.
CORPORA = {"codec_decode": CODEC_DECODE}


def main():
    for target, inputs in CORPORA.items():
        out = HERE / "corpus" / target
        out.mkdir(parents=True, exist_ok=True)
        for name, data in inputs.items():
            (out / name).write_bytes(data)
        print(f"wrote {len(inputs)} files to {out}")


if __name__ == "__main__":
    main()
