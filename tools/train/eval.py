"""Validation perplexity and sample continuations of a saved model, with transformers.

Perplexity protocol (the same for every context length C):
  * val.txt.xz is split into documents; each is tokenized with the model's own
    tokenizer without special tokens and the documents are joined with <|doc|>
    into one stream of T tokens;
  * only the first floor(T / 2048) * 2048 tokens are used, so that C = 512 and
    C = 2048 score exactly the same tokens;
  * they are cut into non-overlapping windows of C tokens; the model reads
    <|bos|> followed by the first C - 1 tokens of a window and predicts all C
    tokens of the window (so the first token of every window is predicted from
    <|bos|> alone, as in training);
  * perplexity = exp(mean negative log-likelihood over all scored tokens).
Contexts longer than the training length (e.g. 4096) use floor(T / C) * C tokens.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import default_data_dir, read_documents  # noqa: E402

PROMPTS = [
    "The kernel uses a red-black tree to",
    "To create a new table in PostgreSQL, use the",
    "In Python, a generator is a function that",
    "The borrow checker in Rust ensures that",
    "When a process calls fork(), the child process",
    "Django's ORM lets you",
]


def tokenize_val(tok, data_dir):
    docs = read_documents(os.path.join(data_dir, "val.txt.xz"))
    doc_id = tok.convert_tokens_to_ids("<|doc|>")
    tok.model_max_length = 10**9  # documents are longer than the model's context; only ids are needed
    ids = []
    for i, enc in enumerate(tok(docs, add_special_tokens=False)["input_ids"]):
        if i:
            ids.append(doc_id)
        ids.extend(enc)
    return torch.tensor(ids, dtype=torch.long)


@torch.no_grad()
def perplexity(model, tokens, ctx, batch, bos_id, dev):
    unit = 2048 if ctx <= 2048 else ctx
    n = (tokens.numel() // unit) * unit
    y = tokens[:n].view(-1, ctx)
    x = torch.empty_like(y)
    x[:, 0] = bos_id
    x[:, 1:] = y[:, :-1]
    nll_sum = torch.zeros(ctx, dtype=torch.float64, device=dev)
    for i in range(0, y.size(0), batch):
        xb, yb = x[i:i + batch].to(dev), y[i:i + batch].to(dev)
        logits = model(input_ids=xb).logits.float()
        nll = F.cross_entropy(logits.view(-1, logits.size(-1)), yb.reshape(-1), reduction="none")
        nll_sum += nll.view(yb.shape).double().sum(0)
    per_pos = nll_sum / y.size(0)
    res = {"context": ctx, "windows": int(y.size(0)), "tokens_scored": int(n),
           "nll": round(per_pos.mean().item(), 5), "ppl": round(math.exp(per_pos.mean().item()), 3)}
    edges = [0, 64, 512, 1024, 2048, 4096]
    buckets = {}
    for lo, hi in zip(edges[:-1], edges[1:]):
        if lo < ctx:
            buckets[f"{lo}-{min(hi, ctx) - 1}"] = round(math.exp(per_pos[lo:min(hi, ctx)].mean().item()), 3)
    res["ppl_by_position"] = buckets
    return res


@torch.no_grad()
def samples(model, tok, dev, max_new=80, seed=1234):
    out = []
    for p in PROMPTS:
        enc = tok(p, return_tensors="pt").to(dev)  # <|bos|> is prepended by the tokenizer
        g = model.generate(**enc, max_new_tokens=max_new, do_sample=False)
        greedy = tok.decode(g[0, enc["input_ids"].size(1):], skip_special_tokens=False)
        torch.manual_seed(seed)
        s = model.generate(**enc, max_new_tokens=max_new, do_sample=True, temperature=0.7, top_p=0.9)
        sampled = tok.decode(s[0, enc["input_ids"].size(1):], skip_special_tokens=False)
        out.append({"prompt": p, "greedy": greedy, "sampled_t0.7_p0.9": sampled})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/velox-ref")
    ap.add_argument("--data", default=default_data_dir())
    ap.add_argument("--ctx", type=int, nargs="+", default=[512, 2048, 4096])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", default="runs/velox-ref/eval.json")
    ap.add_argument("--samples-md", default="runs/velox-ref/samples.md")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-samples", action="store_true")
    a = ap.parse_args()

    import tokenizers
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="sdpa").to(dev)
    model.eval()
    tokens = tokenize_val(tok, a.data)
    cached = os.path.join(a.data, "val.u16")
    same = None
    if os.path.exists(cached):
        ref = torch.from_numpy(np.fromfile(cached, dtype=np.uint16).astype(np.int64))
        same = bool(ref.numel() == tokens.numel() and torch.equal(ref, tokens))
    res = {"model": os.path.basename(os.path.normpath(a.model)), "weights": "bf16", "val_tokens": int(tokens.numel()),
           "val_ids_match_training_encoding": same, "protocol": __doc__.split("Perplexity protocol")[1].strip(),
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "tokenizers": tokenizers.__version__},
           "seed": a.seed, "perplexity": []}
    for c in a.ctx:
        r = perplexity(model, tokens, c, a.batch if c <= 2048 else max(1, a.batch // 2), tok.bos_token_id, dev)
        print(json.dumps(r), flush=True)
        res["perplexity"].append(r)
    if not a.no_samples:
        res["samples"] = samples(model, tok, dev, seed=a.seed)
        with open(a.samples_md, "w") as f:
            f.write("# Sample continuations\n\nGreedy decoding and sampling (temperature 0.7, top-p 0.9, "
                    f"seed {a.seed}), 80 new tokens, bf16 weights, <|bos|> prepended to the prompt.\n\n")
            for s in res["samples"]:
                f.write(f"## {s['prompt']}\n\n**greedy:** {s['prompt']}{s['greedy']}\n\n"
                        f"**sampled:** {s['prompt']}{s['sampled_t0.7_p0.9']}\n\n")
    res["seconds"] = round(time.time() - t0, 1)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"eval written to {a.out} ({res['seconds']} s); val ids match training encoding: {same}")


if __name__ == "__main__":
    main()
