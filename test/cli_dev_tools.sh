#!/bin/sh
# cli_dev_tools.sh: the dev/ tools that read the GPU suite's output, on made-up inputs:
# dev/wgmma_inflight.py (a write to a register-A wgmma's registers before the wait that retires its
# group is flagged, one after it is not; cuobjdump listings and dev/sass.sh dumps) and
# dev/compare_tables.py (every run's numbers and the ratios to the first, tables that follow each
# other without a blank line, rows one run lacks).
# Runs from the repo root; needs python3.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. test/cli_lib.sh

# --- wgmma_inflight.py ---
# two committed groups (the wgmma marked gsb0 ends one); the wait with 1 pending retires the first
cat >"$tmp/k.sass" <<'EOF'
        Function : _Z8kernel_aILi128EEvv
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, R152, gdesc[UR8], R24, gsb0 ;
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R88, R160, gdesc[UR8], R88, gsb0 ;
        /*0030*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0040*/                   MOV R153, R3 ;
        /*0050*/                   FFMA R162, R1, R2, R3 ;
        /*0060*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0070*/                   MOV R161, R3 ;
        Function : _Z8kernel_bILi64EEvv
        /*0010*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
        /*0020*/                   MOV R152, R3 ;
EOF
python3 dev/wgmma_inflight.py "$tmp/k.sass" >"$tmp/out" 2>&1
rc=$?
check "wgmma_inflight: a write before its group's wait is flagged, status 1" "rc $rc: $(cat "$tmp/out")" \
  sh -c "[ $rc -eq 1 ] && grep -q '^kernel_a<128>: 2 wgmma with A in registers, 1 writes to them in flight' '$tmp/out' &&
         grep -q '0050 FFMA R162, R1, R2, R3 (the wgmma at 0020 reads R162)' '$tmp/out'"
check "wgmma_inflight: writes after the retiring wait are not flagged" "$(cat "$tmp/out")" \
  sh -c "! grep -q 'R153\|R161' '$tmp/out'"
check "wgmma_inflight: a kernel without register-A wgmmas is not listed" "$(cat "$tmp/out")" sh -c "! grep -q kernel_b '$tmp/out'"
# dev/sass.sh's dumps: one kernel a file, named by the file, no addresses
sed -n '2,7p' "$tmp/k.sass" | sed 's@/\*[0-9a-f]*\*/@@; s/R162, R1/R12, R1/' >"$tmp/_Z8kernel_cILi64EEvv.sass"
python3 dev/wgmma_inflight.py "$tmp/_Z8kernel_cILi64EEvv.sass" >"$tmp/out" 2>&1
rc=$?
check "wgmma_inflight: a clean dev/sass.sh dump, status 0" "rc $rc: $(cat "$tmp/out")" \
  sh -c "[ $rc -eq 0 ] && grep -q '^kernel_c<64>: 2 wgmma with A in registers, 0 writes to them in flight' '$tmp/out'"
python3 dev/wgmma_inflight.py >"$tmp/out" 2>&1
check "wgmma_inflight: no file: usage, status 2" "rc $?" [ $? -eq 2 ]

# --- compare_tables.py ---
cat >"$tmp/a.txt" <<'EOF'
== some run
| T | ours TFLOP/s | mode | dm |
|---|---|---|---|
| 1024 | 500 | fp8 | **612.5** (1.2x) |
| 2048 | 550 | fp8 | 700 |
| kernel | ms |
|---|:--|
| copy | 0.1 |
EOF
cat >"$tmp/b.txt" <<'EOF'
| T | ours TFLOP/s | mode | dm |
|---|---|---|---|
| 1024 | 525 | fp8 | 600 |
| 4096 | 9 | fp8 | n/a |

| kernel | ms |
|---|---|
| copy | 0.12 |
EOF
python3 dev/compare_tables.py "base=$tmp/a.txt" "new=$tmp/b.txt" >"$tmp/out" 2>&1
rc=$?
check "compare_tables: exits 0" "rc $rc: $(head -3 "$tmp/out")" [ "$rc" -eq 0 ]
check "compare_tables: numbers side by side with the ratio to the first" "$(cat "$tmp/out")" \
  sh -c "grep -qx '| 1024 | 500 | 525 | 1.050 |' '$tmp/out' && grep -qx '| 1024 | 612.5 | 600 | 0.980 |' '$tmp/out'"
check "compare_tables: a row one run lacks shows '-'" "$(grep -E '^\| (2048|4096) ' "$tmp/out")" \
  sh -c "grep -qx '| 2048 | 550 | - | - |' '$tmp/out' && grep -qx '| 4096 | - | 9 | - |' '$tmp/out'"
check "compare_tables: a column of words is left out" "$(grep -c mode "$tmp/out")" sh -c "! grep -q '^mode ' '$tmp/out'"
check "compare_tables: a table right after another is its own" "$(grep -A3 '^ms ' "$tmp/out")" \
  sh -c "grep -qx '| copy | 0.1 | 0.12 | 1.200 |' '$tmp/out' && ! grep -q '^| kernel |.*| - |' '$tmp/out'"
printf 'no tables here\n' >"$tmp/c.txt"
python3 dev/compare_tables.py "x=$tmp/c.txt" >"$tmp/out" 2>&1
check "compare_tables: no table anywhere, status 1" "rc $?: $(cat "$tmp/out")" [ $? -eq 1 ]
exit 0
