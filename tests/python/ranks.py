"""Runs a function as N ranks, each in its own process (multiprocessing, spawn), and brings back what each returns.

The ranks share one ccoll unique id made here in the parent (whose bootstrap root lives until all have joined).
A rank that raises sends its traceback back; the parent raises RankError with every failing rank's traceback. A
rank that neither returns nor fails within the timeout is killed and reported.

Without CCOLL_LIBRARY in the environment, the library of a default build (build/src/libccoll.so) is used, so that
`/usr/bin/python3 -m unittest discover -s tests/python` works from the repository root after scripts/setup.sh.
"""

import multiprocessing
import os
import queue
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if "CCOLL_LIBRARY" not in os.environ and os.path.exists(os.path.join(ROOT, "build", "src", "libccoll.so")):
    os.environ["CCOLL_LIBRARY"] = os.path.join(ROOT, "build", "src", "libccoll.so")
if os.path.join(ROOT, "python") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    # Spawned ranks import this module (and ccoll) afresh: they need the same path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "python")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

import ccoll  # noqa: E402

# Every collective in a test fails with ccTimeout instead of hanging when a peer is gone.
RANK_TIMEOUT_MS = 20000


class RankError(AssertionError):
    pass


def _rank_main(fn, rank, nranks, uid, args, results):
    try:
        results.put((rank, True, fn(rank, nranks, uid, *args)))
    except BaseException:  # noqa: B902 -- everything goes back to the parent
        results.put((rank, False, traceback.format_exc()))


def run(nranks, fn, *args, timeout=60.0):
    """Runs fn(rank, nranks, unique_id, *args) on nranks processes; returns the list of results by rank.
    fn must be a module-level function (spawn imports it by name). The timeout is the normal build's: a sanitized
    run (scripts/sanitize.sh) scales it by CCTEST_TIME_SCALE."""
    timeout *= float(os.environ.get("CCTEST_TIME_SCALE", "1"))
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    uid = ccoll.get_unique_id()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, nranks, uid, args, results), daemon=True)
             for r in range(nranks)]
    for p in procs:
        p.start()
    out, failures = {}, {}
    start = time.monotonic()
    deadline = start + timeout
    try:
        while len(out) + len(failures) < nranks:
            try:
                rank, ok, value = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                missing = [r for r in range(nranks) if r not in out and r not in failures]
                failures[-1] = "ranks %s did not finish within %.0f s" % (missing, time.monotonic() - start)
                break
            if ok:
                out[rank] = value
            else:
                failures[rank] = "rank %d failed:\n%s" % (rank, value)
                # The others may now wait for it until their ccoll timeout; give them a moment, then report.
                deadline = min(deadline, time.monotonic() + RANK_TIMEOUT_MS / 1000.0 + 5.0)
        if failures:
            raise RankError("\n".join(failures[k] for k in sorted(failures)))
        return [out[r] for r in range(nranks)]
    finally:
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()


def communicator(rank, nranks, uid, **kwargs):
    """A rank's communicator with the test timeout."""
    kwargs.setdefault("timeout_ms", RANK_TIMEOUT_MS)
    return ccoll.Communicator(nranks, uid, rank, **kwargs)


def torch_or_skip_reason():
    """(torch module, None), or (None, why it cannot be imported)."""
    try:
        import torch
        import torch.distributed  # noqa: F401
        return torch, None
    except Exception as e:  # noqa: BLE001 -- any import failure means "no torch here"
        return None, "%s: %s" % (type(e).__name__, e)
