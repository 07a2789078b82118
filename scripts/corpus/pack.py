#!/usr/bin/env python3
"""Packs prepared token shards into one checksummed file, and unpacks it (prepare_corpus.sh
--pack / --unpack).

  pack.py pack CORPUS_DIR FILE [--max-mib N]
  pack.py unpack FILE CORPUS_DIR

pack: FILE is a tar archive compressed with xz (LZMA2, preset 9e) holding CORPUS_DIR's
<source>/train_*.bin and <source>/val_*.bin shards, SOURCES.md when present, and MANIFEST.json:
the SHA-256, size and token count of every shard, and the fraction of the training tokens kept.
Every validation shard goes in whole. If everything does not fit N MiB (default 16), every
training shard is cut to the same leading fraction of its tokens (a valid shard, its header's
count updated), the largest that fits; the fraction is written to the manifest and printed.
unpack: reads the whole FILE (xz checks its own CRC), checks every shard against the manifest
(SHA-256, size, header), then writes them under CORPUS_DIR. A shard already there is left as it
is when identical and refused when it differs; nothing is written unless every check passes.
Standard library only.
"""
import argparse  # command line
import hashlib  # SHA-256
import io  # in-memory archives
import json  # the manifest
import lzma  # xz
import os  # paths
import struct  # shard headers
import sys  # exit with a message
import tarfile  # the archive

MAGIC = {20240520: (1, 2), 20240801: (7, 4)}  # magic -> (version, bytes per token)


class PackError(Exception):
    pass


def shard_info(data, name):
    """(token count, bytes per token) of a shard's bytes; PackError when it is not a valid shard."""
    if len(data) < 1024:
        raise PackError("%s: %d bytes, shorter than a shard header" % (name, len(data)))
    magic, version, count = struct.unpack("<3i", data[:12])
    if magic not in MAGIC or MAGIC[magic][0] != version:
        raise PackError("%s: not an llm.c token shard (magic %d, version %d)" % (name, magic, version))
    tb = MAGIC[magic][1]
    if len(data) != 1024 + count * tb:
        raise PackError("%s: header says %d tokens but the file has %d bytes" % (name, count, len(data)))
    return count, tb


def truncated(data, fraction):
    """The shard's bytes cut to the first floor(fraction * count) tokens (at least 1)."""
    count, tb = shard_info(data, "shard")
    keep = max(1, int(count * fraction))
    header = bytearray(data[:1024])
    header[8:12] = struct.pack("<i", keep)
    return bytes(header) + data[1024:1024 + keep * tb]


def collect(corpus_dir):
    """{relative name: bytes} of every shard and SOURCES.md under corpus_dir."""
    files = {}
    for source in sorted(os.listdir(corpus_dir)):
        sdir = os.path.join(corpus_dir, source)
        if source.startswith(".") or not os.path.isdir(sdir):
            continue
        for name in sorted(os.listdir(sdir)):
            if (name.startswith("train_") or name.startswith("val_")) and name.endswith(".bin"):
                with open(os.path.join(sdir, name), "rb") as f:
                    files[source + "/" + name] = f.read()
    if not files:
        raise PackError("%s: no <source>/train_*.bin or val_*.bin shards (run scripts/prepare_corpus.sh)" % corpus_dir)
    sources = os.path.join(corpus_dir, "SOURCES.md")
    if os.path.isfile(sources):
        with open(sources, "rb") as f:
            files["SOURCES.md"] = f.read()
    return files


