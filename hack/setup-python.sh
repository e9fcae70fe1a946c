#!/usr/bin/env bash
# The project's virtualenv: the packages editable, the test environment helpers and the pinned test tools.
# Re-runs pip only when one of the files that define the environment changed (a stamp holds their hash).
set -euo pipefail
venv=${1:-.venv}
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
inputs=(requirements-dev.txt connectors/pyproject.toml operator/pyproject.toml tools/local/pyproject.toml tools/testenv/pyproject.toml hack/setup-python.sh)
want=$(cat "${inputs[@]}" 2>/dev/null | sha256sum | cut -d' ' -f1)
stamp="$venv/.epd-setup-stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi
echo "setup-python: preparing $venv"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/pip" install -q -r requirements-dev.txt \
  -e "connectors[discovery,proxy,store]" -e operator -e tools/local -e tools/testenv
echo "$want" > "$stamp"
