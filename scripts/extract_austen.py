#!/usr/bin/env python3
"""Extracts Jane Austen's six novels from Debian's r-cran-janeaustenr package as plain text,
one file per chapter, without R.

The package keeps its data as an R lazy-load database (data/Rdata.rdx + data/Rdata.rdb):
  - Rdata.rdx is a gzip-compressed R serialization of a list whose "variables" element maps
    each object name to (offset, length) of its chunk inside Rdata.rdb;
  - each chunk is a 4-byte big-endian uncompressed length followed by a zlib stream (or, for
    databases built with bzip2/xz, a type byte '2'/'X'/'Z'/'0' and then the stream);
  - each decompressed chunk is an R serialization ("X\\n", XDR: big-endian) of one object,
    here a character vector (STRSXP) holding one line of the novel per element.
This script parses just enough of R's serialization format to walk those objects (it skips
everything it does not need) and writes each novel split into chapters.

Usage:
  scripts/extract_austen.py PACKAGE_ROOT OUT_DIR
    PACKAGE_ROOT  the directory the .deb was unpacked into (dpkg -x), or the installed
                  janeaustenr library directory itself (the one holding data/Rdata.rdx)
    OUT_DIR       receives NN_<novel>_chNNN.txt (NN: publication order, NNN: chapter number
                  within the novel; the title page goes with chapter 1)
Standard library only.
"""
import bz2  # rdb chunks compressed with bzip2 (type '2')
import gzip  # the .rdx index
import lzma  # rdb chunks compressed with xz (type 'X')
import os  # paths
import re  # chapter headings
import struct  # XDR integers and doubles
import sys  # argv, exit
import zlib  # rdb chunks compressed with zlib (the default)

# The novels in publication order: (object name in the package, file stem).
NOVELS = [
    ("sensesensibility", "sense_and_sensibility"),
    ("prideprejudice", "pride_and_prejudice"),
    ("mansfieldpark", "mansfield_park"),
    ("emma", "emma"),
    ("northangerabbey", "northanger_abbey"),
    ("persuasion", "persuasion"),
]

# R SEXP type codes that the walker has to understand (from R's Rinternals.h / serialize.c).
NILSXP, SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 0, 1, 2, 3, 4, 5, 6
SPECIALSXP, BUILTINSXP, CHARSXP, LGLSXP, INTSXP, REALSXP = 7, 8, 9, 10, 13, 14
CPLXSXP, STRSXP, DOTSXP, VECSXP, EXPRSXP, RAWSXP, S4SXP = 15, 16, 17, 19, 20, 24, 25
EXTPTRSXP, WEAKREFSXP, BCODESXP = 22, 23, 21
# Pseudo-types that only exist in the serialized stream.
REFSXP, NILVALUE_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP, MISSINGARG_SXP = 255, 254, 253, 252, 251
BASENAMESPACE_SXP, NAMESPACESXP, PACKAGESXP, PERSISTSXP = 250, 249, 248, 247
EMPTYENV_SXP, BASEENV_SXP, ATTRLANGSXP, ATTRLISTSXP, ALTREP_SXP = 242, 241, 240, 239, 238


