#!/usr/bin/env python3
"""compare_tables.py: the numbers of several runs' markdown tables side by side.

  python3 dev/compare_tables.py LABEL=FILE [LABEL=FILE ...]

Each FILE is a benchmark's output, e.g. the summary.txt of `bash scripts/gpu.sh bench AREA`
(dev/ab_refs.sh passes one per version of the code). Every markdown table in it (a header row
`| a | b | ... |`, a `|---|` rule, then its rows) is keyed by its header and its place among the
tables with that header, and each row by its first cell. For every table and every column that
holds numbers, one table follows: a row per row label, every run's number, then each other run's
ratio to the first, so a change is read as a ratio against the base measured in the same call. A
cell's number is its first number ("612.3 (1.36x)" -> 612.3); cells without one show as "-".
"""
import re
import sys

NUMBER = re.compile(r"^[*`\s]*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(path):
    """{(header, n): {row label: [cells]}} and the headers' columns, in file order."""
    lines = open(path, errors="replace").read().splitlines() + [""]
    rule = lambda l: re.match(r"^\s*\|[\s:|-]+\|?\s*$", l) is not None
    starts = lambda j: lines[j].lstrip().startswith("|") and rule(lines[j + 1])  # a header row
    out, columns, seen = {}, {}, {}
    i = 0
    while i + 1 < len(lines):
        if starts(i):
            head = cells(lines[i])
            key = (" | ".join(head), seen.get(" | ".join(head), 0))
            seen[key[0]] = key[1] + 1
            rows = {}
            j = i + 2
            while j + 1 < len(lines) and lines[j].lstrip().startswith("|") and not starts(j):
                r = cells(lines[j])
                rows.setdefault(r[0], r)
                j += 1
            out[key], columns[key] = rows, head
            i = j
        else:
            i += 1
    return out, columns


def number(cell):
    m = NUMBER.match(cell)
    return float(m.group(1)) if m else None


def main(argv):
    if not argv or any("=" not in a for a in argv):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    runs = []
    for a in argv:
        label, path = a.split("=", 1)
        try:
            runs.append((label, *tables(path)))
        except OSError as e:
            print(f"compare_tables.py: {label}: {e}", file=sys.stderr)
            runs.append((label, {}, {}))
    keys, heads = [], {}
    for _, t, cols in runs:
        for k in t:
            if k not in heads:
                keys.append(k)
                heads[k] = cols[k]
    if not keys:
        print("compare_tables.py: no markdown table in any of the files")
        return 1
    labels = [r[0] for r in runs]
    for k in keys:
        head = heads[k]
        row_names = []
        for _, t, _ in runs:
            for name in t.get(k, {}):
                if name not in row_names:
                    row_names.append(name)
        for c in range(1, len(head)):
            vals = {name: [None if c >= len(t.get(k, {}).get(name, [])) else number(t[k][name][c]) for _, t, _ in runs]
                    for name in row_names}
            if not any(v is not None for vs in vals.values() for v in vs):
                continue  # a column of words
            print(f"\n{head[c]}   (table | {k[0]} |{' #%d' % (k[1] + 1) if k[1] else ''})")
            print(f"| {head[0]} | " + " | ".join(labels) + " | " + " | ".join(f"{l} / {labels[0]}" for l in labels[1:]) + " |")
            print("|---|" + "---|" * (2 * len(labels) - 1))
            for name in row_names:
                v = vals[name]
                ratios = ["-" if x is None or not v[0] else f"{x / v[0]:.3f}" for x in v[1:]]
                print(f"| {name} | " + " | ".join("-" if x is None else f"{x:g}" for x in v) + " | " + " | ".join(ratios) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
