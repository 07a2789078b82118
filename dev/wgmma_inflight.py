#!/usr/bin/env python3
"""wgmma_inflight.py: instructions that overwrite the registers an in-flight wgmma still reads.

  bash dev/sass.sh dump DIR attention/fwd_bf16.cu ...    then    python3 dev/wgmma_inflight.py DIR/*.sass
  cuobjdump -sass OBJ.o > K.sass                          then    python3 dev/wgmma_inflight.py K.sass

A wgmma whose A operand is in registers (HGMMA or QGMMA with R<n> as its second operand: four
registers) reads them until a wait retires its group (`WARPGROUP.DEPBAR.LE gsb0, 0xN`: every
committed group but the N most recent; a group ends at the wgmma marked gsb0). An instruction in
between that writes one of them corrupts the product on the hardware, yet every CPU-side check of
the SASS passes. This lists, per kernel that has register-A wgmmas, how many there are and every write to
their registers before the wait. Program order across branches is an approximation: a hit is a lead
to read in the SASS, not a proof. Input: dev/sass.sh's dumps (a kernel a file, named by the file) or
cuobjdump/nvdisasm listings (kernels headed by "Function :" or ".text.<name>:"). Exit status 1 when a
kernel has a hit.
"""
import os
import re
import sys

# opcodes that write no general register (stores, barriers, branches, the wgmma machinery)
NOWRITE = ("ST", "RED", "BAR", "BRA", "EXIT", "WARPGROUP", "HGMMA", "QGMMA", "NOP", "CALL", "RET", "BSYNC",
           "BSSY", "DEPBAR", "MEMBAR", "FENCE", "SYNCS", "ARRIVES", "WARPSYNC", "YIELD", "LDGDEPBAR", "LDGSTS")
INSN = re.compile(r"^\s*(?:/\*([0-9a-f]+)\*/)?\s*(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
HEAD = re.compile(r"Function : (\S+)|^\.text\.(\S+):")


def kernels(path):
    """(name, [(position, opcode, operands)]) per kernel of one listing."""
    name, body, out = os.path.basename(path).rsplit(".", 1)[0], [], []
    for line in open(path, errors="replace"):
        m = HEAD.search(line)
        if m:
            if body:
                out.append((name, body))
            name, body = m.group(1) or m.group(2), []
            continue
        m = INSN.match(line)
        if m:
            pos = m.group(1) or str(len(body))
            body.append((pos, m.group(3), [a.strip() for a in m.group(4).split(",")]))
    if body:
        out.append((name, body))
    return out


def scan(body):
    """The register-A wgmmas of one kernel and the writes to their registers while in flight."""
    live, hits, n_rs = {}, [], 0  # live: register -> (its wgmma's group, the wgmma's position)
    group, committed = 0, []      # the open group; the committed ones, oldest first
    for pos, op, ops in body:
        if op.startswith(("HGMMA", "QGMMA")):
            if len(ops) > 1 and re.fullmatch(r"R\d+", ops[1]):
                n_rs += 1
                for r in range(int(ops[1][1:]), int(ops[1][1:]) + 4):
                    live[r] = (group, pos)
            if "gsb0" in ops:  # the group's last wgmma: wgmma.commit_group
                committed.append(group)
                group += 1
            continue
        m = re.match(r"WARPGROUP\.DEPBAR\.LE", op) and re.search(r"gsb0 0x([0-9a-f]+)", " ".join(ops))
        if m:  # wgmma.wait_group N: every committed group but the N most recent is done
            n = int(m.group(1), 16)
            done = set(committed[:max(len(committed) - n, 0)])
            committed = committed[len(done):]
            live = {r: v for r, v in live.items() if v[0] not in done}
            continue
        if len(ops) > 1 and re.fullmatch(r"U?P(\d+|T)", ops[0]):
            ops = ops[1:]  # a predicate result first (SHFL, LOP3 with a P out): the register comes next
        if not live or op.startswith(NOWRITE) or not ops or not re.fullmatch(r"R\d+", ops[0]):
            continue
        width = 4 if ".128" in op else 2 if (".64" in op or ".WIDE" in op) else 1
        for r in range(int(ops[0][1:]), int(ops[0][1:]) + width):
            if r in live:
                hits.append(f"{pos} {op} {', '.join(ops)[:60]} (the wgmma at {live[r][1]} reads R{r})")
    return n_rs, hits


def main(paths):
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    bad = 0
    for path in paths:
        try:
            ks = kernels(path)
        except OSError as e:
            print(f"wgmma_inflight.py: {e}", file=sys.stderr)
            return 2
        for name, body in ks:
            n_rs, hits = scan(body)
            if not n_rs:
                continue
            short = re.sub(r"_Z\d+(\w+?)ILi(\d+)E.*", r"\1<\2>", name)
            print(f"{short}: {n_rs} wgmma with A in registers, {len(hits)} writes to them in flight"
                  + "".join("\n   " + h for h in hits[:8]))
            bad += bool(hits)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
