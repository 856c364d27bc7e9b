"""KL(fp16 || spec) against bits per element, one line per method, as SVG.

    python3 bench/scripts/plot_kl.py QUALITY.jsonl OUT.svg [TITLE]

Reads the JSON lines `veloxquant ppl --ref fp16 --json` prints (see
bench/scripts/quality.sh). Plain Python: no plotting library needed.
"""
import json
import math
import sys


def family(spec):
    """The method name, e.g. 'tq-mse' or 'k=qjl / v=tq-mse', and whether it
    keeps an fp16 window of recent tokens ('+ window')."""
    parts = dict(p.split("=", 1) for p in spec.split(";"))
    k, v = parts["k"].split(":")[0], parts["v"].split(":")[0]
    name = k if k == v else f"k={k} / v={v}"
    residuals = [int(x.split(",")[0].split(";")[0]) for x in spec.split("residual=")[1:]]
    return name + (" + window" if any(r > 0 for r in residuals) else "")


def bits(r):
    """Bits per element actually allocated (codes, metadata, positions and the
    fp16 window) at the end of a window: 16 * bytes / fp16 bytes."""
    return 16.0 * r["kv_bytes"] / r["kv_bytes_fp16"]


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    out = sys.argv[2]
    title = sys.argv[3] if len(sys.argv) > 3 else "KL(fp16 || spec) vs bits per element"
    lines = {}
    for r in rows:
        if r.get("kl", 0) <= 0:
            continue
        lines.setdefault(family(r["spec"]), []).append((bits(r), r["kl"], r["spec"]))
    W, H, L, R, T, B = 860, 520, 80, 250, 40, 60
    xs = [p[0] for pts in lines.values() for p in pts]
    ys = [math.log10(p[1]) for pts in lines.values() for p in pts]
    x0, x1 = math.floor(min(xs)), math.ceil(max(xs))
    y0, y1 = math.floor(min(ys)), math.ceil(max(ys))
    sx = lambda x: L + (x - x0) / (x1 - x0) * (W - L - R)
    sy = lambda y: H - B - (y - y0) / (y1 - y0) * (H - T - B)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2 - R / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>']
    for x in range(x0, x1 + 1):
        svg.append(f'<line x1="{sx(x):.1f}" y1="{T}" x2="{sx(x):.1f}" y2="{H - B}" stroke="#ddd"/>')
        svg.append(f'<text x="{sx(x):.1f}" y="{H - B + 18}" text-anchor="middle">{x}</text>')
    for y in range(y0, y1 + 1):
        svg.append(f'<line x1="{L}" y1="{sy(y):.1f}" x2="{W - R}" y2="{sy(y):.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{L - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">1e{y}</text>')
    svg.append(f'<text x="{(L + W - R) / 2}" y="{H - 15}" text-anchor="middle">bits per element allocated '
               '(codes, metadata, positions, fp16 window)</text>')
    svg.append(f'<text x="18" y="{(T + H - B) / 2}" transform="rotate(-90 18 {(T + H - B) / 2})" '
               'text-anchor="middle">mean KL(fp16 || spec), nats/token (log)</text>')
    # one colour per method, solid with the fp16 window, dashed without
    methods = sorted({name.replace(" + window", "") for name in lines})
    for i, (name, pts) in enumerate(sorted(lines.items())):
        base = name.replace(" + window", "")
        c = colors[methods.index(base) % len(colors)]
        dash = "" if name.endswith("window") else ' stroke-dasharray="6,4"'
        pts.sort()
        path = " ".join(f"{sx(x):.1f},{sy(math.log10(k)):.1f}" for x, k, _ in pts)
        svg.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
        for x, k, spec in pts:
            svg.append(f'<circle cx="{sx(x):.1f}" cy="{sy(math.log10(k)):.1f}" r="3.5" fill="{c}"><title>{spec}: '
                       f'KL {k:.3g}</title></circle>')
        svg.append(f'<line x1="{W - R + 15}" y1="{T + 20 * i + 10}" x2="{W - R + 35}" y2="{T + 20 * i + 10}" '
                   f'stroke="{c}" stroke-width="3"{dash}/>')
        svg.append(f'<text x="{W - R + 40}" y="{T + 20 * i + 14}">{name}</text>')
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
