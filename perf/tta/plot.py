#!/usr/bin/python3
"""Time-to-accuracy report of perf/tta/run.sh: a PNG of test accuracy vs training wall time per codec and a
markdown table (time to target, speedup vs the baseline, final accuracy, accuracy delta vs the baseline).

    /usr/bin/python3 perf/tta/plot.py [--baseline bf16] [--target 0.95] RESULTS_DIR [NAME ...]

Reads RESULTS_DIR/NAME.jsonl (every *.jsonl when no NAME is given), the logs of examples/train_ddp.py, and writes
RESULTS_DIR/tta.png and RESULTS_DIR/tta.md (also printed). Time to target is the training wall time (evaluation
excluded) of the first evaluation at or above the target; the target defaults to the one in the logs.
"""

import argparse
import glob
import json
import os
import sys


def load(path):
    config, points, final = {}, [], {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            if rec.get("config"):
                config = rec
            elif rec.get("final"):
                final = rec
            else:
                points.append(rec)
    return config, points, final


def time_to(points, target, key="time"):
    for p in points:
        if p["acc"] >= target:
            return p[key]
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", default="bf16")
    ap.add_argument("--target", type=float, default=None)
    ap.add_argument("results")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    names = args.names or sorted(os.path.basename(p)[:-6] for p in glob.glob(os.path.join(args.results, "*.jsonl")))
    runs = {}
    for name in names:
        path = os.path.join(args.results, name + ".jsonl")
        if not os.path.exists(path):
            print("plot.py: %s is missing; skipped" % path, file=sys.stderr)
            continue
        runs[name] = load(path)
    if not runs:
        sys.exit("plot.py: no logs")
    target = args.target
    if target is None:
        target = next((c.get("target") for c, _, _ in runs.values() if c.get("target") is not None), 0.95)

    base = runs.get(args.baseline)
    base_ttt = time_to(base[1], target) if base else None
    base_acc = base[1][-1]["acc"] if base and base[1] else None

    rows = []
    for name, (config, points, final) in runs.items():
        if not points:
            continue
        ttt = time_to(points, target)
        last = points[-1]
        acc = last["acc"]
        steps = last["step"]
        step_ms = 1000 * last["time"] / steps
        comm = last.get("comm_s")
        mb_step = last["bytes_sent"] / steps / 1e6 if last.get("bytes_sent") is not None else None
        rows.append({
            "name": name,
            "codec": config.get("codec", name),
            "ttt": ttt,
            "stt": time_to(points, target, "step"),
            "speedup": (base_ttt / ttt) if (base_ttt and ttt) else None,
            "acc": acc,
            "delta": (acc - base_acc) if base_acc is not None else None,
            "best": max(p["acc"] for p in points),
            "steps": steps,
            "step_ms": step_ms,
            "comm": (100 * comm / last["time"]) if comm is not None else None,
            "mb": mb_step,
            "time": last["time"],
        })

    def fmt(v, spec, none="—"):
        return none if v is None else format(v, spec)

    out = ["Target: test accuracy >= %.1f %% (the first evaluation at or above it). Baseline: %s. Time = training "
           "wall time, evaluation excluded." % (100 * target, args.baseline), "",
           "| codec | spec | time to target (s) | steps to target | speedup vs %s | final acc (%%) | Δ acc vs %s (points) | best acc (%%) "
           "| steps | ms/step | comm share (%%) | MB sent/step/rank |" % (args.baseline, args.baseline),
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append("| %s | `%s` | %s | %s | %s | %.2f | %s | %.2f | %d | %.0f | %s | %s |" % (
            r["name"], r["codec"], fmt(r["ttt"], ".1f", "not reached"), fmt(r["stt"], "d", "—"),
            fmt(r["speedup"], ".2f") +
            ("x" if r["speedup"] else ""), 100 * r["acc"], fmt(None if r["delta"] is None else 100 * r["delta"], "+.2f"),
            100 * r["best"], r["steps"], r["step_ms"], fmt(r["comm"], ".0f"), fmt(r["mb"], ".2f")))
    table = "\n".join(out) + "\n"
    with open(os.path.join(args.results, "tta.md"), "w") as f:
        f.write(table)
    print(table)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for name, (config, points, _) in runs.items():
        if not points:
            continue
        t = [p["time"] for p in points]
        a = [100 * p["acc"] for p in points]
        label = "%s (%s)" % (name, config.get("codec", name)) if config.get("codec", name) != name else name
        ax.plot(t, a, marker=".", label=label, linewidth=2 if name == args.baseline else 1.3)
        ax2.plot([p["step"] for p in points], a, marker=".", label=label,
                 linewidth=2 if name == args.baseline else 1.3)
    for a_ in (ax, ax2):
        a_.axhline(100 * target, color="gray", linestyle="--", linewidth=1)
        a_.set_ylabel("test accuracy (%)")
        a_.set_ylim(max(0, 100 * target - 15), 100)
        a_.grid(alpha=0.3)
    any_cfg = next(iter(runs.values()))[0]
    ax.set_xlabel("training wall time (s)")
    ax.set_title("accuracy vs time, %s ranks at 1 Gbit/s, %.1f M params" % (
        any_cfg.get("world", "?"), any_cfg.get("params", 0) / 1e6))
    ax2.set_xlabel("step")
    ax2.set_title("accuracy vs step (same data order in every run)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.results, "tta.png"), dpi=110)


if __name__ == "__main__":
    main()
