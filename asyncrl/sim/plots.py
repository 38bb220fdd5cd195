"""Plots of a grid (matplotlib, Agg backend: no display needed).

  throughput.png  throughput vs instances, one line per system, one panel per η
  staleness.png   histogram of consumed-entry staleness per system (all runs summed), η panels
"""

from __future__ import annotations

import collections

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)


def _panels(n: int):
    fig, axes = plt.subplots(1, n, figsize=(4.8 * n, 3.8), squeeze=False)
    return fig, axes[0]


def throughput(results, path: str) -> None:
    etas = sorted({r.eta for r in results})
    systems = list(dict.fromkeys(r.system for r in results))
    fig, axes = _panels(len(etas))
    styles = ["-", "--", "-.", ":"]  # systems that coincide (verl, AReaL) stay visible
    for ax, eta in zip(axes, etas):
        for k, s in enumerate(systems):
            pts = collections.defaultdict(list)
            for r in results:
                if r.eta == eta and r.system == s:
                    pts[r.instances].append(r.throughput_tok_s)
            xs = sorted(pts)
            ys = [sum(pts[x]) / len(pts[x]) / 1e6 for x in xs]
            style = (dict(lw=2.5, color="black") if s == "staleflow"
                     else dict(lw=1.4, ls=styles[k % len(styles)]))
            ax.plot(xs, ys, marker="o", ms=3, label=s, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("rollout instances (8 GPUs each)")
        ax.set_title(f"η = {eta}")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("throughput (M response tokens/s)")
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def staleness(results, path: str) -> None:
    etas = sorted({r.eta for r in results})
    systems = list(dict.fromkeys(r.system for r in results))
    fig, axes = _panels(len(etas))
    width = 0.8 / max(len(systems), 1)
    for ax, eta in zip(axes, etas):
        top = 0
        for i, s in enumerate(systems):
            hist = collections.Counter()
            for r in results:
                if r.eta == eta and r.system == s:
                    hist.update(r.staleness_hist)
            total = sum(hist.values()) or 1
            ks = sorted(hist)
            top = max([top, *ks])
            ax.bar([k + (i - len(systems) / 2) * width for k in ks],
                   [hist[k] / total for k in ks], width=width, label=s)
        ax.axvline(eta + 0.5, color="red", ls="--", lw=1)
        ax.set_xticks(range(top + 1))
        ax.set_xlabel("staleness (consumed version − V_traj)")
        ax.set_title(f"η = {eta} (red: the bound)")
    axes[0].set_ylabel("fraction of consumed entries")
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
