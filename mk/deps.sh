#!/usr/bin/env bash
# deps.sh — install what is missing of Strait's Debian packages (docs/design.md §8).
#
# As root: apt-get installs the missing ones (idempotent, silent when nothing
# is missing). Not as root: prints the exact apt-get line and exits 1.
# The CUDA toolkit is not a Debian package here; the Makefile probes for it.
set -euo pipefail

packages=(
  build-essential pkg-config clang libclang-rt-14-dev
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler libssl-dev
  libsqlite3-dev sqlite3 libzstd-dev libxxhash-dev libopenblas-dev libdnnl-dev
  libjansson-dev libinih-dev libcriterion-dev libmicrohttpd-dev libpcre2-dev libicu-dev
  fortunes fortunes-de fortunes-es fortunes-it
  python3 python3-venv openssl
  iproute2 util-linux lcov
  chromium fonts-dejavu-core
  openmpi-bin libopenmpi-dev
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -ne 0 ]]; then
  echo "deps: missing Debian packages; run as root:" >&2
  echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
  exit 1
fi

echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have no package lists yet; refresh them once.
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/strait-deps.log 2>&1; then
  apt-get update -qq >>/tmp/strait-deps.log 2>&1
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >>/tmp/strait-deps.log 2>&1; then
    echo "deps: apt-get install failed; see /tmp/strait-deps.log" >&2
    tail -n 5 /tmp/strait-deps.log >&2
    exit 1
  fi
fi
