"""The summary's statistics (pure Python): spread, quantiles, rank correlations, regret."""

from __future__ import annotations

import statistics


def spread(times: list[float]) -> float:
    """Interquartile range / median."""
    if len(times) < 2:
        return 0.0
    s = sorted(times)
    return (quantile(s, 0.75) - quantile(s, 0.25)) / statistics.median(s)


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _ranks(xs: list[float]) -> list[float]:
    """1-based ranks, ties get their average rank."""
    order = sorted(range(len(xs)), key=xs.__getitem__)
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    """Pearson correlation of the ranks."""
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else 0.0


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-b (ties in either list are neither concordant nor discordant)."""
    conc = disc = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif (da > 0) == (db > 0):
                conc += 1
            else:
                disc += 1
    den = ((conc + disc + ties_a) * (conc + disc + ties_b)) ** 0.5
    return (conc - disc) / den if den else 0.0


def widest_discordant_gap(measured: list[float], predicted: list[float]) -> float | None:
    """The widest relative gap |a - b| / min(a, b) of the measured values over the pairs the prediction orders the
    other way (None when none is): how far apart in the source's own figures the pairs that lower Kendall's tau are.
    It says whether a low tau rests on near-ties (rows a source's run-to-run noise could reorder) or on a real
    difference; tau itself is unchanged."""
    widest = None
    for i in range(len(measured)):
        for j in range(i + 1, len(measured)):
            da, db = measured[i] - measured[j], predicted[i] - predicted[j]
            if da and db and (da > 0) != (db > 0):
                gap = abs(da) / min(abs(measured[i]), abs(measured[j]))
                widest = gap if widest is None else max(widest, gap)
    return widest


def rank_text(value: float | None) -> str:
    """A rank correlation as validate prints it: two decimals, or "n/a" with one layout."""
    return "n/a (one layout)" if value is None else f"{value:.2f}"


def summarize(predicted: list[float], measured: list[float]) -> dict:
    """The contract's summary of step times (errors are fractions of the measured time); the rank correlations are
    None for a single layout (no pair to order)."""
    errors = [abs(p - m) / m for p, m in zip(predicted, measured)]
    pick = min(range(len(predicted)), key=predicted.__getitem__)
    best = min(range(len(measured)), key=measured.__getitem__)
    top3 = sorted(range(len(predicted)), key=predicted.__getitem__)[:3]
    return {"median_abs_error": statistics.median(errors), "p90_abs_error": quantile(errors, 0.9),
            "spearman": spearman(predicted, measured) if len(predicted) > 1 else None,
            "kendall_tau": kendall_tau(predicted, measured) if len(predicted) > 1 else None,
            "top1_regret": measured[pick] / measured[best] - 1, "best_in_top3": best in top3}
