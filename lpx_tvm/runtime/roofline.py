"""The profile's roofline-style figure (PNG, matplotlib; docs/profile.md).

Two panels, one point per layer that multiplies on the MXM: achieved MACs per cycle (its
MACs over the cycles it owns, the table's time base) against its arithmetic intensity, MACs per byte of weights
installed (left) and per byte read from SRAM (right). Drawn with them: the MXM compute
ceiling of each dtype (``peak_macs_per_cycle_for``), and the bandwidth ceilings, install
(``install_bytes_per_cycle``: ``mxm_planes * mxm_install_streams * lanes``) and SRAM read
(``sram_read_bytes_per_cycle``: ``mem_slices * mem_read_ports * lanes``). A layer's distance below a ceiling is its
distance from that floor: it sits on the install line exactly when its cycles equal its
install floor, as the table's "of floor" says. A layer whose work partly ran in cycles
owned by earlier layers (its floor above its cycles) can sit above a ceiling: it is drawn
hollow. A layer that owns no cycle has no point.
"""

from __future__ import annotations

import os

from ..errors import LPXError

EXTRA = "profile"
LABELLED = 8  # the layers with the most cycles get their names on the figure


class MissingExtraError(LPXError):
    """An optional dependency of the command is not installed."""


def pyplot():
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise MissingExtraError(f"the roofline figure needs matplotlib: pip install 'lpx-tvm[{EXTRA}]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _null_formatter():
    from matplotlib.ticker import NullFormatter

    return NullFormatter()


def bandwidths(cfg) -> dict:
    """Bytes per cycle of the two bandwidth ceilings."""
    return {"install": cfg.install_bytes_per_cycle, "sram_read": cfg.sram_read_bytes_per_cycle}


def roofline_points(profile) -> list:
    """``[(layer, MACs per owned cycle, MACs per installed byte, MACs per SRAM byte read)]``
    of the layers with MACs and cycles (an intensity is None when the layer moved no such bytes)."""
    bw = bandwidths(profile.cfg)
    out = []
    for layer in profile.layers:
        if not layer.macs or not layer.cycles:
            continue
        installed = layer.floors.install * bw["install"]
        read = layer.floors.sram_read * bw["sram_read"]
        out.append((layer, layer.macs / layer.cycles, layer.macs / installed if installed else None,
                    layer.macs / read if read else None))
    return out


def save_roofline(profile, path: "str | os.PathLike") -> None:
    """Draw ``profile``'s roofline figure into the PNG file ``path``."""
    plt = pyplot()
    cfg = profile.cfg
    bw = bandwidths(cfg)
    points = roofline_points(profile)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), constrained_layout=True)
    peaks = {}
    for d in cfg.mxm_cycles_per_vector:
        peaks.setdefault(cfg.peak_macs_per_cycle_for(d), []).append(d)
    xs = [p[i] for p in points for i in (2, 3) if p[i]] or [1.0]
    lo, hi = min(xs) / 4, max(xs) * 4
    labelled = {id(p[0]) for p in sorted(points, key=lambda p: -p[0].cycles)[:LABELLED]}
    for ax, col, kind, what in ((axes[0], 2, "install", "installed weight byte"),
                                (axes[1], 3, "sram_read", "SRAM byte read")):
        top = max(peaks)
        ax.plot([lo, hi], [bw[kind] * lo, bw[kind] * hi], "k--", lw=1,
                label=f"{kind.replace('_', ' ')} ceiling: {bw[kind]:,} B/cycle")
        for peak, names in sorted(peaks.items(), reverse=True):
            ax.axhline(peak, lw=1, color="tab:red", alpha=0.4 + 0.6 * peak / top)
            ax.text(hi, peak, f" {'/'.join(names)} peak {peak:,.0f}", va="bottom", ha="right", fontsize=8,
                    color="tab:red")
        for layer, rate, *intensity in points:
            x = intensity[col - 2]
            if x is None:
                continue
            overlapped = layer.floor_cycles > layer.cycles  # hollow: it borrowed earlier layers' cycles
            ax.scatter([x], [rate], s=18, color="none" if overlapped else _colour(layer.mxm_dtype),
                       edgecolors=_colour(layer.mxm_dtype))
            if id(layer) in labelled:
                ax.annotate(layer.name, (x, rate), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(_null_formatter())  # the decades only: minor labels collide
        ax.set_xlim(lo, hi)
        ax.set_ylim(min([p[1] for p in points] + [top]) / 10, top * 2)
        ax.set_xlabel(f"arithmetic intensity (MACs per {what})")
        ax.set_ylabel("achieved MACs per cycle")
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{cfg.name}, {profile.precision}: per layer, MACs per owned cycle against the machine's ceilings")
    fig.savefig(os.fspath(path), dpi=110)
    plt.close(fig)


def _colour(dtype: str) -> str:
    return {"int8": "tab:blue", "uint8": "tab:blue", "fp16": "tab:green", "bf16": "tab:olive",
            "fp32": "tab:purple"}.get(dtype, "tab:gray")
