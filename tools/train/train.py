"""Train the velox-ref reference model (a small LlamaForCausalLM) on the packed corpus.

Input: DATA/train.u16 and DATA/val.u16 written by `tokenizer.py encode`.
Every training sequence is 2048 tokens: <|bos|> followed by 2047 tokens cut from
the stream of documents joined by <|doc|>; the targets are the same 2048-token
slice of the stream shifted by one (so each stream token is a target once per
epoch). Epoch e uses a random start offset and a random order of the slices,
both drawn from (seed, e), so the batch of any step is known from the step
number alone and a resumed run sees the same data as an uninterrupted one.

Optimisation: AdamW (fused), linear warmup then cosine decay to min_lr_ratio *
lr, gradient clipping, bf16 autocast on fp32 master weights.

The defaults are the recipe of the shipped model (1600 steps of 32 x 2048
tokens, peak lr 2e-3, 300 warmup steps, cosine to 2% of the peak, weight decay
0.1, seed 1234). With --steps 0 the step count is instead derived from
--time-budget: after a few timed steps the script fixes the number of steps
that fit the budget and logs it; pass that number as --steps to repeat the run.
The validation loss is logged every --eval-every steps (the corpus is small, so
long runs overfit: watch it). --deadline is a hard stop after that many
seconds of training in this process (checkpoint and model are still saved), so
a run can be split over several time-limited jobs with --resume.

A checkpoint (model, optimizer, step, log) is written every --ckpt-every steps
and when training stops; --resume continues from it.
"""
import argparse
import json
import math
import os
import platform
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import default_data_dir  # noqa: E402

BOS_ID, EOS_ID, DOC_ID = 0, 1, 2
# settings that define a run; --resume takes them from the checkpoint
RUN_ARGS = ["seed", "seq", "batch", "time_budget", "lr", "min_lr_ratio", "warmup", "wd", "beta2", "clip", "tiny"]


def model_config(tiny=False):
    from transformers import LlamaConfig

    kw = dict(
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        initializer_range=0.02,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        use_cache=True,
    )
    if tiny:  # for quick checks of the code paths only
        kw.update(hidden_size=128, intermediate_size=256, num_hidden_layers=2, head_dim=32)
    return LlamaConfig(**kw)


def versions():
    import tokenizers
    import transformers

    v = {"python": platform.python_version(), "torch": torch.__version__,
         "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
         "numpy": np.__version__}
    if torch.cuda.is_available():
        v["cuda"] = torch.version.cuda
        v["gpu"] = torch.cuda.get_device_name(0)
    return v


class Batches:
    """Deterministic epoch-shuffled slices of a token stream."""

    def __init__(self, tokens, seq, batch, seed, device):
        self.tokens = tokens
        self.seq, self.batch, self.seed = seq, batch, seed
        self.device = device
        # slices per epoch for the worst start offset, so every epoch has the same length
        self.slices = (tokens.numel() - (seq - 1)) // seq
        self.steps_per_epoch = self.slices // batch
        assert self.steps_per_epoch > 0, "corpus too small for one batch"
        self._epoch, self._perm, self._offset = None, None, 0
        self._ar = torch.arange(seq, device=device)

    def _set_epoch(self, e):
        if self._epoch == e:
            return
        rng = np.random.default_rng([self.seed, e])
        self._offset = int(rng.integers(0, self.seq))
        self._perm = rng.permutation(self.slices)
        self._epoch = e

    def get(self, step):
        e, b = divmod(step, self.steps_per_epoch)
        self._set_epoch(e)
        ids = self._perm[b * self.batch:(b + 1) * self.batch]
        starts = torch.as_tensor(self._offset + ids * self.seq, device=self.device)
        y = self.tokens[starts[:, None] + self._ar[None, :]].long()
        x = torch.empty_like(y)
        x[:, 0] = BOS_ID
        x[:, 1:] = y[:, :-1]
        return x, y


