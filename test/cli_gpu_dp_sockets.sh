#!/bin/sh
# cli_gpu_dp_sockets.sh: scripts/gpu.sh's dp-sockets areas (scripts/lib/dp_sockets.sh) without a
# GPU. With stand-ins on PATH (nvidia-smi listing GPUs, make doing nothing): the refusal on one
# GPU and of a bad DP_CONFIG or DP_ACCUM; every training command their --dry-run prints (bench:
# paper_569m and paper_1p67b; check: tiny) passes `./train_gpt ... --dry-run` on 1 and 2 ranks;
# then both areas run for real on the CPU backend (DP_SOCKETS_DEVICE=cpu: the same steps, the
# host transport standing in for NCCL), through the launchers when mpirun and an MPI build are
# there, torchrun-style otherwise: every part of `check dp-sockets` passes but the two that read
# NCCL's transport (no NCCL on the CPU), and `bench dp-sockets` prints its table. Runs from the
# repo root after `make`; needs bash.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. test/cli_lib.sh

mkdir -p "$tmp/bin" "$tmp/tmp"
stub_nvidia_smi "$tmp/bin" 2
printf '#!/bin/sh\necho "make $*"\n' >"$tmp/bin/make"
chmod +x "$tmp/bin/make"
# gpu ARGS...: gpu.sh with the stand-ins first on PATH; output in $tmp/out, status in rc
gpu() { PATH="$tmp/bin:$PATH" TMPDIR="$tmp/tmp" OUT="$tmp/o" bash scripts/gpu.sh "$@" >"$tmp/out" 2>&1; rc=$?; }

FAKE_NGPU=1 gpu check dp-sockets
check "check dp-sockets on 1 GPU: status 2" "rc $rc: $(head -1 "$tmp/out")" \
  sh -c "[ $rc -eq 2 ] && grep -q 'check dp-sockets needs at least 2 GPUs' '$tmp/out'"
DP_ACCUM=large gpu bench dp-sockets
check "bench dp-sockets refuses DP_ACCUM=large" "rc $rc: $(head -1 "$tmp/out")" \
  sh -c "[ $rc -eq 2 ] && grep -q \"DP_ACCUM: 'large' is not own or small\" '$tmp/out'"
DP_CONFIG=nosuch gpu bench dp-sockets
check "bench dp-sockets refuses a config that is not there" "rc $rc: $(head -1 "$tmp/out")" \
  sh -c "[ $rc -eq 2 ] && grep -q 'DP_CONFIG=nosuch: no configs/nosuch.json' '$tmp/out'"

# dry_runs NAME: every "./train_gpt ..." line gpu.sh printed runs with --dry-run on 1 and 2 ranks
dry_runs() {
  grep -o '\./train_gpt .*' "$tmp/out" >"$tmp/cmds"
  _n=0 _bad=""
  while IFS= read -r line; do
    _n=$((_n + 1))
    for w in 1 2; do
      bash -c "$line --dry-run --world-size $w" >"$tmp/dry" 2>&1 || _bad="$_bad [world $w: $line: $(tail -1 "$tmp/dry")]"
    done
  done <"$tmp/cmds"
  check "$1: its $_n training commands pass --dry-run on 1 and 2 ranks" "${_bad:-no command printed}" \
    [ "$_n" -gt 0 -a -z "$_bad" ]
}
for cfg in paper_569m paper_1p67b; do
  DP_CONFIG=$cfg gpu --dry-run bench dp-sockets
  check "--dry-run bench dp-sockets ($cfg): 12 runs" "rc $rc: $(grep -c './train_gpt' "$tmp/out")" \
    sh -c "[ $rc -eq 0 ] && [ \$(grep -c './train_gpt --config configs/$cfg.json' '$tmp/out') -eq 12 ]"
  dry_runs "bench dp-sockets ($cfg)"
done
gpu --dry-run check dp-sockets
dry_runs "check dp-sockets"

# The areas for real, on the CPU backend.
DP_SOCKETS_DEVICE=cpu gpu check dp-sockets
launch=$(grep -o '2-rank runs start with the [a-z]* launcher' "$tmp/out")
echo "# check dp-sockets on the CPU: ${launch:-no launcher line}; $(tail -1 "$tmp/out")"
faults=6  # with mpirun a rank is killed twice: under the launcher and torchrun-style
case $launch in *"env launcher") faults=5 ;; esac
check "check dp-sockets (CPU): all parts pass but NCCL's two" "rc $rc: $(grep -E '^dp-sockets .* (FAIL|SKIP) ' "$tmp/out")" \
  sh -c "[ $rc -eq 1 ] && tail -1 '$tmp/out' | grep -q '^check: $((faults + 6)) passed, 2 failed, 0 not run$' &&
         [ \$(grep -cE '^dp-sockets .*(NCCL connects the ranks via).* FAIL +exit 0; .*no .via. lines' '$tmp/out') -eq 2 ]"
check "check dp-sockets (CPU): the faults and resumes ran" "$(grep -E 'SIG|resume' "$tmp/out" | grep '^dp-sockets' | cut -c1-120)" \
  sh -c "[ \$(grep -cE '^dp-sockets (SIGKILL|SIGTERM|its checkpoint|resume at step 10).* PASS ' '$tmp/out') -eq $faults ]"
check "check dp-sockets (CPU): every command in its log" "$(ls "$tmp/o")" \
  grep -q 'launch_mpirun_multinode.sh\|LOCAL_WORLD_SIZE=1' "$tmp/o/check_dp-sockets.log"
DP_SOCKETS_DEVICE=cpu DP_CONFIG=tiny DP_ACCUM=small gpu bench dp-sockets
check "bench dp-sockets (CPU, tiny, small): 6 runs, the table last" "rc $rc: $(tail -12 "$tmp/out")" \
  sh -c "[ $rc -eq 0 ] && [ \$(grep -cE '^\| tiny \| small \| [12] \| [12] \| (-|nvlink|sockets) \| (-|plain|zero1) \| (-|true|false) \| [1-9][0-9]* \|' '$tmp/out') -eq 6 ] &&
         grep -q '^small accumulation over sockets: .* the overlap recovers' '$tmp/out' &&
         grep -q '^small accumulation over sockets, overlap on: ZeRO-1 .* ms over the ideal step, plain' '$tmp/out' && tail -1 '$tmp/out' | grep -q '^tiny (13M parameters)'"
exit 0
