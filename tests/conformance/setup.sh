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
#   .cache/vllm-wheel/             the vllm wheel (336 MB, downloaded once)
#   .cache/vllm-src/vllm/...       ONLY the vLLM files the harness loads (list below),
#                                  extracted unmodified from the wheel
#   .cache/vllm-src/.complete      stamp
#
# The wheel comes through `pip download` (pip's own index settings). Only the files
# listed below are extracted.
#
# Env overrides: KVROUTE_CACHE_DIR (default <repo>/.cache), PYTHON (default python3),
# and pip's own index settings.
set -euo pipefail

VLLM_VERSION="0.33.0"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${KVROUTE_CACHE_DIR:-$REPO/.cache}"
VENV="$CACHE/venv-vllm"
SRC="$CACHE/vllm-src"
PY="${PYTHON:-python3}"

# vLLM files extracted from the wheel. The first four are imported (really
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
  # The wheel, through pip's own configured index. (The sdist is smaller, but pip cannot
  # fetch it without building its metadata, and vLLM's setup.py imports torch.)
  wheels="$CACHE/vllm-wheel"
  archive="$(ls "$wheels"/vllm-"$VLLM_VERSION"-*.whl 2>/dev/null | head -1 || true)"
  if [[ -z "$archive" ]]; then
    log "pip download vllm==$VLLM_VERSION (wheel, no deps)"
    mkdir -p "$wheels"
    "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check \
      --no-deps --only-binary :all: "vllm==$VLLM_VERSION" -d "$wheels"
    archive="$(ls "$wheels"/vllm-"$VLLM_VERSION"-*.whl | head -1)"
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
