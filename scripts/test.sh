#!/usr/bin/env bash
# Installs the dependencies, builds everything (Release, Ninja, ccache) and runs all tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
# A venv for tests/server/openai_client_test.py (the OpenAI client, prometheus_client, numpy),
# made once and remade only when scripts/requirements-test.txt changes (the venv keeps a copy).
VENV="$BUILD_DIR/pytest-venv"
REQ=scripts/requirements-test.txt
if [ ! -x "$VENV/bin/python" ] || ! cmp -s "$REQ" "$VENV/requirements-test.txt"; then
  rm -rf "$VENV"
  mkdir -p "$BUILD_DIR"
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ"
  cp "$REQ" "$VENV/requirements-test.txt"  # last, so a failed install is retried next time
fi
VENV_PYTHON="$(cd "$VENV" && pwd)/bin/python"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DVLM_FATAL_WARNINGS=ON \
  -DVLM_TEST_PYTHON="$VENV_PYTHON"
cmake --build "$BUILD_DIR" -j "$(nproc)"
# Tests labelled slow (long sample runs) are left out: ctest --test-dir build -L slow runs them.
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" -LE slow "$@"
