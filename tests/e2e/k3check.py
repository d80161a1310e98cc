"""Verdict helpers shared by the end-to-end drivers (tests/e2e/test_*.py).

Every verdict is a value, a count or a status, never a duration: wait_until bounds a wait (the
timeout only turns a hang into a failure naming what was awaited), it never judges speed.
  check(cond, what)         raises AssertionError(what) unless cond, else prints "ok - what"
  wait_until(pred, t, what) pred's first truthy value within t seconds; `tolerate` lists the
                            exceptions that count as "not yet" (a worker restarting, a port closing)
  scrape(port) / msum(...)  a /metrics page and the sum of a metric's samples (optionally those
                            whose line holds `label`)
  run(main)                 runs a driver's main: "N passed, 0 failed", or FAILED + exit 1
"""
import sys
import time
import urllib.request

PASSED = [0]


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    PASSED[0] += 1
    print("ok -", what, flush=True)


def wait_until(pred, timeout, what, tolerate=(), poll=0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            v = pred()
        except tolerate:
            v = None
        if v:
            return v
        time.sleep(poll)
    raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))


def scrape(port, timeout=10):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=timeout) as f:
        return f.read().decode()


def msum(text, name, label=None):
    tot = 0.0
    for ln in text.splitlines():
        if (ln.startswith(name + " ") or ln.startswith(name + "{")) and (label is None or label in ln):
            tot += float(ln.rsplit(" ", 1)[1])
    return tot


def run(main):
    try:
        main()
    except AssertionError as e:
        print("FAILED:", e)
        print("%d passed, 1 failed" % PASSED[0])
        sys.exit(1)
    print("%d passed, 0 failed" % PASSED[0])
