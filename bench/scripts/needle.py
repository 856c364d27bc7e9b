"""Needle retrieval under eviction: can the model still copy a number it read
long ago when the cache keeps only part of the context?

    python3 bench/scripts/needle.py phrasings VAL OUT.jsonl [--trials N]
    python3 bench/scripts/needle.py grid VAL OUT.jsonl [--phrasing P] [--trials N]
        [--budgets 512,256,1024] [--policies "streaming h2o ..."] [--bases fp16]
        [--adakv "h2o snapkv qfilters"] [--filters models/velox-ref/qfilters.bin]

A trial: a made-up key sentence ("The secret number of Nora Vasquez is
482913.", stated twice in a row with the default phrasing "twice") is put at a random depth (between 5 % and 95 % of the lines) into
1500-1900 tokens of real prose cut from the held-out text VAL (whole lines,
starting at a random line; <|doc|> separators become blank lines), and a
question at the end asks for the number. `veloxquant generate --temp 0`
(greedy) continues the prompt; the trial passes when the first number of
the continuation is exactly the needle's. Trial i uses seed SEED + i for
the needle, the depth and the filler, so every spec sees the same prompts.

phrasings: the forms below with an fp16 cache and no eviction, to pick the
one the model passes most often (velox-ref: "twice", 10 of 20). grid: one phrasing, the fp16 and
KIVI-2 baselines without eviction, then every policy at every budget.
One JSON line per trial. Needs the `tokenizers` package to count tokens.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer

FIRST = ["Nora", "Tobias", "Ilse", "Marek", "Odile", "Casimir", "Yara", "Leopold", "Brina", "Anselm", "Theda", "Rufus",
         "Maelle", "Quentin", "Signe", "Dorian"]
LAST = ["Vasquez", "Holloway", "Brandt", "Okafor", "Lindqvist", "Moreau", "Kessler", "Atwood", "Petrakis", "Farrow",
        "Ishikawa", "Delacroix", "Norberg", "Quill", "Sandoval", "Ventris"]
# (needle sentence, question) pairs; the question ends where the number
# should come, so a base model can answer by copying (induction)
PHRASINGS = {
    "repeat": ("The secret number of {name} is {number}.", "\n\nThe secret number of {name} is"),
    "qa": ("The secret number of {name} is {number}.",
           "\n\nQuestion: What is the secret number of {name}?\nAnswer: The secret number of {name} is"),
    "recall": ("The secret number of {name} is {number}.", "\n\nAs stated above, the secret number of {name} is"),
    "twice": ("The secret number of {name} is {number}. Again, the secret number of {name} is {number}.",
              "\n\nThe secret number of {name} is"),
    "keyvalue": ("{name}'s secret number: {number}.", "\n\n{name}'s secret number:"),
}
MODEL = "models/velox-ref"


def filler_lines(val_path):
    text = open(val_path, encoding="utf-8").read().replace("<|doc|>", "\n\n")
    return text.split("\n")


def make_trial(lines, tok, seed, phrasing):
    rnd = random.Random(seed)
    name = f"{rnd.choice(FIRST)} {rnd.choice(LAST)}"
    number = rnd.randint(100000, 999999)
    target = rnd.randint(1500, 1900)
    start = rnd.randrange(len(lines))
    chosen, count, i = [], 0, start
    while count < target:
        line = lines[i % len(lines)]
        # counted line by line (with its newline): the pre-tokenizer splits at
        # line ends, so the sum is the prompt's count up to a token or two
        count += len(tok.encode(line + "\n", add_special_tokens=False).ids)
        chosen.append(line)
        i += 1
    depth = rnd.uniform(0.05, 0.95)
    at = max(1, round(depth * len(chosen)))
    needle, question = PHRASINGS[phrasing]
    body = chosen[:at] + [needle.format(name=name, number=number)] + chosen[at:]
    prompt = "\n".join(body) + question.format(name=name)
    return {"seed": seed, "name": name, "number": number, "depth": round(at / len(chosen), 4),
            "filler_tokens": count}, prompt


def run_generate(vq, spec, prompt, threads):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(prompt)
        path = f.name
    try:
        p = subprocess.run([vq, "generate", "-m", MODEL, "-f", path, "-n", "8", "--temp", "0", "--kv", spec,
                            "--threads", str(threads)], capture_output=True, text=True)
    finally:
        os.unlink(path)
    if p.returncode != 0:
        return None, None, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
    out = p.stdout
    cont = out[len(prompt):] if out.startswith(prompt) else out
    m = re.search(r"prompt: (\d+) tokens", p.stderr)
    return cont.rstrip("\n"), int(m.group(1)) if m else None, None


def trial_row(vq, spec, phase, phrasing, lines, tok, seed, threads):
    info, prompt = make_trial(lines, tok, seed, phrasing)
    cont, n_prompt, err = run_generate(vq, spec, prompt, threads)
    row = {"phase": phase, "phrasing": phrasing, "spec": spec, **info, "prompt_tokens": n_prompt}
    if err:
        row.update({"error": err, "pass": False})
    else:
        m = re.match(r"\s*(\d+)", cont)
        row.update({"continuation": cont, "pass": bool(m) and int(m.group(1)) == info["number"]})
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["phrasings", "grid"])
    ap.add_argument("val")
    ap.add_argument("out")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--phrasing", choices=sorted(PHRASINGS), default="twice")
    ap.add_argument("--budgets", default="512,256,1024")
    ap.add_argument("--policies", default="streaming h2o tova keyformer snapkv pyramidkv knorm qfilters")
    ap.add_argument("--bases", default="fp16")
    ap.add_argument("--adakv", default="h2o snapkv qfilters")
    ap.add_argument("--filters", default=f"{MODEL}/qfilters.bin")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vq", default=os.environ.get("VQ", "./build/veloxquant"))
    a = ap.parse_args()
    tok = Tokenizer.from_file(f"{MODEL}/tokenizer.json")
    lines = filler_lines(a.val)
    done = set()
    if os.path.exists(a.out):  # resume: skip trials already written
        for line in open(a.out):
            r = json.loads(line)
            if "error" not in r:  # a failed spec (e.g. a policy not built yet) is tried again
                done.add((r["phase"], r["phrasing"], r["spec"], r["seed"]))
    jobs = []
    if a.mode == "phrasings":
        jobs = [("phrasings", ph, "fp16") for ph in sorted(PHRASINGS)]
    else:
        specs = ["fp16", "kivi:bits=2"]
        for b in a.budgets.split(","):
            for base in a.bases.split():
                for p in a.policies.split():
                    o = f"budget={b}" + (f",filters={a.filters}" if p == "qfilters" else "")
                    specs.append(f"{base}+{p}:{o}")
            for p in a.adakv.split():
                o = f"budget={b}" + (f",filters={a.filters}" if p == "qfilters" else "") + ",adakv=1"
                specs.append(f"fp16+{p}:{o}")
        jobs = [("grid", a.phrasing, s) for s in specs]
    with open(a.out, "a") as out:
        for phase, ph, spec in jobs:
            ok = n = 0
            for i in range(a.trials):
                seed = a.seed + i
                if (phase, ph, spec, seed) in done:
                    continue
                row = trial_row(a.vq, spec, phase, ph, lines, tok, seed, a.threads)
                out.write(json.dumps(row) + "\n")
                out.flush()
                ok += row["pass"]
                n += 1
                if "error" in row:
                    print(f"{spec}: {row['error']}", file=sys.stderr)
                    break
            print(f"{phase} {ph} {spec}: {ok}/{n}", file=sys.stderr)


if __name__ == "__main__":
    main()
