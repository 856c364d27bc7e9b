"""Train the byte-level BPE tokenizer of the reference model and tokenize the corpus.

    python tokenizer.py train  --data DIR --out models/velox-ref/tokenizer.json
    python tokenizer.py encode --data DIR --tokenizer models/velox-ref/tokenizer.json

`train` learns a vocabulary of 8192 ids: the special tokens <|bos|>=0,
<|eos|>=1, <|doc|>=2, the 256 byte symbols, then the merges. Its
post-processor puts <|bos|> in front of a text when special tokens are added.
`encode` writes DIR/train.u16 and DIR/val.u16: every document encoded on its
own (no special tokens added) and the documents joined by the <|doc|> id.
"""
import argparse
import json
import os
import sys

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BOS, DOC, SPECIAL_TOKENS, SPLIT_PATTERN, default_data_dir, read_documents  # noqa: E402

VOCAB_SIZE = 8192


def build_empty_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train(data_dir, out_path, vocab_size=VOCAB_SIZE):
    docs = read_documents(os.path.join(data_dir, "train.txt.xz"))
    tok = build_empty_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    # With add_special_tokens=True (the transformers default) a text gets <|bos|> in
    # front, which is how every training sequence starts. Corpus encoding below
    # passes add_special_tokens=False.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS}:1 $B:1",
        special_tokens=[(BOS, tok.token_to_id(BOS))])
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tok.save(out_path)
    print(f"tokenizer: {len(docs)} training documents, vocab {tok.get_vocab_size()} -> {out_path}")


def encode_split(tok, path):
    docs = read_documents(path)
    doc_id = tok.token_to_id(DOC)
    encs = tok.encode_batch(docs, add_special_tokens=False)
    total = sum(len(e.ids) for e in encs) + len(encs) - 1
    out = np.empty(total, dtype=np.uint16)
    pos = 0
    for i, e in enumerate(encs):
        if i:
            out[pos] = doc_id
            pos += 1
        out[pos:pos + len(e.ids)] = e.ids
        pos += len(e.ids)
    assert pos == total
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    return out, len(docs), nbytes


def encode(data_dir, tok_path):
    tok = Tokenizer.from_file(tok_path)
    info = {}
    for split in ("train", "val"):
        ids, ndocs, nbytes = encode_split(tok, os.path.join(data_dir, f"{split}.txt.xz"))
        ids.tofile(os.path.join(data_dir, f"{split}.u16"))
        info[split] = {"documents": ndocs, "tokens": int(ids.size), "utf8_bytes": nbytes,
                       "bytes_per_token": round(nbytes / ids.size, 3)}
        print(f"{split}: {ndocs} documents, {ids.size} tokens, {nbytes / ids.size:.3f} bytes/token")
    with open(os.path.join(data_dir, "tokens.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["train", "encode"])
    ap.add_argument("--data", default=default_data_dir())
    ap.add_argument("--out", default="models/velox-ref/tokenizer.json")
    ap.add_argument("--tokenizer", default="models/velox-ref/tokenizer.json")
    a = ap.parse_args()
    if a.cmd == "train":
        train(a.data, a.out)
    else:
        encode(a.data, a.tokenizer)


if __name__ == "__main__":
    main()
