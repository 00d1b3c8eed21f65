#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

The files are checked in; rerun this after changing an input layout:
    python3 tests/fuzz/make_corpus.py [--codec-seeds BUILD/fuzz/codec_seeds]
peer_share, aggregator_spec, udp_datagram, checkpoint, wire, held_model, auth_header,
data_frame, data_connection, data_channel: see share(), AGGREGATOR_SPEC, datagram(),
checkpoint_body(), wire(), held_frame(), auth(), df_frame(), dc() and dch() below.
codec_decode: written by the C++ tool tests/fuzz/codec_seeds.cc (every spec of
tests/codecs/example_specs.h encodes a few inputs), which this script runs when it
finds the binary (--codec-seeds, else build*/fuzz/codec_seeds); by hand:
    ninja -C build codec_seeds && build/fuzz/codec_seeds --out tests/fuzz/corpus/codec_decode
ctest fuzz_codec_seeds_current fails while that corpus is stale.
"""
import argparse
import hashlib
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
        # Tensors' optimizer specs (the same target tries each input as one).
        "sgd_nesterov": "sgd(lr=0.1, momentum=0.9, dampening=0, nesterov=1, weight_decay=1e-4)",
        "adam": "adam(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0)",
        "adamw": "adamw(lr=3e-4, weight_decay=0.05)",
    }.items()
}


UDP_KEY = b"ps-server udp_datagram fuzz key!"  # kKey in udp_datagram_fuzz.cc


def _aes_sbox():
    """FIPS 197, 5.1.1: the multiplicative inverse in GF(2^8), then the affine map."""
    def mul(a, b):
        r = 0
        while b:
            if b & 1:
                r ^= a
            a = ((a << 1) ^ (0x11B if a & 0x80 else 0)) & 0x1FF
            b >>= 1
        return r
    box = []
    for x in range(256):
        inv = next((y for y in range(1, 256) if mul(x, y) == 1), 0)
        b = inv
        for shift in range(1, 5):
            b ^= ((inv << shift) | (inv >> (8 - shift))) & 0xFF
        box.append(b ^ 0x63)
    return box


_SBOX = _aes_sbox()


def _xtime(b):
    return ((b << 1) ^ (0x1B if b & 0x80 else 0)) & 0xFF


def aes256_encrypt(key, block):
    """FIPS 197: one block under a 32-byte key."""
    words = [list(key[i:i + 4]) for i in range(0, 32, 4)]
    rcon = 1
    for i in range(8, 60):
        t = list(words[i - 1])
        if i % 8 == 0:
            t = [_SBOX[b] for b in t[1:] + t[:1]]
            t[0] ^= rcon
            rcon = _xtime(rcon)
        elif i % 8 == 4:
            t = [_SBOX[b] for b in t]
        words.append([a ^ b for a, b in zip(words[i - 8], t)])
    state = [b ^ k for b, k in zip(block, sum(words[0:4], []))]
    for rnd in range(1, 15):
        state = [_SBOX[b] for b in state]
        state = [state[(i + 4 * (i % 4)) % 16] for i in range(16)]  # ShiftRows, column-major
        if rnd < 14:
            mixed = []
            for c in range(4):
                a = state[4 * c:4 * c + 4]
                for r in range(4):
                    mixed.append(_xtime(a[r]) ^ _xtime(a[(r + 1) % 4]) ^ a[(r + 1) % 4]
                                 ^ a[(r + 2) % 4] ^ a[(r + 3) % 4])
            state = mixed
        state = [b ^ k for b, k in zip(state, sum(words[4 * rnd:4 * rnd + 4], []))]
    return bytes(state)


def _gf128_mul(x, y):
    """SP 800-38D, 6.3: the product in GHASH's field, blocks as big-endian integers."""
    r = 0xE1 << 120
    z, v = 0, y
    for i in range(127, -1, -1):
        if (x >> i) & 1:
            z ^= v
        v = (v >> 1) ^ (r if v & 1 else 0)
    return z


def gmac_tag(key, nonce, aad):
    """AES-256-GCM's tag of `aad` with no plaintext (SP 800-38D; crypto/gmac.h)."""
    h = int.from_bytes(aes256_encrypt(key, bytes(16)), "big")
    msg = aad + b"\x00" * (-len(aad) % 16) + struct.pack(">QQ", 8 * len(aad), 0)
    y = 0
    for i in range(0, len(msg), 16):
        y = _gf128_mul(y ^ int.from_bytes(msg[i:i + 16], "big"), h)
    mask = int.from_bytes(aes256_encrypt(key, nonce + b"\x00\x00\x00\x01"), "big")
    return (y ^ mask).to_bytes(16, "big")


# Published answers (the GCM specification's test case 13; NIST CAVP
# gcmEncryptExtIV256.rsp, PTlen 0, AADlen 128, count 0): a wrong gmac_tag stops here
# rather than writing seeds that do not verify.
assert gmac_tag(bytes(32), bytes(12), b"").hex() == "530f8afbc74536b9a963b4f1c4cb738b"
assert gmac_tag(bytes.fromhex("78dc4e0aaf52d935c3c01eea57428f00ca1fd475f5da86a49c8dd73d68c8e223"),
                bytes.fromhex("d79cf22d504cc793c3fb6c8a"),
                bytes.fromhex("b96baa8c1c75a671bfb2d08d06be5f36")
                ).hex() == "3e5d486aa2e30b22e040b85723a06e76"


UDP_NONCE = bytes(range(0xA0, 0xAC))


def datagram(chunk_elems=256, chunk_index=0, chunk_count=4, payload=b"", codec=b"fp32",
             key=UDP_KEY, session=0x0123456789ABCDEF, worker=3, slice_=17, round_=42,
             magic=b"PSU1", version=4, codec_len=None, kind=0, reserved=0, payload_len=None,
             nonce=UDP_NONCE):
    """udp_datagram input: one datagram (net/udp_frame.h), its MAC the GMAC tag of
    everything before it under `key` and the datagram's nonce."""
    head = magic + struct.pack(
        "<BBBBQIIQIHHI", version, len(codec) if codec_len is None else codec_len, kind, reserved,
        session, worker, slice_, round_, chunk_elems, chunk_index, chunk_count,
        len(payload) if payload_len is None else payload_len) + nonce
    signed = head + codec + payload
    return signed + gmac_tag(key, nonce, signed)


def fp32(values):
    """The fp32 codec's payload: format byte 1, then little-endian floats."""
    return b"\x01" + struct.pack(f"<{len(values)}f", *values)


def fp16(values):
    """The fp16 codec's payload: format byte 2, then little-endian halves."""
    return b"\x02" + struct.pack(f"<{len(values)}e", *values)


def flip(data, index, mask=0x01):
    b = bytearray(data)
    b[index] ^= mask
    return bytes(b)


