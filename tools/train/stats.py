"""Per-layer, per-head statistics that KV-cache compression methods depend on.

The model runs (transformers, bf16 weights, fp32 statistics) over the first N
validation windows of 2048 tokens (<|bos|> + 2047 stream tokens, the same
windows as eval.py). Queries and keys are captured after RoPE, exactly as the
attention sees them (and as a KV cache stores keys). Reported:

  sink_mass     mean softmax weight that a query puts on position 0 (the
                <|bos|> token), over query positions 64..2047;
  sink4_mass    the same for positions 0..3 together;
  key channels  per kv head: mean |k_c| over all tokens for each of the 128
                channels c; spread = max / median of these, the top channels,
                and the same spread before RoPE;
  query anisotropy  per query head: f = first right singular vector of the
                uncentered query matrix Q (tokens x 128), sign chosen so that
                the mean projection mean_t <q_t, f> is positive (Q-Filters);
                reported: mean cosine mean_t <q_t, f> / |q_t|, mean |cosine|,
                the energy share s1^2 / sum s_i^2, and whether sum(f) > 0.
                The per-GQA-group filter (mean of the group's f, normalized)
                is stored in stats.json as qfilter.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import default_data_dir  # noqa: E402
from eval import tokenize_val  # noqa: E402

CAPTURE = {}


def capture_attention(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    CAPTURE[module.layer_idx] = (query.detach().float(), key.detach().float())
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/velox-ref")
    ap.add_argument("--data", default=default_data_dir())
    ap.add_argument("--windows", type=int, default=20)
    ap.add_argument("--out-json", default="runs/velox-ref/stats.json")
    ap.add_argument("--out-md", default="runs/velox-ref/STATS.md")
    a = ap.parse_args()

    from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer

    AttentionInterface.register("velox_capture", capture_attention)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16,
                                                 attn_implementation="velox_capture").to(dev).eval()
    cfg = model.config
    L, H, KV, D = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rep = H // KV
    seq = 2048
    tokens = tokenize_val(tok, a.data)
    n = min(a.windows, tokens.numel() // seq)
    y = tokens[:n * seq].view(n, seq)
    x = torch.cat([torch.full((n, 1), tok.bos_token_id), y[:, :-1]], 1)

    # rotary tables to undo RoPE for the pre-RoPE key spread
    pos = torch.arange(seq, device=dev)[None]
    cos, sin = model.model.rotary_emb(torch.zeros(1, device=dev, dtype=torch.float32), pos)
    cos, sin = cos[0].float(), sin[0].float()

    def unrotate(k):  # inverse of k*cos + rotate_half(k)*sin
        k1, k2 = k[..., :D // 2], k[..., D // 2:]
        c, s = cos[..., :D // 2], sin[..., :D // 2]
        return torch.cat([k1 * c + k2 * s, k2 * c - k1 * s], -1)

    q0 = 64
    sink = torch.zeros(L, H, dtype=torch.float64)
    sink4 = torch.zeros(L, H, dtype=torch.float64)
    kabs = torch.zeros(L, KV, D, dtype=torch.float64)
    kabs_pre = torch.zeros(L, KV, D, dtype=torch.float64)
    gram = torch.zeros(L, H, D, D, dtype=torch.float64)
    qs_keep = [[[] for _ in range(H)] for _ in range(L)]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=dev).tril()
    with torch.no_grad():
        for w in range(n):
            CAPTURE.clear()
            model(input_ids=x[w:w + 1].to(dev))
            for li in range(L):
                q, k = CAPTURE[li]  # (1, H, T, D), (1, KV, T, D), after RoPE
                q, k = q[0], k[0]
                kabs[li] += k.abs().mean(1).double().cpu()
                kabs_pre[li] += unrotate(k).abs().mean(1).double().cpu()
                for h in range(H):
                    s = (q[h] @ k[h // rep].T) * (D ** -0.5)
                    s = s.masked_fill(~causal, float("-inf"))
                    p = s.softmax(-1)[q0:]
                    sink[li, h] += p[:, 0].mean().item()
                    sink4[li, h] += p[:, :4].sum(-1).mean().item()
                    gram[li, h] += (q[h].T.double() @ q[h].double()).cpu()
                    qs_keep[li][h].append(q[h].cpu())
    sink /= n
    sink4 /= n
    kabs /= n
    kabs_pre /= n

    layers = []
    for li in range(L):
        heads, kvheads, qfilters = [], [], []
        fs = []
        for h in range(H):
            evals, evecs = torch.linalg.eigh(gram[li, h])
            f = evecs[:, -1]
            Q = torch.cat(qs_keep[li][h]).double()
            # Sign as METHODS.md (Q-Filters) says: sgn(1^T f) > 0. The other
            # common choice, a positive mean projection, is kept alongside.
            if f.sum() < 0:
                f = -f
            proj = Q @ f
            cosv = proj / Q.norm(dim=1).clamp_min(1e-12)
            fs.append(f)
            heads.append({
                "head": h, "kv_head": h // rep,
                "sink_mass": round(sink[li, h].item(), 4),
                "sink4_mass": round(sink4[li, h].item(), 4),
                "q_mean_cos_first_sv": round(cosv.mean().item(), 4),
                "q_mean_cos_first_sv_meanproj_sign": round(cosv.mean().item() * (1 if proj.mean() > 0 else -1), 4),
                "q_mean_abs_cos_first_sv": round(cosv.abs().mean().item(), 4),
                "q_energy_first_sv": round((evals[-1] / evals.sum()).item(), 4),
                "q_mean_projection": round(proj.mean().item(), 3),
                "q_mean_norm": round(Q.norm(dim=1).mean().item(), 3),
                "mean_projection_positive": bool(proj.mean() > 0),
            })
        for g in range(KV):
            m = kabs[li, g]
            mp = kabs_pre[li, g]
            top = torch.argsort(m, descending=True)[:4].tolist()
            kvheads.append({
                "kv_head": g,
                "key_channel_spread_max_over_median": round((m.max() / m.median()).item(), 3),
                "key_channel_spread_pre_rope": round((mp.max() / mp.median()).item(), 3),
                "top_channels": top,
                "top_channel_mean_abs": [round(m[c].item(), 3) for c in top],
                "median_channel_mean_abs": round(m.median().item(), 4),
            })
            fg = torch.stack(fs[g * rep:(g + 1) * rep]).mean(0)
            qfilters.append([round(v, 5) for v in (fg / fg.norm()).tolist()])
        layers.append({"layer": li, "heads": heads, "kv_heads": kvheads, "qfilter": qfilters})

    res = {"model": os.path.basename(os.path.normpath(a.model)), "windows": n, "window_tokens": seq,
           "sink_query_positions": f"{q0}..{seq - 1}", "definitions": __doc__.strip(), "layers": layers}
    for p in (a.out_json, a.out_md):
        os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
    with open(a.out_json, "w") as f:
        json.dump(res, f, indent=1)

    md = ["# velox-ref: attention statistics per layer and head", "",
          f"Measured with `tools/train/stats.py` on the first {n} validation windows of {seq} tokens "
          "(<|bos|> + 2047 tokens), bf16 weights, statistics in fp32. Queries and keys are taken after RoPE.",
          "",
          f"- **sink**: mean attention weight on position 0 (<|bos|>) over query positions {q0}..{seq - 1}; "
          "**sink4**: on positions 0..3 together.",
          "- **K spread**: for the kv head that the query head reads, max / median over the 128 channels of "
          "mean |k_c| (after RoPE; before RoPE in brackets); **top ch**: the largest channels.",
          "- **Q cos**: mean cosine between the queries and f, the first right singular vector of the head's "
          "uncentered query matrix, with the sign of METHODS.md (Q-Filters): sgn(1^T f) > 0; a negative value "
          "means the queries point against f; **Q cos+**: the same with f signed so the mean projection is "
          "positive; **Q |cos|**: mean absolute cosine; **Q energy**: s1^2 / sum s_i^2.",
          "", "| layer | head | kv | sink | sink4 | K spread | top ch | Q cos | Q cos+ | Q abs cos | Q energy |",
          "| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for lay in layers:
        for h in lay["heads"]:
            kv = lay["kv_heads"][h["kv_head"]]
            md.append(f"| {lay['layer']} | {h['head']} | {h['kv_head']} | {h['sink_mass']:.3f} | "
                      f"{h['sink4_mass']:.3f} | {kv['key_channel_spread_max_over_median']:.2f} "
                      f"({kv['key_channel_spread_pre_rope']:.2f}) | {', '.join(map(str, kv['top_channels'][:3]))} | "
                      f"{h['q_mean_cos_first_sv']:.3f} | {h['q_mean_cos_first_sv_meanproj_sign']:.3f} | "
                      f"{h['q_mean_abs_cos_first_sv']:.3f} | "
                      f"{h['q_energy_first_sv']:.3f} |")
    md.append("")
    md.append("Per-GQA-group Q-Filters vectors (mean of the group's sign-anchored f, normalized) are in "
              "`stats.json` under `layers[i].qfilter[kv_head]`.")
    with open(a.out_md, "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
