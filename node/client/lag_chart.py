"""The picture ``hastore lag chart`` draws: lag in bytes and in seconds per slave over time, with
failovers and sync-state set changes marked. matplotlib with the Agg backend, loaded only here
(and only when a chart is asked for), so no other command pays for it.

    draw_lag_chart(samples, events, "lag.png", title="group g1")   # LagSamples, LagEvents

Slaves are told apart by colour across masters: after a failover the old master may come back
as a slave and get a line of its own. A failover is a red dashed line across both plots named
with the new master; a slave joining (leaving) the sync-state set is a green (orange) tick
at the top of the bytes plot.
"""

from __future__ import annotations

import datetime as dt

FIGURE_SIZE_IN = (11, 6.5)
FIGURE_DPI = 90
EVENT_LABELS_MAX = 12      # more failovers than this are drawn without their names
SLAVES_MAX = 16            # lines per plot; the rest are left out (named in the legend's title)


def draw_lag_chart(samples: list, events: list, out_path: str, *, title: str) -> dict:
    """Write the chart of ``samples`` (replication.lag_history.LagSample, any order) with
    ``events`` (LagEvent) marked to ``out_path`` as PNG; what was drawn (slaves, counts)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    by_slave: dict[str, list] = {}
    for sample in sorted(samples, key=lambda s: s.time_s):
        by_slave.setdefault(sample.slave, []).append(sample)
    slaves = sorted(by_slave)[:SLAVES_MAX]
    left_out = sorted(by_slave)[SLAVES_MAX:]

    figure, (bytes_axis, seconds_axis) = plt.subplots(2, 1, sharex=True, figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI)
    try:
        colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for index, slave in enumerate(slaves):
            points = by_slave[slave]
            times = [_when(s.time_s) for s in points]
            colour = colours[index % len(colours)]
            # a gap where the slave was not sampled (not connected, or another master's term
            # lost with a killed node) stays a gap rather than a line drawn across it
            bytes_axis.plot(times, _with_gaps(points, [s.lag_bytes / 1024 for s in points]), color=colour,
                            linewidth=1.2, label=slave)
            seconds_axis.plot(times, _with_gaps(points, [s.lag_s for s in points]), color=colour, linewidth=1.2)
        failovers = [e for e in events if e.kind == "failover"]
        for number, event in enumerate(failovers):
            when = _when(event.time_s)
            for axis in (bytes_axis, seconds_axis):
                axis.axvline(when, color="tab:red", linestyle="--", linewidth=1)
            if number < EVENT_LABELS_MAX:
                new_master = event.detail.split("-> ")[-1]
                bytes_axis.annotate(f"failover: {new_master}", xy=(when, 1), xycoords=("data", "axes fraction"),
                                    xytext=(3, -12 - 11 * (number % 3)), textcoords="offset points",
                                    fontsize=8, color="tab:red")
        for event in events:
            if event.kind in ("in_sync", "out_of_sync"):
                bytes_axis.plot([_when(event.time_s)], [1.0], transform=bytes_axis.get_xaxis_transform(),
                                marker="v", markersize=6, clip_on=False,
                                color="tab:green" if event.kind == "in_sync" else "tab:orange")
        bytes_axis.set_ylabel("lag (KiB)")
        seconds_axis.set_ylabel("lag (seconds)")
        seconds_axis.set_xlabel("time (UTC)")
        for axis in (bytes_axis, seconds_axis):
            axis.grid(True, alpha=0.3)
            axis.set_ylim(bottom=0)
        seconds_axis.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        handles, labels = bytes_axis.get_legend_handles_labels()
        handles += [plt.Line2D([], [], color="tab:red", linestyle="--"),
                    plt.Line2D([], [], color="tab:green", marker="v", linestyle=""),
                    plt.Line2D([], [], color="tab:orange", marker="v", linestyle="")]
        labels += ["failover", "joined sync-state set", "left sync-state set"]
        if left_out:
            labels[0] += f" (and {len(left_out)} more slaves not drawn)"
        # above the plots, so it never hides a line or a failover's name
        figure.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=len(labels),
                      fontsize=8, frameon=False)
        figure.suptitle(title)
        figure.tight_layout(rect=(0, 0, 1, 0.93))
        figure.savefig(out_path, format="png")
    finally:
        plt.close(figure)
    return {"out": out_path, "slaves": slaves, "samples": len(samples),
            "failovers": len(failovers), "sync_state_changes": sum(e.kind != "failover" for e in events)}


def _when(time_s: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(time_s, tz=dt.timezone.utc).replace(tzinfo=None)


def _with_gaps(points: list, values: list[float]) -> list[float]:
    """``values`` with NaN where a sample follows a gap of more than three sampling steps or
    begins another master's term, or is not connected (matplotlib breaks a line at NaN)."""
    steps = sorted(b.time_s - a.time_s for a, b in zip(points, points[1:]))
    usual_s = steps[len(steps) // 2] if steps else 1.0
    shown = []
    for index, (point, value) in enumerate(zip(points, values)):
        before = points[index - 1] if index > 0 else point
        gap = point.time_s - before.time_s > 3 * max(usual_s, 0.1) or (before.master, before.epoch) != (
            point.master, point.epoch)   # another master's term: its own line
        shown.append(float("nan") if gap or not point.connected else value)
    return shown