# The fuzz target checks chunk geometry against a slice of 1000 coordinates:
# chunks of 256 -> 4 chunks, the last one of 232.
_V = datagram(payload=fp32([0.25 * i - 3.0 for i in range(8)]))
UDP_DATAGRAM = {
    "valid_fp32_chunk0": datagram(payload=fp32([0.01 * i for i in range(256)])),
    "valid_fp32_last_partial": datagram(chunk_index=3, payload=fp32([-0.5] * 232)),
    "valid_fp16_single_chunk": datagram(chunk_elems=1000, chunk_count=1, codec=b"fp16",
                                        payload=fp16([0.125 * (i % 9) for i in range(40)])),
    "valid_topk_codec": datagram(chunk_index=1, codec=b"topk(0.01)+bloom(p0, fpr=0.01)+fp16",
                                 payload=bytes(range(1, 60))),
    "valid_codec_64": datagram(chunk_index=2, codec=b"qsgd(s=16)+" + b"x" * 53,
                               payload=b"\x01\x02\x03"),
    "valid_empty_payload": datagram(chunk_index=1),
    "valid_fp32_8": _V,
    "valid_geometry_mismatch": datagram(chunk_elems=100, chunk_count=3, chunk_index=2,
                                        payload=fp32([1.0] * 4)),
    "valid_max_fields": datagram(chunk_elems=0xFFFFFFFF, chunk_index=0xFFFE, chunk_count=0xFFFF,
                                 session=2**64 - 1, worker=2**32 - 1, slice_=2**32 - 1,
                                 round_=2**64 - 1, payload=b"\xff" * 5),
    "wrong_key": datagram(payload=fp32([1.0] * 8), key=bytes(32)),
    "mac_flipped": flip(_V, len(_V) - 1),
    "signed_byte_flipped": flip(_V, 30),
    "truncated_mac": _V[:-1],
    "too_short": _V[:72],
    "bad_magic": datagram(magic=b"PSU2"),
    "bad_version": datagram(version=5, payload=b"\x01"),
    "old_version_1": datagram(version=1, payload=b"\x01"),
    "old_version_2": datagram(version=2, payload=b"\x01"),
    "old_version_3": datagram(version=3, payload=b"\x01"),
    "nonce_flipped": flip(_V, 50),
    "codec_len_0": datagram(codec_len=0, payload=b"\x01"),
    "codec_len_65": datagram(codec_len=65, payload=b"\x01" * 70),
    "reserved_set": datagram(reserved=1, payload=b"\x01"),
    "valid_end": datagram(kind=1),
    "end_with_payload": datagram(kind=1, payload=b"\x01"),
    "valid_end_of_three": datagram(kind=1, payload=struct.pack("<IHH", 18, 4, 0)
                                   + struct.pack("<IHH", 40, 1, 0)),
    "end_entry_chunk_count_0": datagram(kind=1, payload=struct.pack("<IHH", 18, 0, 0)),
    "end_entry_reserved": datagram(kind=1, payload=struct.pack("<IHH", 18, 4, 1)),
    "end_partial_entry": datagram(kind=1, payload=struct.pack("<IHH", 18, 4, 0) + b"\x01"),
    "end_chunk_index_1": datagram(kind=1, chunk_index=1),
    "kind_2": datagram(kind=2, payload=b"\x01"),
    "payload_len_short": datagram(payload=b"\x01\x02", payload_len=1),
    "payload_len_huge": datagram(payload=b"\x01\x02", payload_len=0xFFFFFFFF),
    "codec_bad_char": datagram(codec=b"fp32;", payload=b"\x01"),
    "chunk_count_0": datagram(chunk_index=0, chunk_count=0),
    "chunk_index_eq_count": datagram(chunk_index=4, chunk_count=4),
    "chunk_elems_0": datagram(chunk_elems=0),
}


def pb_bytes(field, data):
    return varint(field << 3 | 2) + varint(len(data)) + data


def pb_uint(field, v):
    return varint(field << 3) + varint(v)


def layout_hash(tensors, slice_elems, num_shards):
    """core/layout.cc LayoutDigest: SHA-256 of a length-prefixed encoding, first 8 bytes."""
    buf = b"ps.layout.v1" + struct.pack("<Q", len(tensors))
    for name, numel, priority in tensors:
        buf += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<Qq", numel, priority)
    buf += struct.pack("<QQ", slice_elems, num_shards)
    return struct.unpack("<Q", hashlib.sha256(buf).digest()[:8])[0]


def checkpoint_body(tensors=(("w", 10, 0),), slice_elems=4, slices=None, shard_id=0,
                    num_shards=1, velocity=True, rule_rows=0, version=7, hash_=None,
                    with_layout=True):
    """A ps.v1.ShardCheckpoint (proto/ps/v1/checkpoint.proto). With one shard, shard 0
    owns every slice; slices are cut per tensor in slice_elems pieces."""
    msg = pb_uint(1, shard_id) + pb_uint(2, num_shards)
    if with_layout:
        h = layout_hash(tensors, slice_elems, num_shards) if hash_ is None else hash_
        msg += varint(3 << 3 | 1) + struct.pack("<Q", h)
        layout = b"".join(
            pb_bytes(1, pb_bytes(1, n.encode()) + pb_uint(2, numel) + pb_uint(3, prio))
            for n, numel, prio in tensors)
        layout += pb_uint(2, slice_elems) + pb_uint(3, num_shards)
        msg += pb_bytes(4, layout)
    msg += pb_bytes(5, b"shards=1 workers=3 rule=median") + pb_uint(6, 1795000000)
    if slices is None:
        slices = [min(slice_elems, numel - off) for _, numel, _ in tensors
                  for off in range(0, numel, slice_elems)] if with_layout else []
    for i, numel in enumerate(slices):
        values = struct.pack(f"<{numel}f", *[0.5 * i - 0.25 * j for j in range(numel)])
        s = pb_uint(1, i) + pb_uint(2, version) + pb_bytes(3, values)
        if velocity:
            s += pb_bytes(4, struct.pack(f"<{numel}f", *[0.01 * j for j in range(numel)]))
        if rule_rows:
            s += pb_bytes(5, struct.pack(f"<{numel * rule_rows}f", *[1.0] * (numel * rule_rows)))
        msg += pb_bytes(7, s)
    return msg


def pb_double(field, value):
    return varint(field << 3 | 1) + struct.pack("<d", value)


def checkpoint_workers():
    """ShardCheckpoint fields 8 and 9: two workers (one present, one that left) and one
    suspicion window over three worker ids."""
    w0 = pb_uint(1, 0) + pb_bytes(2, b"present") + pb_double(3, 0.1) + pb_uint(7, 40)
    w2 = (pb_uint(1, 2) + pb_bytes(2, b"left") + pb_double(3, 0.7) + pb_uint(6, 1)
          + pb_uint(9, 2) + pb_uint(10, 1))
    window = pb_uint(1, 50) + b"".join(
        pb_bytes(f, struct.pack("<3d", *vals))
        for f, vals in ((2, (0.1, float("nan"), 0.7)), (3, (0.1, float("nan"), 0.7)),
                        (4, (0.6, float("nan"), -0.2))))
    return pb_bytes(8, w0) + pb_bytes(8, w2) + pb_bytes(9, window)


def checkpoint_file(body):
    """server/checkpoint.cc: magic, body length (u64 LE), body, SHA-256 of all before."""
    head = b"PSCKPT\0\1" + struct.pack("<Q", len(body))
    return head + body + hashlib.sha256(head + body).digest()


_CK = checkpoint_body()
CHECKPOINT = {
    # Byte 0 bit 0: the harness frames the rest (correct checksum); else the whole file.
    "framed_one_tensor": b"\x01" + _CK,
    "framed_two_tensors": b"\x01" + checkpoint_body(
        tensors=(("w", 9, 0), ("b", 3, 1)), slice_elems=4, rule_rows=1),
    "framed_aggregate_only": b"\x01" + checkpoint_body(velocity=False, version=0),
    "framed_no_layout": b"\x01" + checkpoint_body(with_layout=False),
    "framed_wrong_hash": b"\x01" + checkpoint_body(hash_=12345),
    "framed_missing_slice": b"\x01" + checkpoint_body(slices=[4, 4]),
    "framed_nan": b"\x01" + _CK.replace(struct.pack("<f", 0.5), struct.pack("<f", float("nan")), 1),
    "framed_shard_out_of_range": b"\x01" + checkpoint_body(shard_id=2, num_shards=2),
    "framed_workers": b"\x01" + _CK + checkpoint_workers(),
    "framed_worker_bad_state": b"\x01" + _CK + pb_bytes(8, pb_uint(1, 3) + pb_bytes(2, b"gone")),
    "file_valid": b"\x00" + checkpoint_file(_CK),
    "file_bit_flip": b"\x00" + flip(checkpoint_file(_CK), 40),
    "file_truncated": b"\x00" + checkpoint_file(_CK)[:-5],
    "file_bad_magic": b"\x00" + b"PSCKPT\0\2" + checkpoint_file(_CK)[8:],
}