class RReader:
    """Reads one XDR R serialization into Python values: character vectors become lists of
    str (None for NA), other vectors lists of numbers, pairlists dicts tagged by name."""

    def __init__(self, data):
        self.d = data
        self.p = 0
        self.refs = []  # the reference table: symbols and environments, in order of appearance
        if data[:2] != b"X\n":
            raise ValueError("not an XDR R serialization (format %r)" % data[:2])
        self.p = 2
        version = self.int()
        self.int()  # writer's R version
        self.int()  # oldest R version that can read it
        if version == 3:
            n = self.int()
            self.p += n  # the writer's native encoding name
        elif version != 2:
            raise ValueError("unsupported serialization version %d" % version)

    def int(self):
        v = struct.unpack_from(">i", self.d, self.p)[0]
        self.p += 4
        return v

    def length(self):
        n = self.int()
        if n == -1:  # long vector: two more ints, upper and lower halves
            hi, lo = self.int(), self.int()
            n = (hi << 32) + (lo & 0xFFFFFFFF)
        return n

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        has_attr = flags & (1 << 9)
        has_tag = flags & (1 << 10)
        if t in (NILVALUE_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP, MISSINGARG_SXP,
                 BASENAMESPACE_SXP, EMPTYENV_SXP, BASEENV_SXP):
            return None
        if t == REFSXP:
            idx = flags >> 8
            if idx == 0:
                idx = self.int()
            return self.refs[idx - 1]
        if t in (NAMESPACESXP, PACKAGESXP, PERSISTSXP):
            if self.int() != 0:
                raise ValueError("unexpected string-vector flag")
            names = [self.item() for _ in range(self.int())]
            self.refs.append(("namespace", names))
            return self.refs[-1]
        if t == SYMSXP:
            name = self.item()  # a CHARSXP
            self.refs.append(("symbol", name))
            return self.refs[-1]
        if t == ENVSXP:
            self.int()  # locked
            env = {}
            self.refs.append(env)
            env["enclos"] = self.item()
            env["frame"] = self.item()
            env["hashtab"] = self.item()
            env["attrib"] = self.item()
            return env
        if t in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP, ATTRLANGSXP, ATTRLISTSXP):
            # A pairlist is read iteratively along its CDR chain to keep recursion shallow.
            out = {}
            pos = 0
            while True:
                attr = self.item() if has_attr else None
                tag = self.item() if has_tag else None
                car = self.item()
                key = tag[1] if isinstance(tag, tuple) and tag[0] == "symbol" else pos
                out[key] = car
                pos += 1
                flags = self.int()
                t = flags & 0xFF
                has_attr = flags & (1 << 9)
                has_tag = flags & (1 << 10)
                if t not in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP, ATTRLANGSXP, ATTRLISTSXP):
                    self.p -= 4  # the CDR is not a pairlist cell: read it as an item
                    self.item()
                    return out
        if t in (SPECIALSXP, BUILTINSXP):
            n = self.int()
            name = self.d[self.p:self.p + n].decode("latin-1")
            self.p += n
            return ("builtin", name)
        if t == CHARSXP:
            n = self.int()
            if n == -1:
                return None  # NA_character_
            raw = self.d[self.p:self.p + n]
            self.p += n
            return raw.decode("utf-8", errors="surrogateescape")
        if t == ALTREP_SXP:
            info, state, attr = self.item(), self.item(), self.item()
            return ("altrep", info, state, attr)
        if t in (LGLSXP, INTSXP):
            n = self.length()
            v = list(struct.unpack_from(">%di" % n, self.d, self.p))
            self.p += 4 * n
        elif t == REALSXP:
            n = self.length()
            v = list(struct.unpack_from(">%dd" % n, self.d, self.p))
            self.p += 8 * n
        elif t == CPLXSXP:
            n = self.length()
            v = list(struct.unpack_from(">%dd" % (2 * n), self.d, self.p))
            self.p += 16 * n
        elif t in (STRSXP, VECSXP, EXPRSXP):
            n = self.length()
            v = [self.item() for _ in range(n)]
        elif t == RAWSXP:
            n = self.length()
            v = self.d[self.p:self.p + n]
            self.p += n
        elif t == S4SXP:
            v = ("s4",)
        else:
            raise ValueError("unsupported R type %d at byte %d" % (t, self.p - 4))
        if has_attr:
            attrs = self.item()
            if isinstance(attrs, dict) and isinstance(v, list) and "names" in attrs:
                return dict(zip(attrs["names"], v))
        return v


def unpack_chunk(chunk):
    """One lazy-load chunk: 4-byte uncompressed length, then (optionally typed) stream."""
    size = struct.unpack(">I", chunk[:4])[0]
    body = chunk[4:]
    if body[:1] == b"x":  # plain zlib (R's compress = 1): the stream starts with 0x78
        out = zlib.decompress(body)
    elif body[:1] == b"Z":
        out = zlib.decompress(body[1:])
    elif body[:1] == b"2":
        out = bz2.decompress(body[1:])
    elif body[:1] == b"X":
        out = lzma.decompress(body[1:])
    elif body[:1] == b"0":
        out = body[1:]
    else:
        raise ValueError("unknown chunk compression %r" % body[:1])
    if len(out) != size:
        raise ValueError("chunk length %d, header says %d" % (len(out), size))
    return out


def find_data_dir(root):
    for dirpath, _, files in os.walk(root):
        if "Rdata.rdx" in files and "Rdata.rdb" in files and "janeaustenr" in dirpath:
            return dirpath
    raise SystemExit("extract_austen: no janeaustenr data/Rdata.rdx under %s" % root)


# A chapter heading is a line of its own: "CHAPTER 1", "Chapter XII", "CHAPTER I." ...
CHAPTER = re.compile(r"^\s*chapter\s+([0-9]+|[ivxlc]+)\.?\s*$", re.IGNORECASE)


def split_chapters(lines):
    """Groups lines into chapters; text before the first heading joins chapter 1."""
    chapters, cur, seen = [], [], False
    for line in lines:
        if CHAPTER.match(line):
            if seen:
                chapters.append(cur)
                cur = []
            seen = True
        cur.append(line)
    chapters.append(cur)
    return chapters


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    root, out = sys.argv[1], sys.argv[2]
    ddir = find_data_dir(root)
    index = RReader(gzip.open(os.path.join(ddir, "Rdata.rdx")).read()).item()
    variables = index["variables"]
    with open(os.path.join(ddir, "Rdata.rdb"), "rb") as f:
        rdb = f.read()
    os.makedirs(out, exist_ok=True)
    total = 0
    for num, (name, stem) in enumerate(NOVELS, 1):
        if name not in variables:
            raise SystemExit("extract_austen: %s not in the package (has %s)"
                             % (name, ", ".join(variables)))
        offset, length = variables[name]
        lines = RReader(unpack_chunk(rdb[offset:offset + length])).item()
        lines = ["" if s is None else s for s in lines]
        chapters = split_chapters(lines)
        for c, chapter in enumerate(chapters, 1):
            text = "\n".join(chapter).strip("\n") + "\n"
            path = os.path.join(out, "%02d_%s_ch%03d.txt" % (num, stem, c))
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(text)
        total += len(chapters)
        print("%-22s %6d lines %4d chapters" % (stem, len(lines), len(chapters)))
    print("%d chapter files in %s" % (total, out))


if __name__ == "__main__":
    main()
