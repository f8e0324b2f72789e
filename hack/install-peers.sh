#!/usr/bin/env bash
# Installs the tools `make bench` compares Revault with (its `peers` step): restic and borg
# from Debian's packages. Idempotent; fast when both are present.
set -euo pipefail
need=()
command -v restic >/dev/null 2>&1 || need+=(restic)
command -v borg >/dev/null 2>&1 || need+=(borgbackup)
if [ ${#need[@]} -gt 0 ]; then
  echo "install-peers: apt-get install ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