# Target name (tests/fuzz/CMakeLists.txt) -> {file name: input}. codec_decode: codec_seeds.
def wire(push, body, cut1=0, cut2=0, kind=None):
    """wire input: byte 0 (modulo 3: 0 PullResponse, 1 PushRequest, 2 PullRequest, whose
    bound on slice ids is byte 0 / 3), the two cut points, then the message in protobuf
    wire format."""
    if kind is None:
        kind = 1 if push else 0
    return bytes([kind, cut1, cut2]) + body


def pull_request(session, layout_hash, slice_ids, min_version, held=(), packed=True):
    msg = pb_bytes(1, session) + b"\x11" + struct.pack("<Q", layout_hash)
    if packed:
        msg += pb_bytes(3, b"".join(varint(i) for i in slice_ids))
    else:
        msg += b"".join(pb_uint(3, i) for i in slice_ids)
    msg += pb_uint(4, min_version)
    if held:
        msg += pb_bytes(5, b"".join(varint(v) for v in held))
    return msg


def pull_response(slice_id, version, values):
    return pb_uint(1, slice_id) + pb_uint(2, version) + pb_bytes(3, values)


def push_request(session, layout_hash, round_, slice_id, codec, payload):
    return (pb_bytes(1, session) + b"\x11" + struct.pack("<Q", layout_hash) + pb_uint(3, round_) +
            pb_uint(4, slice_id) + pb_bytes(5, codec) + pb_bytes(6, payload))


WIRE = {
    "pull_fp32": wire(False, pull_response(3, 7, fp32([1.0, -2.0, 0.5])), 4, 3),
    "pull_zero_fields": wire(False, pb_bytes(3, fp32([0.25]))),
    "pull_unknown_fields": wire(False, pull_response(1, 2, b"") + pb_uint(9, 5) + pb_bytes(10, b"x"), 1, 1),
    "push_fp32": wire(True, push_request(b"token", 0x1234, 5, 2, b"fp32", fp32([1.0, 2.0])), 9, 20),
    "push_fp16": wire(True, push_request(b"t", 1, 0, 0, b"fp16", fp16([0.5, -1.5])), 2, 0),
    "push_truncated": wire(True, push_request(b"t", 1, 0, 0, b"fp32", b"\x01abcd")[:-2]),
    # PullRequest: byte 0 = 2 + 3 * bound.
    "pull_request_packed": wire(False, pull_request(b"s", 0x1234, [0, 3, 70000], 7, [1, 2, 3]),
                                5, 9, kind=2 + 3 * 8),
    "pull_request_unpacked": wire(False, pull_request(b"s", 1, [4, 5], 0, packed=False), 3, 1,
                                  kind=2 + 3 * 8),
    "pull_request_over_bound": wire(False, pull_request(b"s", 1, list(range(20)), 1), 7, 2,
                                    kind=2 + 3 * 4),
}

def held_frame(slice_=0, change=False, epoch=1, codec=0, version=1, base=0, payload=b"",
               cut=0, spec=None):
    """held_model input: one frame (see held_model_fuzz.cc). codec 15 takes `spec`."""
    b0 = slice_ | (2 if change else 0) | (epoch << 2) | (codec << 4)
    head = bytes([b0, version, base]) + struct.pack("<H", len(payload)) + bytes([cut])
    if change and codec == 15:
        head += bytes([len(spec)]) + spec
    return head + payload


_DENSE_A = fp32([0.5 * i for i in range(64)])[1:]  # dense values are raw floats
_DENSE_B = fp32([-0.25 * i for i in range(37)])[1:]
HELD_MODEL = {
    "dense_then_fp32_change": held_frame(payload=_DENSE_A) + held_frame(
        change=True, codec=0, version=2, base=1, payload=fp32([0.125] * 64), cut=7),
    "dense_then_fp16_change": held_frame(payload=_DENSE_A) + held_frame(
        change=True, codec=1, version=2, base=1, payload=fp16([1.0] * 64)),
    "both_slices_two_changes": held_frame(payload=_DENSE_A) + held_frame(
        slice_=1, epoch=2, payload=_DENSE_B, cut=40) + held_frame(
        change=True, version=2, base=1, payload=fp32([1.0] * 64)) + held_frame(
        slice_=1, change=True, epoch=2, version=2, base=1, payload=fp32([-1.0] * 37)),
    "change_applied_twice": held_frame(payload=_DENSE_A) + 2 * held_frame(
        change=True, version=2, base=1, payload=fp32([2.0] * 64)),
    "change_without_held": held_frame(change=True, version=2, base=1, payload=fp32([1.0] * 64)),
    "change_of_another_epoch": held_frame(payload=_DENSE_A) + held_frame(
        change=True, epoch=2, version=2, base=1, payload=fp32([1.0] * 64)),
    "change_of_another_base": held_frame(payload=_DENSE_A, version=5) + held_frame(
        change=True, version=7, base=6, payload=fp32([1.0] * 64)),
    "change_to_infinity": held_frame(payload=fp32([3e38] * 64)[1:]) + held_frame(
        change=True, version=2, base=1, payload=fp32([3e38] * 64)),
    "change_short": held_frame(payload=_DENSE_A) + held_frame(
        change=True, version=2, base=1, payload=fp32([1.0] * 63)),
    "dense_wrong_size": held_frame(payload=_DENSE_A[:-4]),
    "dense_without_epoch": held_frame(epoch=0, payload=_DENSE_A),
    "spec_in_input": held_frame(payload=_DENSE_A) + held_frame(
        change=True, codec=15, spec=b"fp16", version=2, base=1, payload=fp16([0.5] * 64)),
    "unknown_spec": held_frame(payload=_DENSE_A) + held_frame(
        change=True, codec=15, spec=b"nope(1)", version=2, base=1, payload=b"\x01\x02"),
}

# auth_header (auth_header_fuzz.cc): byte 0 the form (0 the rest as it is, 1 challenge,
# 2 proof, 3 challenge answer, 4 stale refusal, 5 bearer), byte 1 the choices of the
# built forms, byte 2 the shard they are built for (bits 0-1: 0 secret, 1 token file,
# 2 TLS with both) and the certificate name (bits 2-4: 4 worker-1, 5 admin, 6 shard-01,
# 7 part 4); then parts separated by NUL: key, nonce or instance, proof or tail,
# separator, certificate name.
AUTH_TOKEN_A = b"ps-fuzz-token-aaaaaaaaaaaaaaaa"  # kTokenA in auth_header_fuzz.cc
AUTH_FORMS = {"raw": 0, "challenge": 1, "proof": 2, "answer": 3, "stale": 4, "bearer": 5}
# Byte 1: bits 0-2 the key (0 worker-1, 1 shard-0, 2 worker-7, 3 TokenKey(kTokenA),
# 4 TokenKey(kTokenB), 5 worker-0, 6 an unknown token's, 7 part 0); bit 3 hex of part 1
# as it is (else cut or padded); bits 4-5 the proof (0 right, 1 XOR part 2, 2 part 2,
# 3 a challenge answer's); bit 6 the shard's own instance; bit 7 part 3 as the separator.
A_RAW_HEX, A_XOR, A_PART, A_OTHER, A_OWN, A_SEP = 0x08, 0x10, 0x20, 0x30, 0x40, 0x80


