"""The picture: predicted vs measured step time (scatter) and per-layout bars, coloured by split."""

from __future__ import annotations

# One colour per split, so a family of layouts that the planner gets wrong together stands out.
COLOURS = {"data parallel": "tab:blue", "tensor parallel": "tab:red", "pipeline": "tab:green"}


def _family(x: dict) -> str:
    if x["tp"] > 1:
        return "tensor parallel"
    return "pipeline" if x["pp"] > 1 else "data parallel"


def plot(result: dict, path: str) -> None:
    """Left: predicted vs measured step time, log-log, with y = x and a ±10 % band. Right: both times
    per layout (sorted by measured time) with the prediction's error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, NullFormatter

    from shardwise.validate.stats import rank_text

    lays = sorted(result["layouts"], key=lambda x: x["measured_step_time_s"])
    pred = [1e3 * x["predicted_step_time_s"] for x in lays]
    meas = [1e3 * x["measured_step_time_s"] for x in lays]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, max(6.5, 0.34 * len(lays) + 1.8)),
                                   gridspec_kw={"width_ratios": [1, 1.15]})
    ms = FuncFormatter(lambda v, _: f"{v:g}")
    lo, hi = min(pred + meas) / 1.3, max(pred + meas) * 1.3
    ax1.fill_between([lo, hi], [lo / 1.1, hi / 1.1], [lo * 1.1, hi * 1.1], color="grey", alpha=0.15, label="±10 %")
    ax1.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--", label="predicted = measured")
    for family, colour in COLOURS.items():
        pts = [(m, p) for x, m, p in zip(lays, meas, pred) if _family(x) == family]
        if pts:
            ax1.scatter(*zip(*pts), color=colour, s=36, label=family, zorder=3)
    noisy = [(m, p) for x, m, p in zip(lays, meas, pred) if x.get("noisy")]
    if noisy:  # their repeats spread too far to trust the measurement (the table's "(noisy)")
        ax1.scatter(*zip(*noisy), s=110, facecolors="none", edgecolors="black", lw=1, label="noisy", zorder=4)
    ax1.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), aspect="equal",
            xlabel="measured step time (ms)", ylabel="predicted step time (ms)")
    s = result["summary"]
    ax1.set_title(f"{result['model']}, {result['world']} ranks ({result['backend']}), {len(lays)} layouts\n"
                  f"step time: median error {100 * s['median_abs_error']:.0f} %, Kendall τ {rank_text(s['kendall_tau'])}, "
                  f"top-1 regret {100 * s['top1_regret']:.0f} %\n"
                  f"memory: median error {100 * s.get('memory_median_abs_error', 0):.2f} %, "
                  f"p90 {100 * s.get('memory_p90_abs_error', 0):.2f} %", fontsize=10)
    ticks = [v for v in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if lo <= v <= hi]
    for axis in (ax1.xaxis, ax1.yaxis):
        axis.set_major_formatter(ms)
        axis.set_minor_formatter(NullFormatter())
        axis.set_ticks(ticks)
    ax1.legend(loc="upper left", fontsize=9)
    ax1.grid(True, which="both", alpha=0.2)
    y = list(range(len(lays)))
    ax2.barh([i + 0.2 for i in y], meas, height=0.4, label="measured", color="0.55")
    ax2.barh([i - 0.2 for i in y], pred, height=0.4, label="predicted",
             color=[COLOURS[_family(x)] for x in lays])
    for i, (p, m) in enumerate(zip(pred, meas)):
        ax2.text(max(p, m) * 1.05, i, f"{(p - m) / m:+.0%}", va="center", fontsize=8)
    ax2.set_yticks(y, [x["name"] + (" (noisy)" if x.get("noisy") else "") for x in lays], fontsize=8.5)
    ax2.set_xscale("log")
    ax2.set_xlim(lo, hi * 1.6)
    ax2.xaxis.set_major_formatter(ms)
    ax2.xaxis.set_minor_formatter(NullFormatter())
    ax2.set_xticks(ticks)
    ax2.set_xlabel("step time (ms, log scale); label: predicted vs measured")
    handles = [Patch(color="0.55", label="measured")] + [Patch(color=c, label=f"predicted, {f}") for f, c in COLOURS.items()]
    ax2.legend(handles=handles, loc="lower right", fontsize=9)
    ax2.grid(True, axis="x", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
