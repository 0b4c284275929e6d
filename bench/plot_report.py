#!/usr/bin/env python3
"""Draws the JSON report of pmap-bench as a PNG: one horizontal bar per ratio (median, with
the min..max of the rounds as a whisker), its target marked, met / missed / report-only
coloured, hatched where other processes were busy while it was measured.

    build/release/bench/pmap-bench --json report.json
    /usr/bin/python3 bench/plot_report.py report.json bench/report.png

Needs Debian's python3-matplotlib (hence /usr/bin/python3 rather than another python3).
"""

import argparse
import io
import json
import math
import sys

try:
    import matplotlib
except ModuleNotFoundError:
    sys.exit("plot_report.py needs matplotlib: apt-get install python3-matplotlib, and run it "
             "with that Python (/usr/bin/python3 bench/plot_report.py ...)")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from PIL import Image  # noqa: E402  (matplotlib's own dependency)

COLOURS = {True: "#3a9e4f", False: "#d1453b", None: "#9aa0a6"}
NOISY = 0.2  # cores of other processes' CPU above which pmap-bench flags a row (table.hpp)


def label(row):
    return f"{row['workload']} | {row['size']} | {row['pmap']} vs {row['baseline']}"


def target_text(row):
    if row["target"] is None:
        return "report"
    text = f"{row['target_op']} {row['target']:g}"
    if row.get("aim"):
        text += f" (aim {row['aim']:g})"
    return text


def usable(row):
    r = row.get("ratio")
    return r is not None and math.isfinite(r) and r > 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="pmap-bench --json output")
    parser.add_argument("png", nargs="?", default="bench/report.png", help="chart to write")
    parser.add_argument("--dpi", type=int, default=72)
    args = parser.parse_args()

    with open(args.json, encoding="utf-8") as f:
        report = json.load(f)
    rows = [r for r in report["rows"] if usable(r)]
    if not rows:
        sys.exit(f"{args.json}: no finite ratios to draw")

    n = len(rows)
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.3 * n))
    ys = list(range(n))[::-1]  # first row at the top
    ratios = [r["ratio"] for r in rows]
    lows = [r["ratio"] - r.get("ratio_min", r["ratio"]) for r in rows]
    highs = [r.get("ratio_max", r["ratio"]) - r["ratio"] for r in rows]
    bars = ax.barh(ys, ratios, height=0.7, color=[COLOURS[r["met"]] for r in rows],
                   xerr=[lows, highs],
                   error_kw={"ecolor": "#444444", "elinewidth": 0.8, "capsize": 2})
    for bar, r in zip(bars, rows):
        if (r.get("others") or 0) > NOISY:  # measured while other processes were busy
            bar.set_hatch("///")
            bar.set_edgecolor("white")
    for y, r in zip(ys, rows):
        if r["target"] is not None:
            ax.plot([r["target"]] * 2, [y - 0.45, y + 0.45], color="black", linewidth=2.2)
            if r.get("aim"):
                ax.plot([r["aim"]] * 2, [y - 0.45, y + 0.45], color="black", linewidth=1,
                        linestyle=":")
        ax.annotate(f"{r['ratio']:.3g}  ({target_text(r)})", xy=(1.005, y),
                    xycoords=("axes fraction", "data"), va="center", fontsize=8)
    ax.axvline(1.0, color="#666666", linewidth=0.8, linestyle="--")

    ax.set_xscale("log")
    values = ratios + [r["target"] for r in rows if r["target"] is not None]
    values += [r.get("ratio_max", r["ratio"]) for r in rows]
    ax.set_xlim(min(values) / 1.5, max(values) * 1.5)
    ax.set_yticks(ys)
    ax.set_yticklabels([label(r) for r in rows], fontsize=8)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_xlabel("ratio (time rows: pmap / baseline, lower is better; "
                  "rate rows: pmap / baseline, higher is better); black bar: target")
    ax.grid(axis="x", which="both", color="#e0e0e0", linewidth=0.5)
    ax.set_axisbelow(True)
    targets = report.get("targets", {})
    ax.set_title(f"pmap-bench: targets met {targets.get('met', '?')} of "
                 f"{targets.get('total', '?')}  (green met, red missed, grey report only, "
                 f"hatched: measured while other processes were busy)\n"
                 f"{report['machine']['line']}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    # A palette PNG is a fraction of the RGBA one: the chart has a handful of colours.
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=args.dpi)
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(colors=64)
    image.save(args.png, optimize=True)
    print(f"wrote {args.png} ({n} ratios)")


if __name__ == "__main__":
    main()
