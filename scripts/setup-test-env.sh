#!/usr/bin/env bash
# Installs everything the tests need, inside the project: fakepve (the fake Proxmox VE API, AGPL,
# test-only) in a git-ignored virtualenv at .venv. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

FAKEPVE_VERSION="0.5.0"
PYTHON="${PYTHON:-python3}"

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "setup-test-env: $PYTHON not found; install Python 3.10 or newer (Debian: apt-get install python3 python3-venv)" >&2
  exit 1
fi

if ! .venv/bin/python -c "import fakepve, sys; sys.exit(fakepve.__version__ != '$FAKEPVE_VERSION')" 2>/dev/null; then
  echo "setup-test-env: installing fakepve $FAKEPVE_VERSION into .venv"
  "$PYTHON" -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check "fakepve[crypto]==$FAKEPVE_VERSION"
fi

# gpg is used by one test to check our request signatures independently of our own code.
if ! command -v gpg >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup-test-env: installing gpg"
    apt-get update -qq && apt-get install -y -qq gpg >/dev/null
  else
    echo "setup-test-env: gpg not found; the signature cross-check test will be skipped (install gnupg)" >&2
  fi
fi

.venv/bin/python -c "import fakepve; print('setup-test-env: fakepve', fakepve.__version__, 'ready')"
