"""plot.py RESULT.json OUT.png: speedup vs the bf16 baseline against gradient size, one line per codec.

RESULT.json is what report.py writes ({"meta": ..., "rows": [...]}). Debian's python3-matplotlib (/usr/bin/python3).
"""
import json
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src, dst = sys.argv[1:3]
    with open(src) as f:
        res = json.load(f)
    meta, rows = res["meta"], res["rows"]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    styles = {"f32": ("k", "--"), "bf16": ("k", "-"), "mpi": ("tab:red", ":"), "mpiring": ("tab:red", "-.")}
    palette = iter(plt.get_cmap("tab10").colors[:3] + plt.get_cmap("tab10").colors[4:] + plt.get_cmap("Dark2").colors)
    for key in meta["rows"]:
        pts = sorted((r["size"], r["speedup_vs_bf16"]) for r in rows if r["row"] == key and r["speedup_vs_bf16"])
        if not pts:
            continue
        # quant rows: requant solid, homomorphic dashed
        color, ls = styles.get(key) or (next(palette), "--" if key.endswith("h") and key.startswith("q") else "-")
        ax.plot([p[0] / 2**20 for p in pts], [p[1] for p in pts], marker="o", ls=ls, color=color,
                label=meta["labels"][key], lw=2 if key.startswith("q4") else 1.2)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    sizes = sorted({r["size"] for r in rows})
    ax.set_xticks([s / 2**20 for s in sizes])
    ax.set_xticklabels(["%g MiB" % (s / 2**20) for s in sizes])
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: "%g" % v))
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("float32 gradient size per rank")
    ax.set_ylabel("speedup vs bf16 all-reduce (bf16 time / time)")
    ax.set_title("ccoll all-reduce, %d ranks, tbf %s per link (%s, %s cores shared)" % (
        meta["np"], meta["rate"], meta["tag"], meta["cores"]), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="best")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print("plot.py: wrote %s" % dst)


if __name__ == "__main__":
    main()
