#!/usr/bin/env bash
# Conformance harness setup: fetch vLLM 0.33.0's OWN KV-event publisher code from
# PyPI at test time and prepare a tiny venv that can run it without torch.
#
# Idempotent: every step is skipped when its result is already there, so calling
# this before each test run costs ~0.1 s once set up.
#
# Produces (all under the gitignored /work/main/.cache, never committed):
#   .cache/venv-vllm/              python3 -m venv with pyzmq, msgspec, pydantic,
#                                  psutil, urllib3, cbor2 (no torch, no vllm install)
#   .cache/vllm-0.33.0.tar.gz      the vllm sdist (47 MB; the x86_64 wheel is 336 MB)
#   .cache/vllm-src/vllm/...       ONLY the vLLM files the harness loads (list below),
#                                  extracted unmodified from the sdist
#   .cache/vllm-src/.complete      stamp
#
# Why the sdist and not `pip download vllm==0.33.0 --no-deps`: the wheel is 336 MB,
# the sdist 47 MB and contains the same vllm/*.py files. `pip download` cannot fetch
# vllm's sdist without building its metadata (setup.py imports torch), so the sdist
# is fetched from the PyPI simple index (PEP 691 JSON) that pip itself uses, and its
# sha256 is checked against the index. If that fails for any reason we fall back to
# `pip download vllm==0.33.0 --no-deps --only-binary :all:` (the wheel).
#
# Env overrides: KVROUTE_CACHE_DIR (default <repo>/.cache), PYTHON (default python3),
# PIP_INDEX_URL (default the index pip is configured with).
set -euo pipefail

VLLM_VERSION="0.33.0"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${KVROUTE_CACHE_DIR:-$REPO/.cache}"
VENV="$CACHE/venv-vllm"
SRC="$CACHE/vllm-src"
PY="${PYTHON:-python3}"
INDEX="${PIP_INDEX_URL:-the index pip is configured with}"
INDEX="${INDEX%/}"

# vLLM files extracted from the sdist. The first four are imported (really
# executed) by the harness; the last three are extracted for reference only
# (the shim checks the ExternalBlockHash definition in kv_cache_utils.py and the
# `config` decorator in config/utils.py against its stand-ins, and hashing.py
# provides the real sha256_cbor for `vllm_publisher.py --hash`).
FILES=(
  vllm/distributed/kv_events.py   # the publisher under test (real, unmodified)
  vllm/config/kv_events.py        # KVEventsConfig (real, unmodified)
  vllm/utils/network_utils.py     # get_ip/split_zmq_path/... used by _bind (real)
  vllm/envs.py                    # env lookups used by network_utils (real; stdlib only)
  vllm/utils/hashing.py           # sha256 / sha256_cbor (real; needs cbor2)
  vllm/v1/core/kv_cache_utils.py  # reference only (ExternalBlockHash, NONE_HASH, hash_block_tokens)
  vllm/config/utils.py            # reference only (the `config` decorator)
)

# Python packages: exactly what the imported vLLM files need at import time.
#   kv_events.py        -> msgspec, pyzmq
#   config/kv_events.py -> pydantic (via the `config` decorator stand-in, which is
#                          the same pydantic dataclass with extra="forbid" that vLLM uses)
#   network_utils.py    -> psutil, urllib3 (pyzmq too)
#   hashing.py          -> cbor2
# Versions: vLLM 0.33.0's requirements/common.txt only sets floors
# (pyzmq>=25, pydantic>=2.12); pinned here for reproducibility.
PKGS=(pyzmq==27.3.0 msgspec==0.23.0 "pydantic>=2.12,<3" psutil urllib3 cbor2)

log() { echo "[conformance-setup] $*" >&2; }
t0=$(date +%s)
mkdir -p "$CACHE"

# 1. venv -------------------------------------------------------------------
if [[ ! -f "$VENV/.complete" ]]; then
  log "creating venv $VENV"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    --only-binary :all: "${PKGS[@]}"
  "$VENV/bin/python" -c 'import zmq, msgspec, pydantic, psutil, urllib3, cbor2'
  touch "$VENV/.complete"
else
  log "venv ok"
fi

# 2. vllm sources -----------------------------------------------------------
if [[ ! -f "$SRC/.complete" ]]; then
  archive=""
  sdist="$CACHE/vllm-$VLLM_VERSION.tar.gz"
  if [[ -f "$sdist" ]] && "$VENV/bin/python" - "$sdist" <<'EOF'
import sys, tarfile
tarfile.open(sys.argv[1]).getmember("vllm-0.33.0/vllm/distributed/kv_events.py")
EOF
  then
    archive="$sdist"
  else
    log "fetching vllm==$VLLM_VERSION sdist via $INDEX"
    if "$VENV/bin/python" - "$INDEX" "$VLLM_VERSION" "$sdist" <<'EOF'
# Fetch the sdist exactly as pip would find it (PEP 691 JSON simple index) and
# verify the index's sha256. Only the `vllm` project page is queried.
import hashlib, json, os, sys, urllib.request
index, version, dest = sys.argv[1:4]
name = f"vllm-{version}.tar.gz"
req = urllib.request.Request(f"{index}/vllm/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
with urllib.request.urlopen(req, timeout=60) as r:
    files = json.load(r)["files"]
f = next(f for f in files if f["filename"] == name)
tmp = dest + ".part"
h = hashlib.sha256()
with urllib.request.urlopen(f["url"], timeout=300) as r, open(tmp, "wb") as out:
    while chunk := r.read(1 << 20):
        h.update(chunk)
        out.write(chunk)
want = f["hashes"]["sha256"]
if h.hexdigest() != want:
    os.unlink(tmp)
    sys.exit(f"sha256 mismatch for {name}: {h.hexdigest()} != {want}")
os.replace(tmp, dest)
print(f"{name}: {os.path.getsize(dest)} bytes, sha256 {want}", file=sys.stderr)
EOF
    then
      archive="$sdist"
    else
      log "sdist fetch failed; falling back to pip download of the wheel (336 MB)"
      mkdir -p "$CACHE/vllm-wheel-conformance"
      "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check \
        --no-deps --only-binary :all: "vllm==$VLLM_VERSION" -d "$CACHE/vllm-wheel-conformance"
      archive="$(ls "$CACHE"/vllm-wheel-conformance/vllm-"$VLLM_VERSION"-*.whl | head -1)"
    fi
  fi
  log "extracting ${#FILES[@]} files from $(basename "$archive")"
  rm -rf "$SRC.tmp" && mkdir -p "$SRC.tmp"
  "$VENV/bin/python" - "$archive" "$SRC.tmp" "${FILES[@]}" <<'EOF'
import os, sys, tarfile, zipfile
archive, dest, *files = sys.argv[1:]
if archive.endswith(".whl"):
    z = zipfile.ZipFile(archive)
    read = lambda p: z.read(p)
else:
    t = tarfile.open(archive)
    top = "vllm-0.33.0/"
    read = lambda p: t.extractfile(top + p).read()
for p in files:
    out = os.path.join(dest, p)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "wb") as f:
        f.write(read(p))
EOF
  rm -rf "$SRC" && mv "$SRC.tmp" "$SRC"
  touch "$SRC/.complete"
else
  log "vllm sources ok"
fi

# 3. smoke: the real module imports through the shim -------------------------
"$VENV/bin/python" "$HERE/vllm_publisher.py" --self-test
log "done in $(( $(date +%s) - t0 )) s"
