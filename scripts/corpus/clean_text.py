#!/usr/bin/env python3
"""Cleans the document files of one corpus source in place, before `train_gpt tokenize`.

  clean_text.py RULES DIR [--min-bytes N]        RULES: plain, dict or info

GPT-2's tokenizer spends one token per space of indentation (it has no tokens for runs of
spaces), so indented reference text turns into runs of space tokens; and navigation residue
(index entries, menus, tag tables) is text nobody writes. The rules:

  plain  every source: leading spaces and tabs of a line dropped, runs of two or more spaces
         or tabs inside a line made one space, trailing spaces dropped, three or more line
         breaks in a row made two (one blank line)
  dict   plain, and lines made only of bracketed source tags ("[1913 Webster]", "[PJC]",
         "[Webster 1913 Suppl.]") dropped: dictionaries (gcide, devil)
  info   plain, and the residue of GNU Info files (the Python documentation): the tag table
         ("Tag Table:", "Node: ...\\x7f123", "Ref: ...\\x7f123"), index entries
         ("* entry: Node.   (line 12)" and their "(line 12)" continuation lines), menus
         ("* Menu:" and the "* Name::" / "* Name: Node." items after it), heading rules
         ("*****", "=====", "---------- Footnotes ----------") and the "[index ]" and "Detailed Node Listing" markers dropped;
         cross references "*note Label: c5f." kept as "Label"

A document left shorter than --min-bytes (default 64) is deleted. Prints one line: documents
kept and deleted, bytes before and after. Standard library only; bytes that are not UTF-8 pass
through unchanged.
"""
import argparse  # command line
import os  # the document files
import re  # the rules
import sys  # exit with a message

SPACE_RUN = re.compile(rb"[ \t]{2,}")
LEAD = re.compile(rb"^[ \t]+", re.M)
TRAIL = re.compile(rb"[ \t]+$", re.M)
BLANKS = re.compile(rb"\n{3,}")
TAG_LINE = re.compile(rb"^[ \t]*(\[[^\]\n]{1,60}\][ \t]*)+$")
INFO_TAG_TABLE = re.compile(rb"^(Tag Table:|End Tag Table|(Node|Ref): .*\x7f\d+)[ \t]*$")
INFO_INDEX_ENTRY = re.compile(rb"^\* .*:.*\(line +\d+\)[ \t]*$")
INFO_LINE_REF = re.compile(rb"^[ \t]+\(line +\d+\)[ \t]*$")
INFO_MENU_START = re.compile(rb"^\* Menu:")
INFO_MENU_ITEM = re.compile(rb"^\* [^\n]*(::|: [^\n]*\.)[ \t]*$")
INFO_RULE = re.compile(rb"^[ \t]*([*=.\-])\1{2,}( Footnotes \1{3,})?[ \t]*$")
INFO_MARKERS = re.compile(rb"^[ \t]*(\[index \]|\xe2\x80\x94 The Detailed Node Listing \xe2\x80\x94)[ \t]*$")
INFO_NOTE = re.compile(rb"\*[Nn]ote[ \t\n]+([^:*]+?):[ \t\n]*[^.,\n]*([.,])")


def clean_plain(text):
    text = LEAD.sub(b"", text)
    text = SPACE_RUN.sub(b" ", text)
    text = TRAIL.sub(b"", text)
    return BLANKS.sub(b"\n\n", text)


def clean_dict(text):
    lines = [l for l in text.split(b"\n") if not TAG_LINE.match(l)]
    return clean_plain(b"\n".join(lines))


def note_label(m, text):
    """A cross reference "*note Label: c5f." as "Label". Info writes a period or comma after every
    reference; a comma stays, and a period stays where a sentence ends (line end, or a capital next)."""
    label = re.sub(rb"\s+", b" ", m.group(1))
    if m.group(2) == b",":
        return label + b","
    after = text[m.end():m.end() + 4].lstrip(b" ")
    ends = after[:1] in (b"", b"\n") or after[:1].isupper()
    return label + (b"." if ends else b"")


def clean_info(text):
    out, in_menu = [], False
    for line in text.split(b"\n"):
        if INFO_LINE_REF.match(line):  # an index entry's "(line N)" on a line of its own
            if out and out[-1].startswith(b"* "):
                out.pop()
            continue
        if INFO_TAG_TABLE.match(line) or INFO_INDEX_ENTRY.match(line):
            continue
        if INFO_RULE.match(line) or INFO_MARKERS.match(line):
            continue
        if INFO_MENU_START.match(line):
            in_menu = True
            continue
        if in_menu:
            # a menu runs over its items, their indented continuations and blank lines
            if INFO_MENU_ITEM.match(line) or not line.strip() or line[:1] in (b" ", b"\t"):
                continue
            in_menu = False
        out.append(line)
    text = b"\n".join(out)
    text = INFO_NOTE.sub(lambda m: note_label(m, text), text)
    return clean_plain(text)


RULES = {"plain": clean_plain, "dict": clean_dict, "info": clean_info}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rules", choices=sorted(RULES))
    ap.add_argument("dir")
    ap.add_argument("--min-bytes", type=int, default=64, help="delete documents shorter than this after cleaning")
    a = ap.parse_args()
    if not os.path.isdir(a.dir):
        sys.exit("clean_text.py: %s: not a directory" % a.dir)
    clean = RULES[a.rules]
    kept = deleted = before = after = 0
    for name in sorted(os.listdir(a.dir)):
        path = os.path.join(a.dir, name)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            text = f.read()
        before += len(text)
        text = clean(text).strip(b"\n")
        if len(text) < a.min_bytes:
            os.remove(path)
            deleted += 1
            continue
        with open(path, "wb") as f:
            f.write(text + b"\n")
        after += len(text) + 1
        kept += 1
    print("clean_text (%s): %d documents kept, %d deleted, %.1f MB -> %.1f MB (%.0f%%)" % (
        a.rules, kept, deleted, before / 1e6, after / 1e6, 100.0 * after / max(1, before)))


if __name__ == "__main__":
    main()
