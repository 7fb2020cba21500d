#!/usr/bin/env bash
# Advisory check of Cargo.lock against the RustSec advisory database, with cargo-audit (installed from
# crates.io into Cargo's own bin directory when missing, so a machine builds it once, not every clone:
# the build takes many minutes on two cores). Advisory: it never fails for lack of
# network or tool, and says plainly when nothing was checked. AUDIT_STRICT=1 makes a known
# vulnerability fail the run.
set -uo pipefail
cd "$(dirname "$0")/.."

CARGO_AUDIT_VERSION="0.22.2"
TOOLS="${CARGO_HOME:-$HOME/.cargo}"
AUDIT="$TOOLS/bin/cargo-audit"

if ! "$AUDIT" --version 2>/dev/null | grep -q "$CARGO_AUDIT_VERSION"; then
  echo "audit: installing cargo-audit $CARGO_AUDIT_VERSION from crates.io"
  if ! cargo install --quiet --locked --root "$TOOLS" cargo-audit --version "$CARGO_AUDIT_VERSION"; then
    echo "audit: NOT CHECKED: cargo-audit could not be installed (no network to crates.io?)" >&2
    exit 0
  fi
fi

# The database is a git repository on GitHub; a copy fetched earlier is used when GitHub is out of
# reach, and without one nothing is checked (said so, not failed).
report() {
  echo "audit: Cargo.lock has known advisories (see above)" >&2
  if [ "${AUDIT_STRICT:-0}" = "1" ]; then exit 1; fi
  exit 0
}
output=$("$AUDIT" audit --file Cargo.lock 2>&1)
status=$?
echo "$output"
[ "$status" -eq 0 ] && exit 0
if ! grep -qiE "fetch|network|resolve|connect|clone" <<<"$output"; then
  report
fi
if [ ! -d "${CARGO_HOME:-$HOME/.cargo}/advisory-db" ]; then
  echo "audit: NOT CHECKED: the RustSec advisory database could not be fetched from GitHub and no copy is at hand" >&2
  exit 0
fi
echo "audit: GitHub out of reach; checking against the copy of the database fetched earlier" >&2
"$AUDIT" audit --file Cargo.lock --no-fetch || report
