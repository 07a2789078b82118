#!/usr/bin/env python3
"""Splits a text stream into document files for `train_gpt tokenize` (one file = one document).

  split_text.py OUT_DIR PREFIX [--heading REGEX] [--drop-heading] [--max-bytes N]
                [--min-bytes N] [--strip-re REGEX] < text

A new document starts at every line matching --heading (the line itself opens the new document
unless --drop-heading), and, when a document has grown past --max-bytes, at the next blank line
(so dictionaries and glossaries become documents of a few entries rather than one huge file).
Documents shorter than --min-bytes (after stripping) are dropped. Lines matching --strip-re
are removed (markup noise). Files are written as OUT_DIR/PREFIX_NNNNNN.txt, in order.
Standard library only; bytes that are not UTF-8 pass through unchanged.
"""
import argparse  # command line
import os  # paths
import re  # headings
import sys  # stdin


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("prefix")
    ap.add_argument("--heading", help="regex: a line matching it starts a new document")
    ap.add_argument("--drop-heading", action="store_true", help="leave the heading line out")
    ap.add_argument("--max-bytes", type=int, default=0, help="split at a blank line past this size")
    ap.add_argument("--min-bytes", type=int, default=1, help="drop documents shorter than this")
    ap.add_argument("--strip-re", help="regex: drop lines matching it")
    a = ap.parse_args()
    heading = re.compile(a.heading.encode("utf-8")) if a.heading else None
    strip = re.compile(a.strip_re.encode("utf-8")) if a.strip_re else None
    os.makedirs(a.out_dir, exist_ok=True)
    count = 0
    doc, size = [], 0

    def flush():
        nonlocal doc, size, count
        text = b"".join(doc).strip(b"\n")
        if len(text) >= a.min_bytes:
            with open(os.path.join(a.out_dir, "%s_%06d.txt" % (a.prefix, count)), "wb") as f:
                f.write(text + b"\n")
            count += 1
        doc, size = [], 0

    for line in sys.stdin.buffer:
        if strip and strip.search(line):
            continue
        if heading and heading.search(line):
            flush()
            if a.drop_heading:
                continue
        elif a.max_bytes and size >= a.max_bytes and not line.strip():
            flush()
            continue
        doc.append(line)
        size += len(line)
    flush()
    print("%s: %d documents" % (a.prefix, count), file=sys.stderr)


if __name__ == "__main__":
    main()
