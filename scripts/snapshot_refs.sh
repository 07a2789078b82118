#!/bin/bash
# snapshot_refs.sh: on the development machine, export git refs (branches, commits) as plain trees
# into .snap_<name>/ beside the repo's files, each with .deps/cjson (cJSON for the GPU machine; not
# the rest of .deps, e.g. sass_schedule.sh's 49 MB nvdisasm, past the device's carry limit), so that
# one device call can build and time several versions side by side (scripts/gpu_ab_refs.sh). The
# device tool copies the working tree without .git; name the snapshots in its `carry` list
# (they are ignored by git: /.snap*/ in .gitignore). Existing snapshots of the same names are
# replaced; nothing else is touched.
#   usage: bash scripts/snapshot_refs.sh main wip/fp8-fwd-overlap wip/fp8-pdp-split-wait
#          -> .snap_main .snap_wip-fp8-fwd-overlap .snap_wip-fp8-pdp-split-wait (printed, with sizes)
set -u
cd "$(dirname "$0")/.." || exit 1
[ $# -ge 1 ] || { echo "usage: bash scripts/snapshot_refs.sh REF [REF ...]" >&2; exit 2; }
[ -d .deps/cjson ] || echo "snapshot_refs.sh: note: no .deps/cjson here (cJSON for the GPU build: ../shared/device/README.md)" >&2
for ref in "$@"; do
  git rev-parse --verify --quiet "$ref^{commit}" >/dev/null ||
    { echo "snapshot_refs.sh: $ref: not a branch or commit of this repository" >&2; exit 1; }
done
for ref in "$@"; do
  dir=".snap_$(printf '%s' "$ref" | tr -c 'A-Za-z0-9._-' '-')"
  rm -rf "$dir" && mkdir "$dir" || exit 1
  git archive "$ref" | tar xf - -C "$dir" || { echo "snapshot_refs.sh: git archive $ref failed" >&2; exit 1; }
  [ -d .deps/cjson ] && mkdir -p "$dir/.deps" && cp -r .deps/cjson "$dir/.deps/"
  echo "$dir  $(git rev-parse --short "$ref")  $(du -sh "$dir" | cut -f1)"
done