def auth(form, flags=0, shard=0, cn=0, parts=()):
    """auth_header input: the form, its choices, shard and certificate name, then parts."""
    return bytes([AUTH_FORMS[form], flags, shard | cn << 2]) + b"\0".join(parts)


def auth_raw(text):
    return auth("raw", parts=(text,))


_HEX32 = b"ab" * 32
_KEY_A = hashlib.sha256(AUTH_TOKEN_A).hexdigest().encode()
AUTH_HEADER = {
    # Texts as they come, to every parser and shard.
    "raw_challenge": auth_raw(b"PS-Challenge-v1 worker-1 " + _HEX32),
    "raw_challenge_token_key": auth_raw(b"PS-Challenge-v1 " + _KEY_A + b" " + b"01" * 32),
    "raw_challenge_blanks": auth_raw(b"  PS-Challenge-v1   worker-1  " + _HEX32 + b" "),
    "raw_challenge_tab": auth_raw(b"PS-Challenge-v1\tworker-1\t" + _HEX32),
    "raw_challenge_upper_hex": auth_raw(b"PS-Challenge-v1 worker-1 " + b"AB" * 32),
    "raw_challenge_leading_zero": auth_raw(b"PS-Challenge-v1 worker-01 " + _HEX32),
    "raw_challenge_extra": auth_raw(b"PS-Challenge-v1 admin " + _HEX32 + b" x"),
    "raw_proof_other_instance": auth_raw(b"PS-Proof-v1 worker-1 0123456789abcdef " + b"cd" * 32),
    "raw_proof_token_key": auth_raw(b"PS-Proof-v1 " + _KEY_A + b" 0123456789abcdef " + b"cd" * 32),
    "raw_proof_short": auth_raw(b"PS-Proof-v1 admin"),
    "raw_proof_nul": auth("raw", parts=(b"PS-Proof-v1 admin", b"0123456789abcdef " + b"cd" * 32)),
    "raw_answer": auth_raw(b"ps-auth-challenge-v1 shard-1 " + _HEX32 + b" " + b"cd" * 32),
    "raw_answer_extra": auth_raw(b"ps-auth-challenge-v1 shard-1 " + _HEX32 + b" " + b"cd" * 32 + b" more"),
    "raw_stale": auth_raw(b"ps-auth-stale-v1 0123456789abcdef: this proof was made for an earlier "
                          b"process of shard-1 (it restarted since): run the challenge again (refused "
                          b"from the call's metadata, its body unread)"),
    "raw_stale_no_colon": auth_raw(b"ps-auth-stale-v1 0123456789abcdef"),
    "raw_stale_short": auth_raw(b"ps-auth-stale-v1 0123456789abcde: x"),
    "raw_bearer_listed": auth_raw(b"Bearer " + AUTH_TOKEN_A),
    "raw_bearer_derived_form": auth_raw(b"Bearer worker-1." + b"00" * 32),
    "raw_bearer_alone": auth_raw(b"Bearer"),
    "raw_identity_max": auth_raw(b"worker-2147483647"),
    "raw_identity_over": auth_raw(b"worker-2147483648"),
    "raw_derived_form_token": auth_raw(b"shard-3." + b"0f" * 32),
}
# Challenges for every key choice, then malformed ones.
for _k, _name in enumerate(("worker_1", "shard_0", "worker_7", "listed_a", "listed_b", "worker_0",
                            "unknown", "part_admin")):
    AUTH_HEADER[f"challenge_{_name}"] = auth("challenge", _k, shard=_k % 3,
                                             parts=(b"admin", bytes(range(32))))
    # Call proofs: the right one, for the shard's own instance.
    AUTH_HEADER[f"proof_{_name}"] = auth("proof", _k | A_OWN, shard=_k % 3, parts=(b"admin",))
AUTH_HEADER.update({
    "challenge_short_nonce": auth("challenge", 0 | A_RAW_HEX, parts=(b"", b"\x01\x02")),
    "challenge_blank_runs": auth("challenge", 3 | A_SEP, parts=(b"", b"n" * 32, b"", b"   ")),
    "challenge_tab_separator": auth("challenge", 0 | A_SEP, parts=(b"", b"n" * 32, b"", b"\t")),
    "challenge_part_key_bad": auth("challenge", 7, parts=(b"worker-1x", b"n" * 32)),
    "proof_for_shard_1_token_file": auth("proof", 1 | A_OWN, shard=1),
    "proof_for_tls_shard": auth("proof", 3 | A_OWN, shard=2),
    "proof_xor": auth("proof", 0 | A_OWN | A_XOR, parts=(b"", b"", b"\x80")),
    "proof_part": auth("proof", 0 | A_OWN | A_PART, parts=(b"", b"", b"p" * 32)),
    "proof_answer_as_call_proof": auth("proof", 0 | A_OWN | A_OTHER, parts=(b"", b"", b"")),
    "proof_other_instance": auth("proof", 0, parts=(b"", b"\x01\x23\x45\x67\x89\xab\xcd\xef")),
    "proof_unknown_other_instance": auth("proof", 6, parts=(b"", b"\x01" * 8)),
    "proof_short_instance": auth("proof", 0 | A_RAW_HEX, parts=(b"", b"\x01" * 7)),
    "proof_blank_runs": auth("proof", 5 | A_OWN | A_SEP, parts=(b"", b"", b"", b"  ")),
    "proof_cert_same": auth("proof", 0 | A_OWN, shard=2, cn=4),
    "proof_cert_other": auth("proof", 0 | A_OWN, shard=2, cn=5),
    "proof_cert_malformed": auth("proof", 3 | A_OWN, shard=2, cn=6),
    "proof_cert_part": auth("proof", 3 | A_OWN, shard=2, cn=7,
                            parts=(b"", b"", b"", b"", b"admin")),
    "answer_shard_1": auth("answer", 0 | A_OWN),
    "answer_shard_0": auth("answer", 1, parts=(b"", b"s" * 32, b"c" * 32)),
    "answer_worker": auth("answer", 2 | A_OWN),
    "answer_admin_xor": auth("answer", 3 | A_XOR, parts=(b"", b"", b"", b"", b"\x01")),
    "answer_part_server": auth("answer", 4 | A_OWN, parts=(b"shard-2147483647",)),
    "answer_part_proof": auth("answer", 0 | A_PART, parts=(b"", b"s" * 32, b"q" * 31)),
    "answer_call_proof": auth("answer", 0 | A_OTHER | A_OWN),
    "answer_short_nonce": auth("answer", 0 | A_RAW_HEX, parts=(b"", b"s" * 31)),
    "stale_own": auth("stale", A_OWN, parts=(b"", b"", b"refused")),
    "stale_other": auth("stale", 0, parts=(b"", b"\xfe" * 8, b"x")),
    "stale_no_colon": auth("stale", A_PART, parts=(b"", b"\x10" * 8, b"")),
    "stale_tab": auth("stale", A_SEP, parts=(b"", b"\x10" * 8, b"", b"\t")),
})
# Bearer tokens on the TLS shard (taken) and the others (refused on a plaintext port).
for _k, _name in enumerate(("worker_1", "shard_0", "worker_7", "listed_a", "listed_b",
                            "other_secret", "part_identity", "part")):
    AUTH_HEADER[f"bearer_{_name}"] = auth("bearer", _k, shard=2, parts=(b"worker-5",))
