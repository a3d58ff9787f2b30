#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/); the layouts are the ones the targets
read (fuzz_bootstrap_root.cc, fuzz_codec.cc, fuzz_wire.cc). Deterministic: running it again rewrites the same files."""
import os
import random
import re
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "..", "..", "src", "core", "bootstrap.h")) as f:
    VERSION = int(re.search(r"kBootstrapVersion = (\d+);", f.read()).group(1))
MAGIC = 0x53424343
rng = random.Random(8)


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def record(flags, payload):
    return struct.pack("<BH", flags, len(payload)) + payload


def hello_tail(rank, nranks, info):  # what follows magic, version and secret (written by the target, flags bit 0)
    return struct.pack("<iiII", rank, nranks, len(info), 0) + info


def rnd(n):
    return bytes(rng.randrange(256) for _ in range(n))


# bootstrap root
t = "fuzz_bootstrap_root"
write(t, "one_rank_two_rounds", record(1, hello_tail(0, 1, b"addr0") + struct.pack("<II", MAGIC, 3) + b"xyz"
                                       + struct.pack("<II", MAGIC, 0)))
write(t, "two_ranks", record(1, hello_tail(1, 2, b"r1")) + record(1, hello_tail(0, 2, b"rank zero")))
write(t, "duplicate_rank", record(1, hello_tail(0, 2, b"a")) + record(1, hello_tail(0, 2, b"b")))
write(t, "nranks_mismatch", record(1, hello_tail(0, 2, b"a")) + record(1, hello_tail(1, 3, b"b")))
write(t, "bad_round", record(1, hello_tail(0, 1, b"a") + struct.pack("<II", 0x12345678, 5) + b"hello"))
write(t, "huge_lengths", record(1, hello_tail(0, 1, b"") + struct.pack("<II", MAGIC, 0xffffffff))
      + record(1, struct.pack("<iiII", 0, 65536, 0xffffffff, 0)))
write(t, "wrong_secret", record(0, struct.pack("<II", MAGIC, VERSION) + bytes(16) + hello_tail(0, 1, b"x")))
write(t, "other_version", record(0, struct.pack("<II", MAGIC, VERSION + 7) + bytes(16) + hello_tail(0, 1, b"x")))
LEAVE = 0x4c424343  # a rank that gives up between rounds, with its reason (BootstrapSession::Leave)
write(t, "leave_with_reason", record(1, hello_tail(0, 2, b"r0") + struct.pack("<II", MAGIC, 2) + b"r0")
      + record(1, hello_tail(1, 2, b"r1") + struct.pack("<II", LEAVE, 24) + b"rank 1: gave up\n\x00\xff\x7fabcde"))
write(t, "leave_too_long", record(1, hello_tail(0, 2, b"r0") + struct.pack("<II", MAGIC, 0))
      + record(1, hello_tail(1, 2, b"r1") + struct.pack("<II", LEAVE, 241) + b"x" * 241))
write(t, "garbage_and_half_open", record(0, rnd(50)) + record(1, b"\x00\x00") + record(0, b"GET / HTTP/1.0\r\n\r\n")
      + record(1, hello_tail(0, 1, b"ok")))


# codecs: cast16
def floats(*vals):
    return b"".join(struct.pack("<f", v) for v in vals)


special = floats(float("nan"), float("inf"), -3.4e38, 1e-42, 0.0, -0.0, 1.5, -7.25)
for name, (wire, nranks, rank, nin, length, off, avg) in {
        "bf16_two_inputs": (0, 2, 1, 2, 100, 37, 0), "fp16_one_input": (1, 5, 3, 1, 33, 0, 1),
        "f32_leaf": (2, 1, 0, 0, 7, 4095, 0)}.items():
    head = struct.pack("<BBBBHHBB", wire, nranks, rank, nin, length, off, avg, 8) + special
    elt = 4 if wire == 2 else 2
    write("fuzz_codec_cast16", name, head + rnd(3 * length * elt))


# codecs: quant. bits-1 is read modulo 8; flags: rotation bit 0, block bits 1-3, gather bit 4, clip bit 5, scale 6-7.
def quant_seed(bits, flags, group_sel, rounding, nranks, rank, nin, length, off, avg, scales=b"", wire=600):
    head = struct.pack("<BBBBBHHBBHHBB", bits - 1, flags, group_sel, rounding, 7, nranks - 2, rank, 3, nin, length - 1,
                       off, avg, 8) + special
    return head + scales + rnd(wire)


for name, args in {"b4_rht_bf16": (4, 0b01000011, 4, 1, 4, 1, 1, 200, 0, 0),
                   "b1_norot_fp32_two_inputs": (1, 0b00000000, 1, 0, 3, 2, 2, 64, 5, 1),
                   "b8_clip_fp16_correlated": (8, 0b10100101, 6, 2, 8, 7, 1, 300, 1000, 0),
                   "b3_group7_tail": (3, 0b00000001, 3, 1, 2, 0, 0, 13, 3, 1)}.items():
    write("fuzz_codec_quant_requant", name, quant_seed(*args))
for name, args in {"b4_exact_gather": (4, 0b00000011, 0, 1, 4, 1, 1, 200, 0, 0),
                   "b8_requant_gather_257_ranks": (8, 0b00010001, 4, 0, 257, 256, 2, 64, 64, 1),
                   "b8_256_ranks_16bit_lanes": (8, 0b00000001, 4, 1, 256, 255, 2, 100, 7, 0),
                   "b2_1024_ranks": (2, 0b00000000, 5, 2, 1024, 5, 1, 50, 10, 0),
                   "b6_bad_scales": (6, 0b01010001, 4, 1, 16, 3, 2, 128, 0, 1)}.items():
    scales = struct.pack("<B", 3) + struct.pack("<H", 0) + floats(float("nan")) + struct.pack("<H", 1) \
        + floats(-2.0) + struct.pack("<H", 2) + floats(3e38)
    write("fuzz_codec_quant_homomorphic", name, quant_seed(*args, scales=scales))


# wire: mode, checksum, kind, flip position, [24 header bytes in raw mode], payload.
def wire_header(kind, length, flags=0, crc=0, magic=0x77636363, version=1):
    return struct.pack("<IBBHIIQ", magic, version, flags, kind, crc, 0, length)


for name, data in {"flip_payload_crc": struct.pack("<BBHI", 1, 1, 1, 24 * 8 + 5) + rnd(100),
                   "flip_header_kind": struct.pack("<BBHI", 1, 1, 0x114, 6 * 8 + 1) + rnd(40),
                   "flip_crc_without_checksum": struct.pack("<BBHI", 1, 0, 2, 8 * 8 + 3) + rnd(33),
                   "raw_good_header": struct.pack("<BBHI", 0, 0, 1, 0) + wire_header(1, 16) + rnd(16),
                   "raw_length_lies": struct.pack("<BBHI", 0, 1, 1, 0) + wire_header(1, 1 << 40, 1, 7) + rnd(8),
                   "raw_bad_magic": struct.pack("<BBHI", 0, 0, 1, 0) + wire_header(1, 4, magic=1) + rnd(4)}.items():
    write("fuzz_wire", name, data)
