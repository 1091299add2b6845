#!/usr/bin/env bash
# The Python virtual environment of the real client libraries (requirements.txt), in
# target/py-venv, rebuilt only when requirements.txt changes; prints its python. Used by
# tests/clients/run.sh and by the real-node tests that drive a client library (real_batch.rs).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
venv=$root/target/py-venv
requirements=$root/tests/clients/requirements.txt

if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    echo "python3-venv is missing; installing it from Debian" >&2
    sudo=$(command -v sudo || true)
    $sudo apt-get update -qq >&2 && $sudo apt-get install -y -qq python3-venv >&2
fi
want=$(sha256sum "$requirements" | cut -d' ' -f1)
if [[ ! -x $venv/bin/python || "$(cat "$venv/.requirements-sha256" 2>/dev/null)" != "$want" ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" >&2
    echo "$want" >"$venv/.requirements-sha256"
fi
echo "$venv/bin/python"
