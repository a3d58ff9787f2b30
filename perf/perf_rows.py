"""The result rows of ccoll's perf programs and their MPI peers (perf/report.cc's columns), for the scripts that
compare two of them side by side (collectives_vs_mpi.sh, netbench/collectives_bench.sh)."""
import glob
import sys


def times_us(pattern, rounds, what):
    """Time per call in microseconds, by size: {bytes: [one per file]} over the files matching `pattern`, one file per
    round. Exits, naming the file or `what`, on a failed check (FAILED, or a row with wrong elements), on no rows, or
    on a size without one row per round."""
    times = {}
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            text = f.read()
        if "FAILED" in text:
            sys.exit(f"{path}: FAILED")
        for line in text.splitlines():
            f = line.split()  # size count type redop algo codec time algbw busbw wirebits error #wrong
            if len(f) >= 12 and f[0].isdigit():
                if f[-1] != "0":
                    sys.exit(f"{path}: {f[0]} bytes: {f[-1]} wrong elements")
                times.setdefault(int(f[0]), []).append(float(f[6]))
    if not times:
        sys.exit(f"{what}: no rows")
    for size, t in times.items():
        if len(t) != rounds:
            sys.exit(f"{what}: {len(t)} rows of {size} bytes in {rounds} rounds")
    return times
