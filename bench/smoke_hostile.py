#!/usr/bin/env python3
"""ctest bench_hostile_smoke: `ps-bench hostile --quick` against the real ps-server runs
every attack, and its JSON rows say that honest training kept going in every phase
(rounds per second > 0 with and without the attack), that the server's peak resident
memory stayed within the --max-shard-bytes bound, that every impersonation attempt was
refused as unauthenticated or not permitted, that worker 3's pull slots were free
again after pull_leak, and that the attacks on the TCP data port (data_*, with the honest
workers on that port) got only refusals: GOAWAY unauthenticated for unknown sessions and
forged proofs, for a header claiming 4 GiB GOAWAY invalid argument (malformed: a PUSH
before the handshake) or resource exhausted (over_limit: after it). Speed (the ratios) is
not asserted here.

    smoke_hostile.py PS_BENCH PS_SERVER WORK_DIR
"""
import json
import math
import os
import subprocess
import sys

ATTACKS = ["layout_wrap", "layout_huge", "layout_tensors", "big_messages", "anon_messages",
           "codec_poison", "pull_leak", "impersonation", "log_flood", "junk_requests",
           "udp_quorum", "pull_slices", "conn_flood", "data_silent_flood", "data_stalled_header",
           "data_unknown_hello", "data_huge_header", "data_forged_proof"]
# The data-port attacks that expect an answer, and the GOAWAY codes they must get.
DATA_REFUSALS = {"data_unknown_hello": {"UNAUTHENTICATED"},
                 "data_huge_header": {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"},
                 "data_forged_proof": {"UNAUTHENTICATED"}}
KEYS = ["attack", "baseline_rounds_per_s", "attack_rounds_per_s", "ratio", "peak_rss_mib",
        "rss_bound_mib", "requests", "refusals_by_code", "log_bytes"]
REFUSED = {"UNAUTHENTICATED", "PERMISSION_DENIED"}


def fail(message, proc=None):
    if proc is not None:
        message += f"\n--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}"
    sys.exit(message)


def number(row, key):
    value = row[key]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        fail(f"{row['attack']}: {key} is not a finite number: {value!r}")
    return value


def main(bench, server, work):
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "hostile.json")
    if os.path.exists(path):
        os.remove(path)
    args = [bench, "hostile", "--quick", "--server-bin", server, "--json", path]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=170)
    if not os.path.exists(path):
        fail(f"{' '.join(args)} wrote no JSON (exit {proc.returncode})", proc)
    with open(path) as f:
        rows = json.load(f)
    if [r.get("attack") for r in rows] != ATTACKS:
        fail(f"want one row per attack {ATTACKS}, got {[r.get('attack') for r in rows]}", proc)
    for r in rows:
        name = r["attack"]
        if list(r)[:len(KEYS)] != KEYS:
            fail(f"{name}: keys must start with {KEYS}: {list(r)}")
        if r.get("error"):
            fail(f"{name}: the run failed: {r['error']}", proc)
        for key in ("baseline_rounds_per_s", "attack_rounds_per_s"):
            if number(r, key) <= 0:
                fail(f"{name}: honest training stalled ({key} = {r[key]})", proc)
        if number(r, "peak_rss_mib") > number(r, "rss_bound_mib"):
            fail(f"{name}: peak RSS {r['peak_rss_mib']:.1f} MiB above the bound "
                 f"{r['rss_bound_mib']} MiB", proc)
        if number(r, "requests") <= 0:
            fail(f"{name}: the attack sent nothing", proc)
        if number(r, "log_bytes") < 0:
            fail(f"{name}: negative log growth")
        codes = r["refusals_by_code"]
        if not isinstance(codes, dict) or any(not isinstance(n, int) or n <= 0 for n in codes.values()):
            fail(f"{name}: refusals_by_code must map status names to counts: {codes!r}")
        if "OK" in codes:
            fail(f"{name}: OK is not a refusal: {codes!r}")
        if name == "impersonation":
            if r["accepted"] != 0 or set(codes) - REFUSED:
                fail(f"impersonation: not every attempt was refused: {codes}, {r['notes']}", proc)
            if sum(codes.values()) != r["requests"]:
                fail(f"impersonation: {r['requests']} attempts but {sum(codes.values())} refusals")
        if name == "pull_leak" and not r["check_ok"]:
            fail(f"pull_leak: {r['check']}", proc)
        if name.startswith("data_") and r["accepted"] != 0:
            fail(f"{name}: the data port took what it should refuse: {r['notes']}", proc)
        if name in DATA_REFUSALS and (not codes or set(codes) - DATA_REFUSALS[name]):
            fail(f"{name}: want refusals {DATA_REFUSALS[name]}, got {codes}, {r['notes']}", proc)
    if proc.returncode != 0:
        fail(f"{' '.join(args)} failed ({proc.returncode})", proc)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
