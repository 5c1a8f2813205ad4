"""The picture: predicted vs measured step time (scatter) and per-layout bars."""

from __future__ import annotations


def plot(result: dict, path: str) -> None:
    """Predicted vs measured step time (scatter, y = x line) and per-layout bars of both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lays = sorted(result["layouts"], key=lambda x: x["measured_step_time_s"])
    pred = [1e3 * x["predicted_step_time_s"] for x in lays]
    meas = [1e3 * x["measured_step_time_s"] for x in lays]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, max(4.5, 0.32 * len(lays) + 1.5)),
                                   gridspec_kw={"width_ratios": [1, 1.4]})
    ax1.scatter(meas, pred, color="tab:blue")
    hi = max(pred + meas) * 1.08
    ax1.plot([0, hi], [0, hi], color="grey", lw=1, ls="--", label="predicted = measured")
    ax1.set(xlim=(0, hi), ylim=(0, hi), xlabel="measured step time (ms)", ylabel="predicted step time (ms)")
    s = result["summary"]
    ax1.set_title(f"{result['model']} on {result['world']} ranks ({result['backend']}): median error "
                  f"{100 * s['median_abs_error']:.1f} %, Kendall τ {s['kendall_tau']:.2f}", fontsize=10)
    ax1.legend(loc="upper left")
    y = range(len(lays))
    ax2.barh([i + 0.2 for i in y], meas, height=0.4, label="measured", color="tab:orange")
    ax2.barh([i - 0.2 for i in y], pred, height=0.4, label="predicted", color="tab:blue")
    ax2.set_yticks(list(y), [x["name"] for x in lays], fontsize=8)
    ax2.set_xlabel("step time (ms)")
    ax2.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
