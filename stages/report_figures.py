"""The report's pictures: matplotlib figures and raw image thumbnails, each returned as PNG bytes.

Pure functions of arrays (no run directory here), so stages/report.py decides what to draw and this module only
how. matplotlib renders through the Agg canvas directly (no pyplot): no display, no global figure state, the same
PNG on a laptop, a headless server and CI.
"""

from __future__ import annotations

import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

DPI = 100  # figures are sized in inches for this DPI; the page scales them to its width
PRETRAINED, RANDOM = "#1f6fb5", "#d9822b"  # one colour per backbone, the same in every figure and table


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def image_png(pixels: np.ndarray, max_side: int = 0) -> bytes:
    """H x W x 3 uint8 -> PNG at its own pixels (the page enlarges small ones without smoothing); images larger than
    max_side are shrunk so a grid of photos stays small."""
    from PIL import Image

    im = Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8), "RGB")
    if max_side and max(im.size) > max_side:
        im.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def training_curves(records: list[dict]) -> bytes:
    """Loss, learning rate, img/s and data-wait % against step; the kNN monitor's top-1 when it was logged."""
    steps = [r for r in records if "loss" in r]
    knn = [r for r in records if "knn_top1" in r]
    panels = [("loss", "loss", 1.0), ("learning rate", "lr", 1.0), ("img/s", "img_s", 1.0),
              ("data wait %", "data_wait", 100.0)]
    if knn:
        panels.append(("kNN top-1 % (monitor)", "knn_top1", 100.0))
    fig = Figure(figsize=(3.1 * len(panels), 2.5))
    for i, (title, key, scale) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        rows = knn if key == "knn_top1" else steps
        x = [r["step"] for r in rows]
        y = [scale * r[key] for r in rows]
        ax.plot(x, y, marker="o" if len(x) < 30 else None, ms=3, color=PRETRAINED, lw=1.4)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def few_label_draws(metrics: list[tuple[str, list[float], list[float]]]) -> bytes:
    """Per metric: every draw's top-1 (dots) and mean ± std (bar), pretrained beside random init."""
    fig = Figure(figsize=(3.0 * len(metrics), 2.6))
    for i, (title, pre, base) in enumerate(metrics):
        ax = fig.add_subplot(1, len(metrics), i + 1)
        for x, values, colour, name in ((0, pre, PRETRAINED, "pretrained"), (1, base, RANDOM, "random init")):
            v = 100 * np.asarray(values)
            jitter = np.linspace(-0.12, 0.12, len(v)) if len(v) > 1 else np.zeros(1)
            ax.scatter(x + jitter, v, s=14, color=colour, alpha=0.6, zorder=2)
            ax.errorbar([x], [v.mean()], yerr=[v.std()], fmt="s", ms=7, capsize=6, color=colour, zorder=3, label=name)
        ax.set_xticks([0, 1], ["pretrained", "random init"], fontsize=8)
        ax.set_xlim(-0.6, 1.6)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("top-1 %", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return _png(fig)


def embedding_maps(maps: list[tuple[str, np.ndarray]], labels: np.ndarray, classes: list[str]) -> bytes:
    """One scatter per (title, N x 2 points), coloured by class, two per row (pretrained | random init)."""
    cols = 2
    rows = (len(maps) + cols - 1) // cols
    fig = Figure(figsize=(4.2 * cols + 0.8, 3.8 * rows), layout="constrained")  # room for the outside legend
    palette = colormaps["tab10" if len(classes) <= 10 else "tab20"].colors  # one fixed colour per class index
    colours = [palette[int(c) % len(palette)] for c in labels]
    for i, (title, xy) in enumerate(maps):
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.scatter(xy[:, 0], xy[:, 1], c=colours, s=10 if len(xy) < 2000 else 3, alpha=0.85, linewidths=0)
        ax.set_title(title, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    if len(classes) <= len(palette):
        handles = [Line2D([], [], ls="", marker="o", ms=5, color=palette[c]) for c in range(len(classes))]
        fig.legend(handles, classes, loc="outside right center", fontsize=8, title="class", title_fontsize=8,
                   frameon=False)
    return _png(fig)


def parity_histograms(panels: list[dict]) -> bytes:
    """Per artifact: histogram of the per-image metric its gate is on (log x), the gate as a red line.
    Each panel: title, values, gate, xlabel."""
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig = Figure(figsize=(3.6 * cols, 2.7 * rows))
    for i, p in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        v = np.asarray(p["values"], dtype=np.float64)
        positive = v[v > 0]
        lo = min(positive.min() if len(positive) else p["gate"] / 1e3, p["gate"]) / 2
        hi = max(v.max() if len(v) else p["gate"], p["gate"]) * 2
        bins = np.geomspace(lo, hi, 30)
        ax.hist(np.clip(v, lo, None), bins=bins, color=PRETRAINED, alpha=0.85)
        ax.axvline(p["gate"], color="#c0392b", lw=2)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 3.0)))  # 1e-3, 3e-3, 1e-2: enough to read off
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}"))
        ax.xaxis.set_minor_formatter(NullFormatter())  # labels at every minor tick overlap on a narrow panel
        ax.set_title(f"{p['title']}\ngate {p['gate']:g} (red line)", fontsize=9)
        ax.set_xlabel(p["xlabel"], fontsize=8)
        ax.set_ylabel("images", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return _png(fig)


def compression_tradeoff(points: list[dict]) -> bytes:
    """Size against what an app keeps, one marker per artifact: left, top-k neighbour agreement with the fp32
    encoder; right, the drop in kNN top-1 (filled) and linear-probe top-1 (hollow). Each point: label, size_mb,
    agreement, knn_drop, probe_drop (None: not measured); `gates` draws the compressed gates as red lines."""
    fig = Figure(figsize=(9.6, 3.4))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    colours = colormaps["tab10"]
    for i, p in enumerate(points):
        c = colours(i % 10)
        if p.get("agreement") is not None:
            left.scatter(p["size_mb"], p["agreement"], color=c, s=36, label=p["label"], zorder=3)
        if p.get("knn_drop") is not None:
            right.scatter(p["size_mb"], 100 * p["knn_drop"], color=c, s=36, zorder=3)
        if p.get("probe_drop") is not None:
            right.scatter(p["size_mb"], 100 * p["probe_drop"], facecolors="none", edgecolors=[c], s=36, zorder=3)
    gates = points[0].get("gates") if points else None
    if gates:
        left.axhline(gates["topk"], color="#c0392b", lw=1.5)
        right.axhline(100 * gates["knn"], color="#c0392b", lw=1.5)
    left.set_xlabel("artifact size (MB)", fontsize=8)
    left.set_ylabel("top-k neighbour agreement with fp32", fontsize=8)
    right.set_xlabel("artifact size (MB)", fontsize=8)
    right.set_ylabel("top-1 drop (points): kNN ●, probe ○", fontsize=8)
    right.axhline(0, color="#888888", lw=0.8)
    for ax in (left, right):
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    left.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    return _png(fig)
