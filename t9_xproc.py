"""Across processes: run.call with the child served only by another process; wait_for whose
key is changed by another process (racing); send from another process.
usage: t9_xproc.py sqlite|pg"""
import os, sys, time, subprocess, signal
sys.path.insert(0, "/tmp/wf-campaign")
import reactor
from lib import database
backend = sys.argv[1]; N = 40
PY = "/work/main/.venv/bin/python"
fails = []
def fail(*a): fails.append(a); print("FAIL", *a, flush=True)
CHILD = '''
import sys, time; sys.path.insert(0, "/tmp/wf-campaign")
import reactor
state = reactor.open(sys.argv[1])
@state.workflow("kid")
def kid(run, x):
    return run.step("k", lambda: x * 2)
w = state.serve(workflows=["kid"], concurrency=2); print("ready", flush=True)
time.sleep(1e6)
'''
WRITER = '''
import sys, random; sys.path.insert(0, "/tmp/wf-campaign")
import reactor
state = reactor.open(sys.argv[1]); sc = state.scope("k")
n = int(sys.argv[2])
for v in range(1, 21):
    for i in range(n):
        sc.set(f"w{i}", v)
state.close()
'''
with database(backend) as url:
    state = reactor.open(url)
    @state.workflow("par")
    def par(run, x):
        return run.call("kid", x)
    @state.workflow("wf")
    def wf(run, x):
        return run.wait_for("k", run.id, lambda v: v == 20, timeout=60)
    w = state.serve(workflows=["par", "wf"], concurrency=4)
    hs = [state.start("par", i, id=f"p{i}") for i in range(N)]
    time.sleep(1)
    c = subprocess.Popen([PY, "-c", CHILD, url], stdout=subprocess.PIPE, text=True); c.stdout.readline()
    t0 = time.time()
    for i, h in enumerate(hs):
        try:
            if h.result(timeout=20) != 2 * i: fail("call result", h.id)
        except Exception as e: fail("call", h.id, type(e).__name__, h.status())
    print("run.call across processes:", N, "in", round(time.time() - t0, 2), flush=True)
    hw = [state.start("wf", None, id=f"w{i}") for i in range(N)]
    time.sleep(0.3)
    wr = subprocess.run([PY, "-c", WRITER, url, str(N)], timeout=120)
    for h in hw:
        try:
            if h.result(timeout=20) != 20: fail("wait_for val", h.id)
        except Exception as e: fail("wait_for", h.id, type(e).__name__, h.status())
    print("wait_for with writer in another process:", N, flush=True)
    c.kill(); c.wait(); w.stop(); state.close()
print("SUMMARY", backend, "fails", len(fails))