AUTH_HEADER.update({
    "bearer_appended": auth("bearer", 0 | A_XOR, shard=2, parts=(b"", b"", b"x")),
    "bearer_cut": auth("bearer", 3 | A_PART, shard=2, parts=(b"", b"", b"x")),
    "bearer_xor": auth("bearer", 0 | A_OTHER, shard=2, parts=(b"", b"", b"\x00\x00\x00\x01")),
    "bearer_blank_runs": auth("bearer", 3 | A_SEP, shard=2, parts=(b"", b"", b"", b"  ")),
    "bearer_cert_same": auth("bearer", 0, shard=2, cn=4),
    "bearer_cert_other": auth("bearer", 3, shard=2, cn=4),
})

# data_frame (net/data_frame.h), written here independently of the C++ encoder: the
# valid seeds parsing and re-encoding to themselves checks that both agree on the format.
DF_TYPES = {"HELLO": 0x01, "CHALLENGE": 0x02, "PROOF": 0x03, "ADMIT": 0x04, "PUSH": 0x10,
            "ANSWER": 0x11, "PUSHES": 0x12, "PULL": 0x20, "SLICE": 0x21, "PULL_END": 0x22, "CANCEL": 0x23,
            "SLICES": 0x24, "GOAWAY": 0x30}
# Byte 0 of an input: the ConnectionState (bits 0-2) and the most slices a pull may name
# (bits 3-7).
DF_SHARD_AWAITS_HELLO, DF_SHARD_ADMITTED = 0, 2
DF_WORKER_AWAITS_CHALLENGE, DF_WORKER_ADMITTED = 3, 5


def df_frame(type_, meta=b"", body=b"", flags=0, tag=0, meta_len=None, body_len=None):
    """A frame: type, flags, M (u16), B (u32), tag (u64), meta, body."""
    return struct.pack("<BBHIQ", DF_TYPES.get(type_, type_) if isinstance(type_, str) else type_,
                       flags, len(meta) if meta_len is None else meta_len,
                       len(body) if body_len is None else body_len, tag) + meta + body


def df_hello(session=0x0123456789ABCDEF, worker=2, nonce=bytes(range(32)), magic=b"PSD1",
             version=3, extra=b""):
    """extra: what a HELLO of a later version might add."""
    return df_frame("HELLO", magic + struct.pack("<IQI", version, session, worker) + nonce + extra)


def df_status(type_, tag, code, name=b"", message=b""):
    meta = bytes([code, len(name)]) + name + struct.pack("<H", len(message)) + message
    return df_frame(type_, meta, tag=tag)


def df_push(tag, codec=b"fp32", payload=fp32([1.0, -2.0]), loss=None, slice_=7, round_=3,
            layout=0x1122334455667788):
    meta = struct.pack("<QQI", layout, round_, slice_)
    if loss is not None:
        meta += struct.pack("<f", loss)
    meta += bytes([len(codec)]) + codec
    return df_frame("PUSH", meta, payload, flags=0 if loss is None else 1, tag=tag)


def df_pushes(pushes, round_=3, codec=b"fp32", layout=0x1122334455667788, loss=None,
              count=None, body_len=None):
    """pushes: (tag, slice, payload) each; loss: one per push, or None."""
    meta = struct.pack("<QQ", layout, round_) + bytes([len(codec)]) + codec
    meta += bytes([len(pushes) if count is None else count])
    for i, (tag, slice_, payload) in enumerate(pushes):
        meta += struct.pack("<QII", tag, slice_, len(payload))
        if loss is not None:
            meta += struct.pack("<f", loss[i])
    body = b"".join(p for _, _, p in pushes)
    return df_frame("PUSHES", meta, body, flags=0 if loss is None else 1, tag=pushes[0][0],
                    body_len=body_len)


def df_pull(tag, ids, held=None, layout=0x1122334455667788, min_version=4, epoch=0,
            count=None, body_len=None):
    meta = struct.pack("<QQQI", layout, min_version, epoch, len(ids) if count is None else count)
    body = struct.pack(f"<{len(ids)}I", *ids)
    if held is not None:
        body += struct.pack(f"<{len(held)}Q", *held)
    return df_frame("PULL", meta, body, flags=0 if held is None else 1, tag=tag,
                    body_len=body_len)


def df_slice(tag, slice_=7, version=5, base=0, epoch=0, codec=b"", values=fp32([0.5] * 4)[1:],
             loss=None, first_loss=None, queued=False):
    meta = struct.pack("<IQQQ", slice_, version, base, epoch)
    flags = 4 if queued else 0
    if loss is not None:
        meta, flags = meta + struct.pack("<f", loss), flags | 1
    if first_loss is not None:
        meta, flags = meta + struct.pack("<f", first_loss), flags | 2
    return df_frame("SLICE", meta + bytes([len(codec)]) + codec, values, flags=flags, tag=tag)


def df_slices(tag, slices, codec=b"", count=None, body_len=None):
    """slices: (slice, version, base, epoch, values, loss, first_loss, queued) each, or
    (slice, values) for a dense slice at version 5 of epoch 0 with no flag; a slice's
    flags byte is its own (loss 1, first loss 2, queued 4; an int in place of queued
    sets the byte as given)."""
    meta = bytes([len(codec)]) + codec + bytes([len(slices) if count is None else count])
    body = b""
    for s in slices:
        if len(s) == 2:
            s = (s[0], 5, 0, 0, s[1], None, None, False)
        slice_, version, base, epoch, values, loss, first_loss, queued = s
        flags = queued if isinstance(queued, int) and not isinstance(queued, bool) else (
            4 if queued else 0)
        flags |= (1 if loss is not None else 0) | (2 if first_loss is not None else 0)
        meta += struct.pack("<IQQQB", slice_, version, base, epoch, flags)
        if loss is not None:
            meta += struct.pack("<f", loss)
        if first_loss is not None:
            meta += struct.pack("<f", first_loss)
        meta += struct.pack("<I", len(values))
        body += values
    return df_frame("SLICES", meta, body, tag=tag, body_len=body_len)


def data_frame(state, max_pull_slices, *frames):
    return bytes([state | max_pull_slices << 3]) + b"".join(frames)


_DF_PUSH_META = struct.pack("<QQI", 0x1122334455667788, 3, 7) + b"\x04fp32"
_DF_PROOF = df_frame("PROOF", bytes(range(100, 132)))
_DF_CHALLENGE = df_frame("CHALLENGE", struct.pack("<I", 1) + bytes(range(32, 64)) +
                         bytes(range(64, 96)))
