#!/usr/bin/env python3
"""Checks deploy/'s monitoring files against a real ps-server (docs/metrics.md, "Alerts
and the dashboard"):

1. `promtool check rules` and `promtool test rules` on the alerting rules and their
   unit tests (ps-server.rules.test.yml);
2. every query of the Grafana dashboard (deploy/grafana/ps-server.json) parses as
   PromQL (promtool checks them as recording rules);
3. every metric the rules and the dashboard name is one a real shard exports: it starts
   the given ps-server (--udp-port, so that the UDP families exist too) on loopback,
   scrapes its /metrics and compares the names.

    python3 deploy/prometheus/check.py build/bin/ps-server

Exit 0 when every check passes, 1 on a failure, 77 (ctest's skip) without promtool
(Debian package prometheus)."""

import json
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
RULES = HERE / "ps-server.rules.yml"
RULE_TESTS = HERE / "ps-server.rules.test.yml"
DASHBOARD = HERE.parent / "grafana" / "ps-server.json"
# Exported only in some states, with the reason; everything else must be in a scrape.
CONDITIONAL = {
    "ps_checkpoint_age_seconds": "only once the shard wrote a checkpoint (--checkpoint-dir)",
    "up": "made by Prometheus for every scrape target",
}
METRIC = re.compile(r"\b(up|ps_[a-z0-9_]+|process_[a-z0-9_]+)\b")


def fail(message):
    print(f"check.py: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def promtool(*args):
    done = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        fail(f"promtool {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    print(f"  ok: promtool {' '.join(args)}", flush=True)


def dashboard_queries():
    dash = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            queries.append((panel["title"], target["expr"]))
    if not queries:
        fail(f"{DASHBOARD} has no queries")
    return queries


def rule_queries():
    # The rules file is YAML; its `expr:` values are one line or a `|` block.
    queries, lines = [], RULES.read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if not m:
            continue
        if m.group(2).strip() == "|":
            block, indent = [], len(m.group(1))
            for follow in lines[i + 1:]:
                if follow.strip() and len(follow) - len(follow.lstrip()) <= indent:
                    break
                block.append(follow.strip())
            queries.append(" ".join(block))
        else:
            queries.append(m.group(2))
    return queries


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scraped_names(server):
    """The metric names a freshly started shard exports (histograms with their series)."""
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(3):  # the picked metrics port may be taken meanwhile
            port = free_port()
            port_file = pathlib.Path(tmp) / "port"
            proc = subprocess.Popen(
                [server, "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file),
                 "--metrics-port", str(port), "--workers", "2",
                 "--udp-port", "0", "--run-dir", str(pathlib.Path(tmp) / "run")],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                deadline = time.monotonic() + 20
                text = None
                while time.monotonic() < deadline and proc.poll() is None:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                    timeout=2) as r:
                            text = r.read().decode()
                        break
                    except OSError:
                        time.sleep(0.2)
            finally:
                proc.terminate()
                try:
                    _, err = proc.communicate(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    _, err = proc.communicate()
            if text is not None:
                break
            print(f"  (attempt {attempt + 1}: no scrape from port {port}; {err[-300:]!r})")
        else:
            fail("could not scrape a ps-server in three attempts")
    names = set()
    for line in text.splitlines():
        m = re.match(r"^# TYPE (\S+) (\S+)$", line)
        if m:
            names.add(m.group(1))
            if m.group(2) == "histogram":
                names.update(m.group(1) + s for s in ("_bucket", "_sum", "_count"))
            elif m.group(2) == "summary":
                names.update(m.group(1) + s for s in ("_sum", "_count"))
    return names


def main():
    if len(sys.argv) != 2:
        fail("usage: check.py PATH/TO/ps-server")
    if shutil.which("promtool") is None:
        print("check.py: SKIPPED: no promtool (Debian package prometheus; run.sh test "
              "installs it)")
        sys.exit(77)
    promtool("check", "rules", str(RULES))
    with tempfile.TemporaryDirectory() as tmp:
        # promtool test rules reads rule_files relative to the test file.
        for f in (RULES, RULE_TESTS):
            shutil.copy(f, tmp)
        promtool("test", "rules", str(pathlib.Path(tmp) / RULE_TESTS.name))
        # The dashboard's queries, with its template variables as Grafana fills them.
        queries = dashboard_queries()
        lines = ["groups:", "  - name: dashboard", "    rules:"]
        for i, (_, expr) in enumerate(queries):
            lines += [f"      - record: dashboard:query_{i}",
                      f"        expr: {json.dumps(expr.replace('$job', '.*'))}"]
        parsed = pathlib.Path(tmp) / "dashboard.rules.yml"
        parsed.write_text("\n".join(lines) + "\n")
        promtool("check", "rules", str(parsed))
    print(f"  ok: {len(queries)} dashboard queries parse")
    exported = scraped_names(sys.argv[1])
    print(f"  ok: a real shard exports {len(exported)} metric names")
    used = {}
    for where, expr in [(f"dashboard panel '{t}'", e) for t, e in queries] + \
                       [("ps-server.rules.yml", e) for e in rule_queries()]:
        for name in METRIC.findall(expr):
            used.setdefault(name, where)
    unknown = {n: w for n, w in used.items() if n not in exported and n not in CONDITIONAL}
    if unknown:
        fail("metrics no shard exports: " +
             "; ".join(f"{n} (in {w})" for n, w in sorted(unknown.items())))
    print(f"  ok: the {len(used)} metrics the rules and the dashboard use exist "
          f"({', '.join(sorted(set(used) & set(CONDITIONAL)))} conditionally)")


if __name__ == "__main__":
    main()
