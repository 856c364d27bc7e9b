"""Eviction results as a markdown table and an SVG plot.

    python3 bench/scripts/plot_evict.py quality QUALITY.jsonl OUT.svg OUT.md
    python3 bench/scripts/plot_evict.py needle NEEDLE.jsonl OUT.svg OUT.md

quality: the JSON lines of bench/scripts/evict_quality.sh (`veloxquant ppl
--ref fp16 --json` plus the spec asked for); the plot is KL(fp16 || spec)
against the token budget, one line per policy (solid on fp16, dashed on
KIVI-2, dotted with Ada-KV), with the KIVI-2 cache without eviction as a
horizontal line (fp16 without eviction is the reference: KL 0).
needle: the JSON lines of bench/scripts/needle.py; the plot is the share of
trials where the number was copied exactly, against the budget.
Plain Python: no plotting library needed (as bench/scripts/plot_kl.py).
"""
import json
import math
import sys

COLORS = {"streaming": "#7f7f7f", "h2o": "#1f77b4", "tova": "#d62728", "keyformer": "#ff7f0e", "snapkv": "#2ca02c",
          "pyramidkv": "#9467bd", "knorm": "#8c564b", "qfilters": "#e377c2"}


def parse(asked):
    """'kivi:bits=2+h2o:budget=512,adakv=1' -> ('kivi:bits=2', 'h2o', 512, True)."""
    base, _, pol = asked.partition("+")
    if not pol:
        return base, None, None, False
    name, _, opts = pol.partition(":")
    kv = dict(o.split("=", 1) for o in opts.split(",") if "=" in o)
    return base, name, int(kv["budget"]), kv.get("adakv") == "1"


def label(base, policy, ada):
    base_name = "fp16" if base == "fp16" else "KIVI-2" if base == "kivi:bits=2" else base
    return f"{policy}{' + Ada-KV' if ada else ''} on {base_name}"


