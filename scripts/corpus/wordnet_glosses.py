#!/usr/bin/env python3
"""Prints WordNet's synsets as English sentences, "words (part of speech): gloss", one a line,
with a blank line after every GROUP synsets (so split_text.py can cut documents there).

  wordnet_glosses.py WORDNET_DIR [GROUP] > glosses.txt

WORDNET_DIR holds data.noun, data.verb, data.adj, data.adv (Debian's wordnet-base puts them
in usr/share/wordnet). Line format of those files (wndb(5)): synset_offset lex_filenum ss_type
w_cnt(hex) word lex_id [word lex_id ...] p_cnt [pointers...] [frames...] | gloss
Standard library only.
"""
import os  # paths
import sys  # argv, stdout

PARTS = [("noun", "noun"), ("verb", "verb"), ("adj", "adjective"), ("adv", "adverb")]


def main():
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    wn = sys.argv[1]
    group = int(sys.argv[2]) if len(sys.argv) == 3 else 200
    out = sys.stdout
    n = 0
    for suffix, pos in PARTS:
        with open(os.path.join(wn, "data." + suffix), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("  "):  # the license header
                    continue
                head, sep, gloss = line.partition(" | ")
                if not sep:
                    continue
                fields = head.split()
                w_cnt = int(fields[3], 16)
                words = [fields[4 + 2 * i].replace("_", " ") for i in range(w_cnt)]
                # Adjective markers such as "(a)" or "(p)" are glued to the word: drop them.
                words = [w.split("(")[0] for w in words]
                out.write("%s (%s): %s\n" % (", ".join(words), pos, gloss.strip()))
                n += 1
                if n % group == 0:
                    out.write("\n")


if __name__ == "__main__":
    main()