def eval_windows(tokens, ctx):
    """Non-overlapping windows over the first floor(T/2048)*2048 tokens (see eval.py)."""
    n = (tokens.numel() // 2048) * 2048
    y = tokens[:n].view(-1, ctx).long()
    x = torch.empty_like(y)
    x[:, 0] = BOS_ID
    x[:, 1:] = y[:, :-1]
    return x, y


def lr_at(step, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    t = min(t, 1.0)
    return a.lr * (a.min_lr_ratio + (1 - a.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=default_data_dir())
    ap.add_argument("--out", default="models/velox-ref", help="where the final model is saved")
    ap.add_argument("--ckpt-dir", default="runs/velox-ref")
    ap.add_argument("--log", default=None, help="log file (default CKPT_DIR/train_log.txt)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=1600, help="total steps (0: fit to --time-budget)")
    ap.add_argument("--time-budget", type=float, default=440.0, help="seconds of training for --steps 0")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="hard stop after this many seconds of training in this process (0: none)")
    ap.add_argument("--stop-at", type=int, default=0, help="stop (and checkpoint) at this step, for tests")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.02)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="torch.compile the training step (default on)")
    ap.add_argument("--keep-best", action=argparse.BooleanOptionalAction, default=True,
                    help="if the final validation loss is worse than the best periodic one by more than "
                    "0.01, save the best weights instead (reported in the log)")
    ap.add_argument("--tiny", action="store_true", help="tiny model, for checking the code paths")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--ckpt-every", type=int, default=0)
    ap.add_argument("--no-save", action="store_true")
    a = ap.parse_args()

    t_start = time.time()
    os.makedirs(a.ckpt_dir, exist_ok=True)
    ckpt_path = os.path.join(a.ckpt_dir, "ckpt.pt")
    ck = None
    if a.resume:  # the run's defining settings come from the checkpoint
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        for k in RUN_ARGS:
            setattr(a, k, ck["args"][k])
        a.steps = ck["state"]["steps"]
    log_path = a.log or os.path.join(a.ckpt_dir, "train_log.txt")
    logf = open(log_path, "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    from transformers import LlamaForCausalLM

    cfg = model_config(a.tiny)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())

    def load_ids(name):
        ids = np.fromfile(os.path.join(a.data, name), dtype=np.uint16).astype(np.int32)
        return torch.from_numpy(ids).to(dev)

    train_tok, val_tok = load_ids("train.u16"), load_ids("val.u16")
    batches = Batches(train_tok, a.seq, a.batch, a.seed, dev)
    vx, vy = eval_windows(val_tok, a.seq)

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed_tokens" not in name else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, a.beta2), eps=1e-8, fused=dev.type == "cuda")

    def loss_of(x, y):
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            h = model.model(input_ids=x).last_hidden_state
            logits = model.lm_head(h)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))

    step_loss = torch.compile(loss_of) if a.compile else loss_of

    state = {"step": 0, "tokens": 0, "train_seconds": 0.0, "history": [], "val_history": [], "steps": a.steps}
    if ck is not None:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        torch.set_rng_state(ck["rng_cpu"])
        if dev.type == "cuda" and ck.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(ck["rng_cuda"])
        log(f"resumed from {ckpt_path} at step {state['step']} ({state['tokens']} tokens, "
            f"{state['train_seconds']:.1f} s of training so far)")
    else:
        log(f"velox-ref training: {json.dumps(vars(a))}")
        log(f"versions: {json.dumps(versions())}")
        log(f"parameters: {n_params} ({n_params / 1e6:.2f} M, tied embeddings); "
            f"train tokens {train_tok.numel()}, val tokens {val_tok.numel()}, "
            f"{batches.steps_per_epoch} steps per epoch of {a.batch} x {a.seq}")

    def save_ckpt():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state,
                    "rng_cpu": torch.get_rng_state(),
                    "rng_cuda": torch.cuda.get_rng_state() if dev.type == "cuda" else None,
                    "args": vars(a)}, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)

    @torch.no_grad()
    def val_loss():
        model.eval()
        tot, n = 0.0, 0
        for i in range(0, vx.size(0), a.batch):
            xb, yb = vx[i:i + a.batch], vy[i:i + a.batch]
            tot += loss_of(xb, yb).item() * yb.numel()
            n += yb.numel()
        model.train()
        return tot / n

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    model.train()
    tokens_per_step = a.batch * a.seq
    run_t0 = time.time()
    seconds_before = state["train_seconds"]
    timing_from = None  # (step, time) after warm-up of compiled kernels
    acc_loss, acc_n = 0.0, 0
    best = {"val_loss": float("inf"), "step": None, "weights": None}
    stop_reason = "done"
    step = state["step"]
    planned = a.steps if a.steps else 10**9
    while step < planned:
        if a.stop_at and step >= a.stop_at:
            stop_reason = "stop-at"
            break
        if a.deadline and time.time() - run_t0 >= a.deadline:
            stop_reason = "deadline"
            log(f"deadline reached at step {step} ({time.time() - run_t0:.1f} s of training in this process)")
            break
        a.steps = planned if planned < 10**9 else max(step + 1, a.warmup + 1)
        lr = lr_at(step, a)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batches.get(step)
        loss = step_loss(x, y)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        state["step"] = step
        state["tokens"] += tokens_per_step
        acc_loss += loss.detach()
        acc_n += 1

        # derive the step count from the measured speed
        if planned >= 10**9:
            if step == 5:
                sync()
                timing_from = (step, time.time())
            elif step == 25:
                sync()
                per_step = (time.time() - timing_from[1]) / (step - timing_from[0])
                left = a.time_budget - (seconds_before + time.time() - run_t0)
                planned = step + max(1, int(left / per_step))
                state["steps"] = planned
                log(f"measured {per_step * 1000:.1f} ms/step ({tokens_per_step / per_step / 1e6:.2f} M tok/s); "
                    f"total steps fixed at {planned} for a budget of {a.time_budget:.0f} s")
        if step % a.log_every == 0 or step == planned:
            sync()
            el = seconds_before + time.time() - run_t0
            rec = {"step": step, "tokens": state["tokens"], "loss": round((acc_loss / acc_n).item(), 4),
                   "lr": round(lr, 6), "grad_norm": round(float(gn), 3), "seconds": round(el, 1),
                   "epoch": round(state["tokens"] / train_tok.numel(), 2)}
            state["history"].append(rec)
            log(json.dumps(rec))
            acc_loss, acc_n = 0.0, 0
        if (a.eval_every and step % a.eval_every == 0) or step == planned:
            vl = val_loss()
            el = seconds_before + time.time() - run_t0
            state["val_history"].append({"step": step, "tokens": state["tokens"], "val_loss": round(vl, 4),
                                         "val_ppl": round(math.exp(vl), 3), "seconds": round(el, 1)})
            log(json.dumps(state["val_history"][-1]))
            if a.keep_best and vl < best["val_loss"]:
                best.update(val_loss=vl, step=step,
                            weights={k: v.detach().clone() for k, v in model.state_dict().items()})
        if a.ckpt_every and step % a.ckpt_every == 0:
            state["train_seconds"] = seconds_before + time.time() - run_t0
            save_ckpt()

    sync()
    state["steps"] = planned if planned < 10**9 else step
    state["train_seconds"] = seconds_before + time.time() - run_t0
    if step < state["steps"] and stop_reason == "done":
        stop_reason = "interrupted"
    save_ckpt()
    log(f"training stopped ({stop_reason}) at step {step}/{state['steps']}: {state['tokens']} tokens "
        f"({state['tokens'] / train_tok.numel():.2f} epochs), {state['train_seconds']:.1f} s of training, "
        f"process wall {time.time() - t_start:.1f} s; checkpoint {ckpt_path}")

    summary = {
        "seed": a.seed, "versions": versions(), "args": vars(a), "parameters": n_params,
        "step": step, "steps_planned": state["steps"], "tokens_seen": state["tokens"],
        "epochs": round(state["tokens"] / train_tok.numel(), 3), "train_tokens": int(train_tok.numel()),
        "train_seconds": round(state["train_seconds"], 1), "stop_reason": stop_reason,
        "final_val": state["val_history"][-1] if state["val_history"] else None,
        "history": state["history"], "val_history": state["val_history"],
    }
    with open(os.path.join(a.ckpt_dir, "train_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)

    shipped_step = step
    if stop_reason in ("done", "deadline") and not a.no_save:
        last = state["val_history"][-1]["val_loss"] if state["val_history"] else None
        if best["weights"] is not None and last is not None and last > best["val_loss"] + 0.01:
            model.load_state_dict(best["weights"])
            shipped_step = best["step"]
            log(f"final val loss {last:.4f} is worse than {best['val_loss']:.4f} at step {best['step']}: "
                f"saving the weights of step {best['step']}")
        summary["shipped_step"] = shipped_step
        with open(os.path.join(a.ckpt_dir, "train_summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        save_model(model, a.out)
        log(f"saved bf16 model to {a.out}")


def save_model(model, out):
    from transformers import GenerationConfig

    os.makedirs(out, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=[EOS_ID, DOC_ID], pad_token_id=EOS_ID,
        do_sample=False, max_new_tokens=256)
    model.save_pretrained(out, safe_serialization=True)
    write_tokenizer_config(out)


def write_tokenizer_config(out):
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|eos|>",
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, s in enumerate(["<|bos|>", "<|eos|>", "<|doc|>"])
        },
        "extra_special_tokens": {"doc_token": "<|doc|>"},
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