def svg_frame(W, H, L, R, T, B, title, xlabel, ylabel, xticks, yticks, sx, sy):
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{(L + W - R) / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>']
    for x, t in xticks:
        s.append(f'<line x1="{sx(x):.1f}" y1="{T}" x2="{sx(x):.1f}" y2="{H - B}" stroke="#ddd"/>')
        s.append(f'<text x="{sx(x):.1f}" y="{H - B + 18}" text-anchor="middle">{t}</text>')
    for y, t in yticks:
        s.append(f'<line x1="{L}" y1="{sy(y):.1f}" x2="{W - R}" y2="{sy(y):.1f}" stroke="#ddd"/>')
        s.append(f'<text x="{L - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{t}</text>')
    s.append(f'<text x="{(L + W - R) / 2}" y="{H - 15}" text-anchor="middle">{xlabel}</text>')
    s.append(f'<text x="18" y="{(T + H - B) / 2}" transform="rotate(-90 18 {(T + H - B) / 2})" '
             f'text-anchor="middle">{ylabel}</text>')
    return s


def lines_svg(series, baselines, title, ylabel, ylog, jitter=0, W=900, H=560):
    """series: {name: (color, dash, [(budget, y, tip)])}; baselines: [(name, y, dash)]; jitter: pixels
    between the series horizontally, so that equal values (accuracy 0) stay visible."""
    L, R, T, B = 80, 280, 40, 60
    xs = sorted({p[0] for _, _, pts in series.values() for p in pts}) or [256, 512, 1024]
    x0, x1 = math.log2(min(xs)) - 0.25, math.log2(max(xs)) + 0.25
    ys = [p[1] for _, _, pts in series.values() for p in pts] + [b[1] for b in baselines]
    if ylog:
        ys = [math.log10(y) for y in ys if y > 0]
        y0, y1 = math.floor(min(ys)), math.ceil(max(ys))
        f = math.log10
        yticks = [(y, f"1e{y}") for y in range(y0, y1 + 1)]
    else:
        y0, y1 = 0.0, 1.0
        f = float
        yticks = [(y / 5, f"{y / 5:.1f}") for y in range(6)]
    sx = lambda b: L + (math.log2(b) - x0) / (x1 - x0) * (W - L - R)
    sy = lambda yt: H - B - (yt - y0) / (y1 - y0) * (H - T - B)  # yt: y after f
    s = svg_frame(W, H, L, R, T, B, title, "budget: tokens kept per head (context 2048)", ylabel,
                  [(x, str(x)) for x in xs], yticks, sx, sy)
    row = 0
    for name, y, dash in baselines:
        yy = f(y)
        s.append(f'<line x1="{L}" y1="{sy(yy):.1f}" x2="{W - R}" y2="{sy(yy):.1f}" stroke="black" stroke-width="1.5" '
                 f'stroke-dasharray="{dash}"/>')
        s.append(f'<line x1="{W - R + 15}" y1="{T + 18 * row + 10}" x2="{W - R + 35}" y2="{T + 18 * row + 10}" '
                 f'stroke="black" stroke-width="1.5" stroke-dasharray="{dash}"/>')
        s.append(f'<text x="{W - R + 40}" y="{T + 18 * row + 14}">{name}</text>')
        row += 1
    for i, (name, (color, dash, pts)) in enumerate(sorted(series.items())):
        dx = (i - (len(series) - 1) / 2) * jitter
        px = lambda b: sx(b) + dx
        pts = sorted(p for p in pts if not ylog or p[1] > 0)
        if not pts:
            continue
        d = f' stroke-dasharray="{dash}"' if dash else ""
        path = " ".join(f"{px(b):.1f},{sy(f(y)):.1f}" for b, y, _ in pts)
        s.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{d}/>')
        for b, y, tip in pts:
            s.append(f'<circle cx="{px(b):.1f}" cy="{sy(f(y)):.1f}" r="3.5" fill="{color}"><title>{tip}</title></circle>')
        s.append(f'<line x1="{W - R + 15}" y1="{T + 18 * row + 10}" x2="{W - R + 35}" y2="{T + 18 * row + 10}" '
                 f'stroke="{color}" stroke-width="3"{d}/>')
        s.append(f'<text x="{W - R + 40}" y="{T + 18 * row + 14}">{name}</text>')
        row += 1
    s.append("</svg>")
    return "\n".join(s) + "\n"


def dash_of(base, ada):
    return "2,3" if ada else "" if base == "fp16" else "6,4"


def quality(rows, svg_path, md_path):
    fp16 = next((r for r in rows if r["asked"] == "fp16"), None)
    kivi = next((r for r in rows if r["asked"] == "kivi:bits=2"), None)
    full = fp16["kv_bytes"] if fp16 else None
    md = ["| spec | policy | base | budget | ppl | ppl vs fp16 | KL | top-1 | KV bytes | KV vs fp16 full |",
          "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]

    def key(r):
        base, pol, b, ada = parse(r["asked"])
        return (b or 1 << 30) * -1, base != "fp16", ada, pol or ""

    series = {}
    for r in sorted(rows, key=key):
        base, pol, b, ada = parse(r["asked"])
        rel = f"{100 * (r['ppl'] / r['ppl_ref'] - 1):+.1f} %"
        share = f"{r['kv_bytes'] / full:.3f}" if full else ""
        md.append(f"| `{r['asked']}` | {pol or 'none'}{' + Ada-KV' if ada else ''} | {base} | {b or 'all'} | "
                  f"{r['ppl']:.3f} | {rel} | {r['kl']:.5f} | {r['top1_agree']:.4f} | {r['kv_bytes']} | {share} |")
        if pol:
            series.setdefault(label(base, pol, ada), (COLORS.get(pol, "#17becf"), dash_of(base, ada), []))[2].append(
                (b, r["kl"], f"{r['asked']}: KL {r['kl']:.3g}, ppl {r['ppl']:.2f}"))
    baselines = []
    if kivi:
        baselines.append((f"KIVI-2, no eviction (KL {kivi['kl']:.3g})", kivi["kl"], "1,0"))
    title = "KL(fp16 || spec) vs budget, velox-ref, decode, ctx 2048 (fp16 without eviction: KL 0)"
    with open(svg_path, "w") as f:
        f.write(lines_svg(series, baselines, title, "mean KL, nats/token (log)", True))
    with open(md_path, "w") as f:
        f.write("\n".join(md) + "\n")


def needle(rows, svg_path, md_path):
    groups = {}
    for r in rows:
        if r.get("phase") != "grid" or "error" in r:
            continue
        groups.setdefault(r["spec"], []).append(r)
    # the trials fp16 without eviction passes: what eviction can lose
    fp16_pass = {r["seed"] for r in groups.get("fp16", []) if r["pass"]}
    md = ["| spec | policy | base | budget | trials | exact copies | accuracy | kept of fp16's passes | "
          "mean prompt tokens |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    series, baselines = {}, []
    for spec, rs in sorted(groups.items(), key=lambda kv: (-(parse(kv[0])[2] or 1 << 30), kv[0])):
        base, pol, b, ada = parse(spec)
        ok = sum(r["pass"] for r in rs)
        acc = ok / len(rs)
        toks = sum(r["prompt_tokens"] for r in rs) / len(rs)
        on = [r for r in rs if r["seed"] in fp16_pass]
        kept = f"{sum(r['pass'] for r in on)}/{len(on)}"
        md.append(f"| `{spec}` | {pol or 'none'}{' + Ada-KV' if ada else ''} | {base} | {b or 'all'} | {len(rs)} | {ok} | "
                  f"{acc:.2f} | {kept} | {toks:.0f} |")
        if pol:
            series.setdefault(label(base, pol, ada), (COLORS.get(pol, "#17becf"), dash_of(base, ada), []))[2].append(
                (b, acc, f"{spec}: {ok}/{len(rs)}"))
        else:
            baselines.append((f"{base}, no eviction ({ok}/{len(rs)})", acc, "1,0" if base == "fp16" else "6,4"))
    with open(svg_path, "w") as f:
        f.write(lines_svg(series, baselines, "Needle copy accuracy vs budget, velox-ref, greedy", "exact copies / trials",
                          False, jitter=3))
    with open(md_path, "w") as f:
        f.write("\n".join(md) + "\n")


def main():
    kind, src, svg_path, md_path = sys.argv[1:5]
    rows = [json.loads(line) for line in open(src) if line.strip()]
    if kind == "quality":  # two workers may both have run a spec: keep the last
        rows = list({r["asked"]: r for r in rows}.values())
    {"quality": quality, "needle": needle}[kind](rows, svg_path, md_path)


if __name__ == "__main__":
    main()