_DF_ADMIT = df_frame("ADMIT", struct.pack("<IIII", 1 << 20, 1024, 16, 300000))
DATA_FRAME = {
    "valid_shard_session": data_frame(
        DF_SHARD_AWAITS_HELLO, 16, df_hello(), _DF_PROOF,
        df_push(1, loss=0.75), df_push(2, codec=b"topk(0.01)+fp16", payload=bytes(range(40))),
        df_pull(3, [7, 9, 11], held=[0, 4, 2**64 - 1], epoch=0xABCDEF),
        df_pull(4, [1, 2]), df_frame("CANCEL", tag=3),
        df_status("GOAWAY", 0, 14, b"shutting_down", b"the shard drains")),
    "valid_worker_session": data_frame(
        DF_WORKER_AWAITS_CHALLENGE, 0, _DF_CHALLENGE, _DF_ADMIT,
        df_status("ANSWER", 1, 0), df_status("ANSWER", 2, 11, b"late", b"round 3 closed"),
        df_slice(3, queued=True), df_slice(3, 9, 6, 5, 0xABCDEF, b"int8", bytes(range(12)),
                                           loss=0.5, first_loss=2.0),
        df_status("PULL_END", 3, 0), df_status("PULL_END", 4, 5, b"a_newer_kind",
                                               b"caf\xc3\xa9 \xe2\x82\xac")),
    "valid_longest_strings": data_frame(
        DF_SHARD_ADMITTED, 31, df_push(9, codec=b"c" * 255, payload=b""),
        df_pull(10, list(range(31)), held=list(range(31)))),
    "valid_longest_status": data_frame(
        DF_WORKER_ADMITTED, 0, df_status("ANSWER", 1, 16, b"n" * 64, b"m" * 512)),
    "valid_goaway_before_challenge": data_frame(
        DF_WORKER_AWAITS_CHALLENGE, 0, df_status("GOAWAY", 0, 16, b"unknown_session", b"x")),
    "push_before_admit": data_frame(DF_SHARD_AWAITS_HELLO, 16, df_push(1)),
    "hello_twice": data_frame(DF_SHARD_AWAITS_HELLO, 16, df_hello(), df_hello()),
    "hello_version_4": data_frame(DF_SHARD_AWAITS_HELLO, 16, df_hello(version=4, extra=b"more")),
    "hello_version_2": data_frame(DF_SHARD_AWAITS_HELLO, 16, df_hello(version=2)),
    "hello_version_1": data_frame(DF_SHARD_AWAITS_HELLO, 16, df_hello(version=1)),
    "valid_slices": data_frame(
        DF_WORKER_ADMITTED, 0,
        df_slices(3, [(7, bytes(range(16))), (8, 6, 5, 0xABCDEF, bytes(8), 0.5, 2.0, True)]),
        df_slices(4, [(1, 9, 8, 2, b"ab", None, 1.5, False), (2, 9, 7, 2, b"", 0.25, None, True),
                      (3, 9, 8, 2, b"xyz", None, None, False)], codec=b"topk(0.01)+fp16")),
    "valid_slices_most": data_frame(
        DF_WORKER_ADMITTED, 0,
        df_slices(5, [(i, 1, 0, 1, b"v" * i, 0.5, 0.25, True) for i in range(8)],
                  codec=b"c" * 255)),
    "slices_count_1": data_frame(DF_WORKER_ADMITTED, 0, df_slices(3, [(7, bytes(16))])),
    "slices_count_9": data_frame(DF_WORKER_ADMITTED, 0,
                                 df_slices(3, [(i, bytes(4)) for i in range(9)])),
    "slices_lengths_disagree": data_frame(
        DF_WORKER_ADMITTED, 0, df_slices(3, [(7, bytes(8)), (8, bytes(4))], body_len=16)),
    "slices_unknown_slice_flag": data_frame(
        DF_WORKER_ADMITTED, 0,
        df_slices(3, [(7, 5, 0, 0, bytes(8), None, None, 8), (8, bytes(4))])),
    "slices_to_the_shard": data_frame(DF_SHARD_ADMITTED, 16,
                                      df_slices(3, [(7, bytes(8)), (8, bytes(4))])),
    "valid_pushes": data_frame(DF_SHARD_ADMITTED, 16,
                               df_pushes([(5, 7, b"\x01abcd"), (6, 8, b"\x01ef")]),
                               df_pushes([(7, 1, b""), (8, 2, b"x"), (9, 3, b"yz")],
                                         loss=[0.5, 1.5, 2.5])),
    "pushes_count_1": data_frame(DF_SHARD_ADMITTED, 16, df_pushes([(5, 7, b"\x01abcd")])),
    "pushes_count_17": data_frame(DF_SHARD_ADMITTED, 16,
                                  df_pushes([(i + 1, i, b"") for i in range(17)])),
    "pushes_lengths_disagree": data_frame(DF_SHARD_ADMITTED, 16,
                                          df_pushes([(5, 7, b"ab"), (6, 8, b"c")], body_len=4)),
    "pushes_tag_0": data_frame(DF_SHARD_ADMITTED, 16, df_pushes([(5, 7, b"ab"), (0, 8, b"c")])),
    "hello_bad_magic": data_frame(DF_SHARD_AWAITS_HELLO, 16, df_hello(magic=b"PSU1")),
    "unknown_type": data_frame(DF_SHARD_ADMITTED, 16, df_frame(0x13, tag=1)),
    "unknown_flag": data_frame(DF_SHARD_ADMITTED, 16, df_frame("CANCEL", flags=0x80, tag=1)),
    "meta_over_bound": data_frame(DF_SHARD_ADMITTED, 16,
                                  df_frame("PUSH", b"\0" * 20 + b"\xff" + b"c" * 256, tag=1)),
    "largest_body_claim": data_frame(DF_SHARD_ADMITTED, 16,
                                     df_frame("PUSH", _DF_PUSH_META, body_len=0xFFFFFFFF, tag=1)),
    "pull_body_mismatch": data_frame(DF_SHARD_ADMITTED, 16, df_pull(1, [1, 2], body_len=12)),
    "pull_over_max": data_frame(DF_SHARD_ADMITTED, 2, df_pull(1, [1, 2, 3])),
    "pull_held_of_none": data_frame(DF_SHARD_ADMITTED, 16, df_pull(1, [], held=[])),
    "tag_0_push": data_frame(DF_SHARD_ADMITTED, 16, df_push(0)),
    "tag_on_goaway": data_frame(DF_WORKER_ADMITTED, 0, df_frame("GOAWAY", b"\0\0\0\0", tag=5)),
    "name_bad_char": data_frame(DF_WORKER_ADMITTED, 0, df_status("ANSWER", 1, 11, b"Late")),
    "message_not_utf8": data_frame(DF_WORKER_ADMITTED, 0,
                                   df_status("PULL_END", 1, 13, b"", b"caf\xc3")),
    "status_code_17": data_frame(DF_WORKER_ADMITTED, 0, df_status("ANSWER", 1, 17)),
    "trailing_meta_byte": data_frame(DF_SHARD_ADMITTED, 16,
                                     df_frame("PUSH", _DF_PUSH_META + b"\0", tag=1)),
    "cut_in_header": data_frame(DF_SHARD_ADMITTED, 16, df_push(1)[:10]),
}

# data_connection: byte 0 the harness's choices (data_connection_fuzz.cc), then what the
# worker sends. The shard's layout: tensor "w" of 8 values in slices 0 and 1 of 4.
DC_HANDSHAKE, DC_WORKER_1, DC_OTHER_PUSHES, DC_PATCH_HELLO, DC_REJOIN = 1, 2, 4, 8, 16
DC_LAYOUT = layout_hash((("w", 8, 0),), 4, 1)  # kLayoutHash in data_connection_fuzz.cc


def dc_push(tag, slice_=0, round_=0, values=(1.0, 1.0, 1.0, 1.0), **kw):
    return df_push(tag, payload=fp32(values), slice_=slice_, round_=round_, layout=DC_LAYOUT,
                   **kw)


def dc_pushes(pushes, round_=0, **kw):
    return df_pushes(pushes, round_=round_, layout=DC_LAYOUT, **kw)


def dc_pull(tag, ids=(0, 1), min_version=0, **kw):
    return df_pull(tag, list(ids), layout=DC_LAYOUT, min_version=min_version, **kw)


def dc(mode, *frames):
    return bytes([mode]) + b"".join(frames)


