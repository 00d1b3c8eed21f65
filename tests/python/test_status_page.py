"""The /status page of a real ps-server's metrics port, opened in a real headless browser
(Debian's chromium): its per-worker table as the browser parsed it, and a screenshot
whose pixels show the table rendered with its marks (docs/metrics.md, "The status
page")."""

import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import urllib.request
import zlib

import numpy as np
import pytest

import ps_server
from ps_server.launch import Shards

TENSORS = [("w", 64), ("b", 8)]
INIT = [np.zeros(64, np.float32), np.zeros(8, np.float32)]
ABSENT_RGB = (0xfb, 0xee, 0xc4)  # tr.absent td
HEADER_RGB = (0xe8, 0xee, 0xf7)  # th


def chromium():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("no chromium: the status page is checked in a real browser (Debian package "
                    "chromium; run.sh test installs it)")
    return path


def browse(browser, url, *args):
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", f"--user-data-dir={profile}", *args, url],
            capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB or RGBA, non-interlaced PNG."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    channels = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        rows.append([tuple(line[x * channels:x * channels + 3]) for x in range(width)])
        prev = line
    return width, height, rows


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_status_page_in_a_real_browser(server_bin, tmp_path):
    browser = chromium()
    port = free_port()
    # Three workers, f = 1: two push and the round closes at its deadline without the
    # third, which never joins: the page marks it absent.
    with Shards(1, 3, byzantine=1, aggregator="median", lr=0.1, momentum=0.0,
                server=server_bin,
                server_args=("--metrics-port", str(port), "--round-deadline-ms", "200")) as shards:
        workers = [ps_server.Worker(shards.addresses, w, TENSORS, initial=INIT if w == 0 else None,
                                    token_file=shards.token_file(w), connect_timeout=30)
                   for w in range(2)]
        for w in workers:
            for t, (_, n) in enumerate(TENSORS):
                w.push(t, 0, np.ones(n, np.float32))
            w.wait_pushes()
        outs = [np.empty(n, np.float32) for _, n in TENSORS]
        assert workers[0].pull_all(1, outs, timeout=30) == 1
        url = f"http://127.0.0.1:{port}/status"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.headers["Content-Type"] == "text/html; charset=utf-8"

        # The table as the browser built it.
        dom = browse(browser, url, "--dump-dom")
        rows = re.findall(r"<tr( class=\"(\w+)\")?><td class=\"id\">(\d+)</td><td>([\w ]+)</td>"
                          r"<td>(\d+)</td>", dom)
        assert [(r[2], r[3], r[1]) for r in rows] == [("0", "present", ""), ("1", "present", ""),
                                                       ("2", "never joined", "absent")], dom
        assert [int(r[4]) for r in rows] == [2, 2, 0]  # two slices pushed each
        assert "ps-server shard 0 of 1" in dom and "ready" in dom

        # What the browser drew: the table's header and the absent row's colour.
        shot = tmp_path / "status.png"
        browse(browser, url, f"--screenshot={shot}", "--window-size=1000,600")
        width, height, pixels = png_pixels(shot)
        assert (width, height) == (1000, 600)
        counts = {}
        for row in pixels:
            for rgb in row:
                counts[rgb] = counts.get(rgb, 0) + 1
        assert counts.get(HEADER_RGB, 0) > 500, "no table header drawn"
        assert counts.get(ABSENT_RGB, 0) > 500, "the absent worker's row is not marked"
        assert len(counts) > 20, "a blank page"
        for w in workers:
            w.close()
