"""Shared helpers for the reference-model scripts: corpus reading, special tokens."""
import lzma
import os

DOC_LINE = "<|doc|>"
BOS, EOS, DOC = "<|bos|>", "<|eos|>", "<|doc|>"
SPECIAL_TOKENS = [BOS, EOS, DOC]  # ids 0, 1, 2 in the trained vocabulary

# Llama-3 style pre-tokenization split pattern (used with behavior="isolated").
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def read_documents(path):
    """Return the list of documents of a corpus file (.txt or .txt.xz).

    Documents are separated by a line that holds only ``<|doc|>``. Each
    document keeps its inner newlines; the newline before the separator line
    belongs to the separator and is dropped. Empty documents are skipped.
    """
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    docs, cur = [], []
    for line in text.split("\n"):
        if line == DOC_LINE:
            docs.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    docs.append("\n".join(cur))
    return [d for d in docs if d.strip()]


def default_data_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", ".data"))