DC_A = DC_HANDSHAKE  # admitted by the harness's handshake, as worker 0
DATA_CONNECTION = {
    "admitted_push": dc(DC_A, dc_push(1)),
    "admitted_push_with_loss": dc(DC_A, dc_push(1, loss=0.5)),
    "admitted_pushes": dc(DC_A | DC_OTHER_PUSHES, dc_pull(1, min_version=1),
                          dc_pushes([(2, 0, fp32((1.0,) * 4)), (3, 1, fp32((2.0,) * 4))])),
    "admitted_pushes_refused_and_coded": dc(
        DC_A, dc_pushes([(1, 0, fp32((1.0,) * 4)), (2, 0, fp32((1.0,) * 4)),
                         (3, 9, fp32((1.0,) * 4)), (4, 1, fp32((1.0, 2.0))),
                         (5, 1, fp32((float("nan"),) * 4))], loss=[0.5] * 5)),
    "admitted_pushes_lengths_disagree": dc(
        DC_A, dc_pushes([(1, 0, fp32((1.0,) * 4)), (2, 1, fp32((1.0,) * 4))], body_len=40)),
    "admitted_push_duplicate": dc(DC_A, dc_push(1), dc_push(2)),
    "admitted_pushes_close_rounds_and_pull": dc(
        DC_A | DC_OTHER_PUSHES, dc_pull(1, min_version=1), dc_push(2, 0), dc_push(3, 1)),
    "admitted_worker_1_pushes_and_pull": dc(
        DC_A | DC_WORKER_1 | DC_OTHER_PUSHES, dc_push(1, 1), dc_pull(2, (1,), min_version=1)),
    "admitted_pull_version_0": dc(DC_A, dc_pull(1)),
    "admitted_pull_held": dc(DC_A, dc_pull(1, held=[0, 0], epoch=1)),
    "admitted_pull_cancel": dc(DC_A, dc_pull(1, min_version=5), df_frame("CANCEL", tag=1),
                               df_frame("CANCEL", tag=9)),
    "admitted_third_pull_over_limit": dc(DC_A, dc_pull(1, min_version=5),
                                         dc_pull(2, min_version=5), dc_pull(3, min_version=5)),
    "admitted_pull_tag_reused": dc(DC_A, dc_pull(1, min_version=5), dc_pull(1, min_version=5)),
    "admitted_pull_unknown_slice": dc(DC_A, dc_pull(1, (7,))),
    "admitted_pull_over_max": dc(DC_A, dc_pull(1, (0, 1, 0))),
    "admitted_push_wrong_layout": dc(DC_A, df_push(1)),
    "admitted_push_unknown_codec": dc(DC_A, df_push(
        1, codec=b"nope", payload=b"\x01", slice_=0, round_=0, layout=DC_LAYOUT)),
    "admitted_push_future_round": dc(DC_A, dc_push(1, round_=7)),
    "admitted_push_nan": dc(DC_A, dc_push(1, values=(float("nan"), 0.0, 0.0, 0.0))),
    "admitted_goaway": dc(DC_A, dc_push(1), df_status("GOAWAY", 0, 0, b"", b"bye")),
    "admitted_rejoined": dc(DC_A | DC_REJOIN, dc_push(1), dc_pull(2)),
    "admitted_hello_again": dc(DC_A, df_hello()),
    "admitted_truncated_push": dc(DC_A, dc_push(1)[:-5]),
    "admitted_truncated_header": dc(DC_A, dc_push(1)[:10]),
    "admitted_largest_body_claim": dc(
        DC_A, df_frame("PUSH", struct.pack("<QQI", DC_LAYOUT, 0, 0) + b"\x04fp32",
                       body_len=0xFFFFFFFF, tag=1)),
    "admitted_pull_body_mismatch": dc(DC_A, dc_pull(1, body_len=12)),
    "raw_hello_unknown_session": dc(0, df_hello()),
    "raw_hello_patched_wrong_proof": dc(DC_PATCH_HELLO, df_hello(worker=0), _DF_PROOF,
                                        dc_push(1)),
    "raw_hello_patched_worker_1": dc(DC_PATCH_HELLO | DC_WORKER_1, df_hello(worker=1),
                                     _DF_PROOF),
    "raw_hello_patched_then_push": dc(DC_PATCH_HELLO, df_hello(worker=0), dc_push(1)),
    "raw_hello_version_4": dc(DC_PATCH_HELLO, df_hello(version=4, extra=b"more")),
    "raw_hello_version_2": dc(DC_PATCH_HELLO, df_hello(version=2)),
    "raw_hello_version_1": dc(DC_PATCH_HELLO, df_hello(version=1)),
    "raw_push_before_admit": dc(0, dc_push(1)),
    "raw_largest_body_claim": dc(0, df_frame("HELLO", meta_len=52, body_len=0xFFFFFFFF)),
    "raw_truncated_hello": dc(DC_PATCH_HELLO, df_hello()[:40]),
    "raw_nothing": dc(0),
    # The first find (docs/fuzzing.md): a refused header, then bytes the shard never
    # parses; the connection lingered for the GOAWAY's whole second.
    "regression_goaway_then_bytes": dc(DC_A, b"A" * 16 + b"B" * 100),
}

# data_channel: byte 0 the harness's choices (data_channel_fuzz.cc), then what the shard
# sends. The channel pushes tags 1 and 2 and pulls tag 3 (slices 5: 16 bytes, 6: 8).
DCH_RAW, DCH_AFTER_CHALLENGE, DCH_ADMITTED = 0, 1, 2
DCH_DENSE, DCH_SHORT_DEADLINES, DCH_CANCEL, DCH_LINGER = 4, 8, 16, 32


def dch(mode, *frames):
    return bytes([mode]) + b"".join(frames)


def dch_slice(tag=3, slice_=5, values=None, **kw):
    if values is None:
        values = bytes(range(16 if slice_ == 5 else 8))
    return df_slice(tag, slice_=slice_, values=values, **kw)


DCH_ALL_ANSWERED = (df_status("ANSWER", 1, 0), df_status("ANSWER", 2, 6, b"duplicate", b"again"),
                    dch_slice(), dch_slice(slice_=6), df_status("PULL_END", 3, 0))
