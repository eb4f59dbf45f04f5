#!/bin/sh
# Install the named Debian packages that are not installed yet. Idempotent: a package dpkg
# already knows costs one query. Needs root (or sudo) only when something is missing; without
# either it names the packages and the command that installs them, and fails.
set -eu
missing=""
for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    run=""
elif command -v sudo >/dev/null 2>&1; then
    run="sudo"
else
    echo "missing Debian packages:$missing; install them with: apt-get install -y$missing" >&2
    exit 1
fi
echo "installing Debian packages:$missing"
# The package lists of a fresh machine may be stale or absent: refresh them once, quietly.
$run apt-get update -qq
$run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$missing >/dev/null