def build(files, fraction):
    """The compressed archive (bytes) of files with training shards cut to fraction."""
    manifest = {"train_fraction": fraction, "files": {}}
    members = []
    for name in sorted(files):
        data = files[name]
        if name.endswith(".bin"):
            if os.path.basename(name).startswith("train_") and fraction < 1.0:
                data = truncated(data, fraction)
            count, _ = shard_info(data, name)
            manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                                       "tokens": count}
        members.append((name, data))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [("MANIFEST.json", json.dumps(manifest, indent=1, sort_keys=True).encode())] + members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0  # the same shards give the same file
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return lzma.compress(raw.getvalue(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                         preset=9 | lzma.PRESET_EXTREME), manifest


def tokens_of(manifest, kind):
    return sum(v["tokens"] for k, v in manifest["files"].items() if os.path.basename(k).startswith(kind + "_"))


def pack(corpus_dir, out, max_mib):
    limit = int(max_mib * 1024 * 1024)
    files = collect(corpus_dir)
    for name, data in files.items():
        if name.endswith(".bin"):
            shard_info(data, os.path.join(corpus_dir, name))
    fraction = 1.0
    blob, manifest = build(files, fraction)
    tries, val_only = 0, None
    while len(blob) > limit:
        tries += 1
        if tries > 12:
            raise PackError("cannot fit the shards into %g MiB" % max_mib)
        # the validation shards stay whole: scale only what the training shards take
        if val_only is None:
            val_only, _ = build({k: v for k, v in files.items() if not os.path.basename(k).startswith("train_")}, 1.0)
        train_bytes = max(1, len(blob) - len(val_only))
        fraction = fraction * max(0.0, (limit - len(val_only)) / train_bytes) * 0.97
        if fraction <= 0:
            raise PackError("the validation shards alone compress to %.1f MiB, over --max-mib %g"
                            % (len(val_only) / 2**20, max_mib))
        blob, manifest = build(files, fraction)
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, out)
    print("pack: %s: %.2f MiB (limit %g), %d shards, %d train tokens (fraction %.4f of each training shard), "
          "%d val tokens, sha256 %s" % (out, len(blob) / 2**20, max_mib, len(manifest["files"]),
                                        tokens_of(manifest, "train"), fraction, tokens_of(manifest, "val"),
                                        hashlib.sha256(blob).hexdigest()))


def safe_name(name):
    parts = name.split("/")
    return not name.startswith("/") and ".." not in parts and all(parts) and len(parts) <= 2


def unpack(path, corpus_dir):
    try:
        with open(path, "rb") as f:
            raw = lzma.decompress(f.read())
    except OSError as e:
        raise PackError("%s: %s" % (path, e.strerror))
    except lzma.LZMAError as e:
        raise PackError("%s: not a valid xz file, or corrupt (%s)" % (path, e))
    members = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r") as tar:
            for m in tar.getmembers():
                if not m.isfile() or not safe_name(m.name):
                    raise PackError("%s: unexpected member '%s'" % (path, m.name))
                members[m.name] = tar.extractfile(m).read()
    except tarfile.TarError as e:
        raise PackError("%s: not a corpus pack (%s)" % (path, e))
    if "MANIFEST.json" not in members:
        raise PackError("%s: no MANIFEST.json (not made by prepare_corpus.sh --pack?)" % path)
    manifest = json.loads(members.pop("MANIFEST.json"))
    listed = set(manifest["files"])
    shards = {k for k in members if k.endswith(".bin")}
    if listed != shards:
        raise PackError("%s: the manifest lists %d shards, the archive holds %d" % (path, len(listed), len(shards)))
    for name in sorted(shards):
        data, want = members[name], manifest["files"][name]
        if hashlib.sha256(data).hexdigest() != want["sha256"] or len(data) != want["bytes"]:
            raise PackError("%s: %s does not match its SHA-256 in the manifest (corrupt file)" % (path, name))
        if shard_info(data, name)[0] != want["tokens"]:
            raise PackError("%s: %s has another token count than the manifest says" % (path, name))
    writes = []
    for name in sorted(members):
        dst = os.path.join(corpus_dir, name)
        if os.path.exists(dst):
            with open(dst, "rb") as f:
                if f.read() == members[name]:
                    continue
            raise PackError("%s already exists and differs from the pack: move it away first (nothing was written)"
                            % dst)
        writes.append((dst, members[name]))
    for dst, data in writes:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst + ".tmp", "wb") as f:
            f.write(data)
        os.replace(dst + ".tmp", dst)
    print("unpack: %s -> %s: %d shards checked, %d files written, %d train + %d val tokens (train fraction %.4f)"
          % (path, corpus_dir, len(shards), len(writes), tokens_of(manifest, "train"), tokens_of(manifest, "val"),
             manifest.get("train_fraction", 1.0)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("corpus_dir")
    p.add_argument("file")
    p.add_argument("--max-mib", type=float, default=16.0)
    u = sub.add_parser("unpack")
    u.add_argument("file")
    u.add_argument("corpus_dir")
    a = ap.parse_args()
    try:
        if a.cmd == "pack":
            if not a.max_mib > 0:
                raise PackError("--max-mib must be positive")
            pack(a.corpus_dir, a.file, a.max_mib)
        else:
            unpack(a.file, a.corpus_dir)
    except (PackError, OSError) as e:
        sys.exit("pack.py: error: %s" % e)


if __name__ == "__main__":
    main()