DATA_CHANNEL = {
    "admitted_all_answered_dense": dch(DCH_ADMITTED | DCH_DENSE, *DCH_ALL_ANSWERED),
    "admitted_all_answered_no_place": dch(DCH_ADMITTED, *DCH_ALL_ANSWERED),
    "admitted_slice_wrong_size": dch(DCH_ADMITTED | DCH_DENSE, dch_slice(values=bytes(12))),
    "admitted_slice_unknown_id": dch(DCH_ADMITTED | DCH_DENSE, dch_slice(slice_=9)),
    "admitted_slice_unknown_tag": dch(DCH_ADMITTED | DCH_DENSE, dch_slice(tag=8),
                                      dch_slice(), df_status("PULL_END", 3, 0)),
    "admitted_slice_change": dch(DCH_ADMITTED, dch_slice(codec=b"int8", base=4, epoch=2,
                                                         values=bytes(range(16)))),
    "admitted_slice_after_pull_end": dch(DCH_ADMITTED | DCH_DENSE, df_status("PULL_END", 3, 0),
                                         dch_slice()),
    "admitted_slice_cut_in_body": dch(DCH_ADMITTED | DCH_DENSE, dch_slice()[:-4]),
    "admitted_slice_largest_claim": dch(DCH_ADMITTED | DCH_DENSE, df_frame(
        "SLICE", struct.pack("<IQQQ", 5, 5, 0, 0) + b"\x00", body_len=0xFFFFFFFF, tag=3)),
    "admitted_slices_dense": dch(
        DCH_ADMITTED | DCH_DENSE, df_status("ANSWER", 1, 0), df_status("ANSWER", 2, 0),
        df_slices(3, [(5, bytes(range(16))), (6, bytes(range(8)))]), df_status("PULL_END", 3, 0)),
    "admitted_slices_no_place": dch(
        DCH_ADMITTED, df_slices(3, [(5, bytes(range(16))), (6, bytes(range(8)))]),
        df_status("PULL_END", 3, 0)),
    "admitted_slices_second_wrong_size": dch(
        DCH_ADMITTED | DCH_DENSE, df_slices(3, [(5, bytes(range(16))), (6, bytes(12))]),
        df_status("PULL_END", 3, 0)),
    "admitted_slices_first_unknown": dch(
        DCH_ADMITTED | DCH_DENSE, df_slices(3, [(9, bytes(16)), (6, bytes(range(8)))])),
    "admitted_slices_first_twice": dch(
        DCH_ADMITTED | DCH_DENSE, df_slices(3, [(5, bytes(16)), (5, bytes(range(16))),
                                                (6, bytes(8))]), df_status("PULL_END", 3, 0)),
    "admitted_slices_unknown_tag": dch(
        DCH_ADMITTED | DCH_DENSE, df_slices(8, [(5, bytes(16)), (6, bytes(8))]),
        dch_slice(), df_status("PULL_END", 3, 0)),
    "admitted_slices_change": dch(DCH_ADMITTED, df_slices(
        3, [(5, 6, 4, 2, bytes(range(16)), None, None, False), (6, 6, 4, 2, bytes(3), 0.5, None,
                                                                 True)], codec=b"int8")),
    "admitted_slices_cut_in_second_body": dch(
        DCH_ADMITTED | DCH_DENSE, df_slices(3, [(5, bytes(range(16))), (6, bytes(8))])[:-4]),
    "admitted_slices_deadline_mid_body": dch(
        DCH_ADMITTED | DCH_DENSE | DCH_SHORT_DEADLINES | DCH_LINGER,
        df_slices(3, [(5, bytes(range(16))), (6, bytes(8))])[:-4]),
    "admitted_slices_lengths_disagree": dch(
        DCH_ADMITTED | DCH_DENSE, df_slices(3, [(5, bytes(16)), (6, bytes(8))], body_len=30)),
    "admitted_answer_twice": dch(DCH_ADMITTED, df_status("ANSWER", 1, 0), df_status("ANSWER", 1, 0),
                                 df_status("ANSWER", 7, 0)),
    "admitted_answer_unknown_kind": dch(DCH_ADMITTED, df_status("ANSWER", 1, 5, b"a_newer_kind",
                                                                b"caf\xc3\xa9")),
    "admitted_pull_end_refused": dch(DCH_ADMITTED, df_status("PULL_END", 3, 8, b"over_limit",
                                                             b"too many pulls")),
    "admitted_goaway": dch(DCH_ADMITTED | DCH_DENSE, dch_slice(),
                           df_status("GOAWAY", 0, 14, b"shutting_down", b"drained")),
    "admitted_goaway_ok": dch(DCH_ADMITTED, df_status("GOAWAY", 0, 0)),
    "admitted_push_frame": dch(DCH_ADMITTED, dc_push(1)),
    "admitted_second_admit": dch(DCH_ADMITTED, _DF_ADMIT),
    "admitted_short_deadlines": dch(DCH_ADMITTED | DCH_DENSE | DCH_SHORT_DEADLINES, dch_slice()),
    "admitted_deadline_mid_body": dch(DCH_ADMITTED | DCH_DENSE | DCH_SHORT_DEADLINES | DCH_LINGER,
                                      dch_slice()[:-4]),
    "admitted_cancel": dch(DCH_ADMITTED | DCH_CANCEL, df_status("ANSWER", 2, 0)),
    "challenged_admit_then_all": dch(DCH_AFTER_CHALLENGE | DCH_DENSE, _DF_ADMIT,
                                     *DCH_ALL_ANSWERED),
    "challenged_admit_body_0": dch(DCH_AFTER_CHALLENGE | DCH_DENSE, df_frame(
        "ADMIT", struct.pack("<IIII", 0, 1024, 16, 300000)), dch_slice()),
    "challenged_answer_before_admit": dch(DCH_AFTER_CHALLENGE, df_status("ANSWER", 1, 0)),
    "challenged_goaway": dch(DCH_AFTER_CHALLENGE, df_status("GOAWAY", 0, 16, b"unauthenticated",
                                                            b"wrong proof")),
    "raw_forged_challenge": dch(DCH_RAW, _DF_CHALLENGE, _DF_ADMIT, *DCH_ALL_ANSWERED),
    "raw_goaway": dch(DCH_RAW, df_status("GOAWAY", 0, 16, b"unknown_session", b"join again")),
    "raw_goaway_ok": dch(DCH_RAW, df_status("GOAWAY", 0, 0)),
    "raw_admit_unasked": dch(DCH_RAW | DCH_DENSE, _DF_ADMIT, *DCH_ALL_ANSWERED),
    "raw_nothing": dch(DCH_RAW),
    # The first finds (docs/fuzzing.md): a GOAWAY of code 0 (raw_goaway_ok above), and
    # an ADMIT of 4 GiB then a SLICE claiming nearly as much for a tag with no pull.
    "regression_largest_admit_and_slice": dch(DCH_AFTER_CHALLENGE, df_frame(
        "ADMIT", struct.pack("<IIII", 0xFFFFFFFF, 1024, 16, 300000)), df_frame(
        "SLICE", struct.pack("<IQQQ", 5, 5, 0, 0) + b"\x00", body_len=0xFFFFFFF0, tag=9)),
}

# server_request: byte 0 the request kind (server_request_fuzz.cc; 4: adoption, | 1 a
# slice value, | 2 the registered layout hash), byte 1 the worker, then the message. The
# harness's shard has 3 workers, f = 1 (quorum 2) and slices of 16, 16, 8 and 3 values.
def adopt_vote(worker, round_=0, root=0, fix=True):
    return bytes([4 | (2 if fix else 0), worker]) + pb_uint(3, round_) + pb_uint(4, root)


def adopt_slice(worker, slice_=0, values=(0.25,) * 16, round_=0, fix=True):
    return (bytes([5 | (2 if fix else 0), worker]) + pb_uint(3, round_) + pb_uint(4, slice_) +
            pb_bytes(5, fp32(values)[1:]))


SERVER_REQUEST = {
    "adopt_vote_0": adopt_vote(0),
    "adopt_vote_1": adopt_vote(1),
    "adopt_vote_byzantine_self": adopt_vote(2, root=2),
    "adopt_vote_root_out_of_range": adopt_vote(0, root=3),
    "adopt_vote_future": adopt_vote(0, round_=1 << 40),
    "adopt_vote_other_layout": adopt_vote(1, fix=False),
    "adopt_slice_root": adopt_slice(0),
    "adopt_slice_not_root": adopt_slice(1, slice_=1),
    "adopt_slice_nan": adopt_slice(0, slice_=1, values=(float("nan"),) * 16),
    "adopt_slice_short": adopt_slice(0, slice_=2, values=(1.0,) * 7),
    "adopt_slice_unknown": adopt_slice(0, slice_=99, values=(1.0,)),
}

CORPORA = {"peer_share": PEER_SHARE, "server_request": SERVER_REQUEST, "aggregator_spec": AGGREGATOR_SPEC,
           "udp_datagram": UDP_DATAGRAM, "checkpoint": CHECKPOINT, "wire": WIRE,
           "held_model": HELD_MODEL, "auth_header": AUTH_HEADER, "data_frame": DATA_FRAME,
           "data_connection": DATA_CONNECTION, "data_channel": DATA_CHANNEL}


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
