"""report.py META RAW_DIR OUT_PREFIX: the rows of one allreduce_bench.sh run -> OUT_PREFIX.json and OUT_PREFIX.md.

META is the run's meta.json (written by allreduce_bench.sh), RAW_DIR holds <row>.json as written by allreduce_perf -J
and mpi_allreduce_perf -J. Sizes are float32 gradient bytes: the bf16 baseline ran at half the bytes (the same
element count), so its size is doubled here; algbw = size / time for every row, and speedup = bf16 time / time.
"""
import json
import os
import statistics
import sys

GRAD_ELEMENT_BYTES = 4  # float32 gradients


def human(n):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return "%d%s" % (n // scale, unit)
    return str(n)


def load_rows(meta, raw):
    out = []
    rounds = meta.get("rounds", 1)
    for key in meta["rows"]:
        if key in meta["failed"]:
            continue
        # Round 1 carries the checked values (error, wrong, ...); the time is the median over the rounds.
        times = {}
        first = None
        for k in range(1, rounds + 1):
            path = os.path.join(raw, "%s.r%d.json" % (key, k))
            if not os.path.exists(path):
                continue
            with open(path) as f:
                got = json.load(f)
            first = first or got
            for r in got:
                times.setdefault(r["count"], []).append(r["time_us"])
        for r in first or []:
            elements = r["count"]
            t = times[elements]
            med = statistics.median(t)
            out.append({
                "row": key, "label": meta["labels"][key], "size": elements * GRAD_ELEMENT_BYTES,
                "elements": elements, "type": r["type"], "codec": r["codec"], "time_us": med,
                "times_us": t, "spread": (max(t) - min(t)) / med if len(t) > 1 else None,
                "algbw_GBps": elements * GRAD_ELEMENT_BYTES / med / 1e3,
                "wirebits": r["wirebits"], "wirebits_measured": r.get("wirebits_measured", True),
                "error": r.get("error"), "wrong": r.get("wrong"), "identical": r.get("identical"),
                "send_intact": r.get("send_intact"),
            })
    # CPU-only times (threads, local transport) of the same rows, when the run made them.
    for key in meta["rows"]:
        path = os.path.join(raw, key + ".cpu.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            cpu = {r["count"]: r["time_us"] for r in json.load(f)}
        for r in out:
            if r["row"] == key:
                r["cpu_only_us"] = cpu.get(r["elements"])
    # The time the wire alone needs: each rank sends wirebits * elements * 2(n-1)/n bits at the self-checked rate.
    try:
        link_bps = float(meta["selfcheck_mbit"]) * 1e6
    except ValueError:
        link_bps = None
    n = meta["np"]
    for r in out:
        r["wire_bound_us"] = (r["wirebits"] * r["elements"] * 2 * (n - 1) / n / link_bps * 1e6) if link_bps else None
    base = {r["elements"]: r["time_us"] for r in out if r["row"] == "bf16"}
    mpi = {r["elements"]: r["time_us"] for r in out if r["row"] == "mpi"}
    for r in out:
        b, m = base.get(r["elements"]), mpi.get(r["elements"])
        r["speedup_vs_bf16"] = b / r["time_us"] if b else None
        r["speedup_vs_mpi"] = m / r["time_us"] if m else None
    return out


def fmt(v, f):
    return f % v if v is not None else "-"


def main():
    meta_path, raw, prefix = sys.argv[1:4]
    with open(meta_path) as f:
        meta = json.load(f)
    rows = load_rows(meta, raw)
    n = meta["np"]
    with open(prefix + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)

    keys = [k for k in meta["rows"] if any(r["row"] == k for r in rows)]
    sizes = sorted({r["size"] for r in rows})
    by = {(r["row"], r["size"]): r for r in rows}
    bad = sorted({r["label"] for r in rows
                  if r["wrong"] not in (0, None) or r["identical"] is False or r["send_intact"] is False})
    L = []
    p = L.append
    p("# All-reduce on a shaped cluster: %d ranks, tbf %s per link" % (meta["np"], meta["rate"]))
    p("")
    p("- Run %s (tag %s), %d s in all; repository at commit %s%s, binaries built %s; %s; %s." % (
        meta["start"], meta["tag"], meta["elapsed_s"], meta["commit"],
        " (%s files in src/include/perf with uncommitted edits)" % meta["dirty"] if meta["dirty"] not in ("", "0")
        else "", meta["build_time"],
        meta["ccoll_library"] or "ccoll", meta["mpi_library"] or "no MPI"))
    gso = meta.get("gso", "0")
    p("- Cluster: perf/netbench/cluster.sh, %d network namespaces behind a bridge, `tc tbf rate %s burst %s "
      "latency 50ms` on both ends of every veth, GSO packets at most %s; self-check host 0 -> host 1: %s Mbit/s. "
      "No latency emulation (no netem in this kernel)." % (
          meta["np"], meta["rate"], meta.get("burst", "256kb"),
          "64 KiB (the kernel's)" if gso in ("", "0") else gso + " bytes", meta["selfcheck_mbit"]))
    p("- ccoll ranks: `ip netns exec ccnbK allreduce_perf` with CC_RANK/CC_NRANKS/CC_ROOT=10.77.0.1:port/CC_SECRET, "
      "CC_SOCKET_IFNAME=eth0, UCX_TLS=tcp,self, UCX_NET_DEVICES=eth0; -n %d -w %d -c %d -D %s -a %s%s; %s. OpenMPI: "
      "mpirun with one rank per namespace (rsh agent), --mca pml ob1 --mca btl self,tcp on eth0, "
      "mpi_allreduce_perf with the same flags. 'OpenMPI f32' is OpenMPI as it comes (the issue's reference); "
      "'OpenMPI f32 tuned' adds --mca mpi_yield_when_idle 1 (every namespace looks like its own node, so OpenMPI "
      "busy-polls, 4 ranks on 2 cores) and its ring all-reduce (--mca coll_tuned_use_dynamic_rules 1 --mca "
      "coll_tuned_allreduce_algorithm 4): the strongest MPI peer on these links." % (
          meta["iters"], meta["warmup"], meta["check"], meta["dist"], meta["algo"],
          "; extra environment " + meta["ccoll_env"] if meta["ccoll_env"] else "",
          "one round" if meta.get("rounds", 1) == 1 else
          "%d rounds, each row once per round in a rotated order; time = the median over the rounds, spread = "
          "(slowest - fastest) / median; the check ran in round 1" % meta["rounds"]))
    p("- size = float32 gradient bytes; every row all-reduces size/4 elements. The bf16 baseline sends those "
      "elements as bfloat16 (-d bfloat16, half the bytes); every other ccoll row takes float32 in and out. "
      "algbw = size / time (GB/s, 1e9), so speedup vs bf16 = bf16 time / time at the same size. wirebits: bits "
      "each rank sent per element and ring transmission (measured by ccoll; nominal 32 for MPI). error: vNMSE "
      "against the fp64 reference (the bf16 row's reference is of its bf16 inputs).")
    p("- Machine: %s cores%s, shared with other work (builds and tests of other engineers may run concurrently); "
      "load average (1, 5, 15 min) %s at start, %s at end; compiler/linker processes seen: %s at start, %s at end. "
      "The 4 ranks share these cores, so CPU-bound codec work competes with everything else on the machine." % (
          meta["cores"], " (%s)" % meta["cpu"] if meta.get("cpu") else "", meta["load_start"], meta["load_end"],
          meta["busy_start"], meta["busy_end"]))
    for s in meta["skipped"]:
        p("- Skipped: %s" % s)
    if meta["failed"]:
        p("- FAILED rows (no numbers): %s" % ", ".join(meta["labels"][k] for k in meta["failed"]))
    p("- Result checks: %s." % ("FAILED in " + ", ".join(bad) if bad else
                                 "all passed" if meta["check"] else "disabled (-c 0)"))

    target = 64 << 20
    q, b, m = by.get(("q4r", target)), by.get(("bf16", target)), by.get(("mpi", target))
    if q:
        p("")
        p("## Targets at 64 MiB float32 (issue 7)")
        p("")
        if b:
            p("- quant 4b requant vs bf16 baseline: %.2fx algbw (%.1f ms vs %.1f ms); target >= 3x: %s." % (
                b["time_us"] / q["time_us"], q["time_us"] / 1e3, b["time_us"] / 1e3,
                "met" if b["time_us"] / q["time_us"] >= 3 else "NOT met"))
        if m:
            p("- quant 4b requant vs OpenMPI f32: %.2fx algbw (%.1f ms vs %.1f ms); target >= 12x: %s." % (
                m["time_us"] / q["time_us"], q["time_us"] / 1e3, m["time_us"] / 1e3,
                "met" if m["time_us"] / q["time_us"] >= 12 else "NOT met"))
        mr = by.get(("mpiring", target))
        if mr:
            p("- (quant 4b requant vs OpenMPI f32 tuned (ring, yield when idle): %.2fx (%.1f ms); no target.)" % (
                mr["time_us"] / q["time_us"], mr["time_us"] / 1e3))

    p("")
    p("## Speedup vs the bf16 baseline (bf16 time / time), by size")
    p("")
    p("| codec | " + " | ".join(human(s) for s in sizes) + " |")
    p("|---|" + "---:|" * len(sizes))
    for k in keys:
        p("| %s | " % meta["labels"][k] + " | ".join(
            fmt(by[(k, s)]["speedup_vs_bf16"], "%.2f") if (k, s) in by else "-" for s in sizes) + " |")

    p("")
    p("## All rows")
    p("")
    p("Where the time goes: *wire-bound* = the time the measured wirebits need at the self-checked link rate "
      "(wirebits * elements * 2(n-1)/n / rate; a ring at line rate with free compute); *CPU-only* = the same row "
      "as %d threads of one process on the local transport (no network, no TCP; -c 0), i.e. what the cores alone "
      "need. time well above both: the two do not overlap (or TCP/UCX costs add up); CPU-only near time: "
      "compute-bound on this machine." % n)
    p("")
    multi = meta.get("rounds", 1) > 1
    p("| size | codec | time (ms) | algbw (GB/s) | wirebits | error (vNMSE) | speedup vs bf16 | wire-bound (ms) "
      "| CPU-only (ms) |" + (" spread |" if multi else ""))
    p("|---:|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if multi else ""))
    for s in sizes:
        for k in keys:
            r = by.get((k, s))
            if not r:
                continue
            p("| %s | %s | %.1f | %.3f | %s%s | %s | %s | %s | %s |" % (
                human(s), r["label"], r["time_us"] / 1e3, r["algbw_GBps"], "%.2f" % r["wirebits"],
                "" if r["wirebits_measured"] else " (nominal)", fmt(r["error"], "%.2e"),
                fmt(r["speedup_vs_bf16"], "%.2f"), fmt(r["wire_bound_us"] and r["wire_bound_us"] / 1e3, "%.1f"),
                fmt(r.get("cpu_only_us") and r["cpu_only_us"] / 1e3, "%.1f")) +
              (" %s |" % fmt(r["spread"] and 100 * r["spread"], "%.0f%%") if multi else ""))
    with open(prefix + ".md", "w") as f:
        f.write("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
