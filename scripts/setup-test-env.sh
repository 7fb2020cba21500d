#!/usr/bin/env bash
# Installs everything the tests need, inside the project (all of it git-ignored, under .venv):
#
# - fakepve, the fake Proxmox VE API (AGPL, test-only), from PyPI into a virtualenv at .venv;
# - on Debian 12 only: the runtime image's root file system at .venv/runtime-rootfs, made of the
#   Debian packages gcr.io/distroless/cc-debian12 is built from that the binary can use (libc6,
#   libgcc-s1, gcc-12-base, ca-certificates), fetched with `apt-get download` (no root needed,
#   nothing installed on the machine) and unpacked there; one test runs the binary in it as the
#   image's non-root user;
# - gpg, for one test, with apt-get: only when missing, only as root, and only after saying so
#   (SETUP_NO_APT=1 skips it; that test is then skipped).
#
# Every download is announced with where it comes from. Safe to run again; it only fetches what is
# missing.
set -euo pipefail
cd "$(dirname "$0")/.."

FAKEPVE_VERSION="0.5.0"
PYTHON="${PYTHON:-python3}"
# What the runtime image holds that the binary may use (see the Dockerfile).
RUNTIME_DEBS=(libc6 libgcc-s1 gcc-12-base ca-certificates)
ROOTFS=.venv/runtime-rootfs

say() { echo "setup-test-env: $*"; }

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  say "$PYTHON not found; install Python 3.10 or newer (Debian: apt-get install python3 python3-venv)" >&2
  exit 1
fi

if ! .venv/bin/python -c "import fakepve, sys; sys.exit(fakepve.__version__ != '$FAKEPVE_VERSION')" 2>/dev/null; then
  say "downloading fakepve[crypto]==$FAKEPVE_VERSION and its dependencies from PyPI (pip) into .venv"
  "$PYTHON" -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check "fakepve[crypto]==$FAKEPVE_VERSION"
fi

# The runtime image's file system, for the test that runs the binary in it. Only Debian 12 gives
# the same packages as the image; elsewhere the test is skipped.
runtime_rootfs() {
  if [ -f "$ROOTFS/.complete" ]; then
    return
  fi
  if ! grep -qs '^VERSION_CODENAME=bookworm' /etc/os-release \
    || ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
    say "not Debian 12: skipping the runtime image's root file system (its test will be skipped)"
    return
  fi
  say "downloading ${RUNTIME_DEBS[*]} from the Debian archive (apt-get download, installs nothing) into $ROOTFS"
  rm -rf "$ROOTFS" && mkdir -p "$ROOTFS/debs"
  if ! (cd "$ROOTFS/debs" && apt-get download -qq "${RUNTIME_DEBS[@]}" 2>/dev/null); then
    # A fresh container has no package lists yet.
    if [ "${SETUP_NO_APT:-}" != "1" ] && [ "$(id -u)" = "0" ]; then
      say "no package lists: running apt-get update (SETUP_NO_APT=1 skips this), then downloading again"
      apt-get update -qq
    fi
    (cd "$ROOTFS/debs" && apt-get download -qq "${RUNTIME_DEBS[@]}" 2>/dev/null) || {
      say "apt-get download failed; skipping the runtime root file system (its test will be skipped)" >&2
      rm -rf "$ROOTFS"
      return
    }
  fi
  for deb in "$ROOTFS"/debs/*.deb; do dpkg-deb -x "$deb" "$ROOTFS"; done
  rm -rf "$ROOTFS/debs"
  # What distroless adds beside the packages: the CA bundle, the users, a home and /tmp.
  mkdir -p "$ROOTFS/etc/ssl/certs" "$ROOTFS/home/nonroot" "$ROOTFS/tmp"
  cat "$ROOTFS"/usr/share/ca-certificates/mozilla/*.crt > "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$ROOTFS/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$ROOTFS/etc/group"
  chmod 1777 "$ROOTFS/tmp"
  touch "$ROOTFS/.complete"
}
runtime_rootfs

# gpg is used by one test to check our request signatures independently of our own code.
if ! command -v gpg >/dev/null 2>&1; then
  if [ "${SETUP_NO_APT:-}" != "1" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    say "gpg is missing: installing the Debian package gpg with apt-get update && apt-get install gpg (SETUP_NO_APT=1 skips this)"
    apt-get update -qq && apt-get install -y -qq gpg >/dev/null
  else
    say "gpg not found; the signature cross-check test will be skipped (install gnupg)" >&2
  fi
fi

.venv/bin/python -c "import fakepve; print('setup-test-env: fakepve', fakepve.__version__, 'ready')"
