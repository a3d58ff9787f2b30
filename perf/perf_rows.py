"""The result rows of ccoll's perf programs and their MPI peers (perf/report.cc's columns), for the scripts that
compare two of them side by side (collectives_vs_mpi.sh, netbench/collectives_bench.sh), or two builds of one
(compare_small_mpi.sh, netbench/compare_builds.sh)."""
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

        def fail(why):
            # The run's output too: the calling script may delete its files on the way out.
            sys.stderr.write("".join(text.splitlines(keepends=True)[-30:]))
            sys.exit(f"{path}: {why}")

        if "FAILED" in text:
            fail("FAILED")
        for line in text.splitlines():
            f = line.split()  # size count type redop algo codec time algbw busbw wirebits error #wrong
            if len(f) >= 12 and f[0].isdigit():
                if f[-1] == "N/A":
                    fail(f"{f[0]} bytes: not checked (-c 0); these comparisons need the check")
                if f[-1] != "0":
                    fail(f"{f[0]} bytes: {f[-1]} wrong elements")
                times.setdefault(int(f[0]), []).append(float(f[6]))
    if not times:
        sys.exit(f"{what}: no rows")
    for size, t in times.items():
        if len(t) != rounds:
            sys.exit(f"{what}: {len(t)} rows of {size} bytes in {rounds} rounds")
    return times


def old_new_table(old_pattern, new_pattern, rounds, name, unit="us"):
    """The markdown table of two builds' runs of one program (compare_small_mpi.sh, netbench/compare_builds.sh): per
    size, each build's median time per call over the rounds (fastest-slowest) and NEW / OLD; the rows checked as
    times_us checks them. unit: "us" as the programs print, or "ms"."""
    import statistics
    if unit not in ("us", "ms"):
        sys.exit(f"{name}: unit {unit!r} is neither us nor ms")
    div = 1e3 if unit == "ms" else 1.0
    old = times_us(old_pattern, rounds, f"{name} OLD")
    new = times_us(new_pattern, rounds, f"{name} NEW")
    if set(old) != set(new):
        sys.exit(f"{name}: the two builds ran different sizes ({sorted(old)} and {sorted(new)})")
    digits = 2 if unit == "ms" else 1
    print(f"\n{name}\n")
    print(f"| bytes | OLD {unit}: median (fastest-slowest) | NEW {unit} | NEW / OLD |")
    print("|---:|---:|---:|---:|")
    for size in sorted(old):
        o, n = [t / div for t in old[size]], [t / div for t in new[size]]
        mo, mn = statistics.median(o), statistics.median(n)
        print(f"| {size} | {mo:.{digits}f} ({min(o):.{digits}f}-{max(o):.{digits}f}) | {mn:.{digits}f} "
              f"({min(n):.{digits}f}-{max(n):.{digits}f}) | {mn / mo:.2f} |")


if __name__ == "__main__":
    # python3 perf_rows.py old_new OLD_GLOB NEW_GLOB ROUNDS NAME [UNIT]
    if len(sys.argv) in (6, 7) and sys.argv[1] == "old_new":
        old_new_table(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], *sys.argv[6:])
    else:
        sys.exit("usage: perf_rows.py old_new OLD_GLOB NEW_GLOB ROUNDS NAME [us|ms]")
