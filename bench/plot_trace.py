#!/usr/bin/env python3
"""Draws a pmap trace (pmap::trace, PMAP_TRACE) as a per-device Gantt chart.

    python3 bench/plot_trace.py trace.json out.png [--from-us T0] [--to-us T1]

One row per logical device: kernel work, collectives (the part not spent waiting), waiting
for peers inside a collective, and suspended (the device's task gave up its thread), one
colour each. Below it, a table per collective: count, total time, and the share of it spent
waiting. The same table is printed on stdout.
"""

import argparse
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

COLOURS = {
    "kernel": "#c9d6e3",
    "collective": "#3b75af",
    "wait": "#ef8636",
    "suspended": "#c44e52",
}
THREAD_TRACK = 100000  # src/trace.cpp: thread tracks start here, device tracks below


def load(path):
    with open(path) as f:
        return json.load(f)["traceEvents"]


def device_tracks(events):
    names = {}
    for e in events:
        if e["ph"] == "M" and e["name"] == "thread_name" and e["tid"] < THREAD_TRACK:
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    return names


def intervals(events, tracks):
    """Per track: lists of (start, end) per colour."""
    out = defaultdict(lambda: defaultdict(list))
    suspended_since = {}
    for e in sorted(events, key=lambda e: e.get("ts", 0)):
        key = (e.get("pid"), e.get("tid"))
        if key not in tracks:
            continue
        if e["ph"] == "X":
            cat = e.get("cat")
            if cat in ("kernel", "collective", "wait"):
                out[key][cat].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "i" and e["name"] == "suspend":
            suspended_since[key] = e["ts"]
        elif e["ph"] == "i" and e["name"] == "resume" and key in suspended_since:
            out[key]["suspended"].append((suspended_since.pop(key), e["ts"]))
    return out


def summary(events):
    rows = defaultdict(lambda: [0, 0.0, 0.0])  # count, total us, waiting us
    for e in events:
        if e["ph"] != "X":
            continue
        if e.get("cat") == "collective":
            rows[e["name"]][0] += 1
            rows[e["name"]][1] += e["dur"]
        elif e.get("cat") == "wait":
            rows[e["args"]["collective"]][2] += e["dur"]
    table = []
    for name, (count, total, waiting) in sorted(rows.items(), key=lambda r: -r[1][1]):
        if count:
            table.append([name, str(count), f"{total / 1000:.3f}", f"{waiting / 1000:.3f}",
                          f"{100 * waiting / total:.0f}%" if total > 0 else "-"])
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("out")
    parser.add_argument("--from-us", type=float, default=None)
    parser.add_argument("--to-us", type=float, default=None)
    args = parser.parse_args()

    events = load(args.trace)
    tracks = device_tracks(events)
    if not tracks:
        sys.exit(f"{args.trace}: no device tracks (was anything traced?)")
    spans = intervals(events, tracks)
    order = sorted(tracks, key=lambda k: (k[0], k[1]))
    t0 = args.from_us if args.from_us is not None else min(
        s for k in order for c in spans[k].values() for s, _ in c)
    t1 = args.to_us if args.to_us is not None else max(
        e for k in order for c in spans[k].values() for _, e in c)

    table = summary(events)
    header = ["collective", "count", "total ms", "waiting ms", "waiting"]
    print("  ".join(f"{h:>12}" for h in header))
    for row in table:
        print("  ".join(f"{c:>12}" for c in row))

    height = 0.5 + 0.32 * len(order)
    fig = plt.figure(figsize=(11, height + 0.35 * (len(table) + 2) + 0.8))
    grid = fig.add_gridspec(2, 1, height_ratios=[height, 0.3 * (len(table) + 2)], hspace=0.35)
    ax = fig.add_subplot(grid[0])
    for row, key in enumerate(order):
        for cat in ("kernel", "collective", "wait", "suspended"):
            bars = [(max(s, t0) - t0, min(e, t1) - max(s, t0)) for s, e in spans[key][cat] if e > t0 and s < t1]
            if bars:
                ax.broken_barh([(s / 1000, w / 1000) for s, w in bars], (row - 0.4, 0.8),
                               facecolors=COLOURS[cat], linewidth=0)
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([tracks[k].split(" (")[0] for k in order])
    ax.invert_yaxis()
    ax.set_xlim(0, (t1 - t0) / 1000)
    ax.set_xlabel("ms since the first event shown")
    ax.set_title(args.trace.split("/")[-1])
    ax.legend(handles=[Patch(color=COLOURS[c], label=c) for c in COLOURS], loc="upper center",
              bbox_to_anchor=(0.5, -0.25), ncol=4, frameon=False)
    tab = fig.add_subplot(grid[1])
    tab.axis("off")
    if table:
        tab.table(cellText=table, colLabels=header, loc="center", cellLoc="right")
    fig.savefig(args.out, dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    main()
