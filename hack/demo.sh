#!/usr/bin/env bash
# demo.sh is `make demo`: build the test bed (cached) and watchgate, then run
# hack/demo (a module of its own), which starts a real control plane, puts
# watchgate in front and shows a watch storm being stopped. It stops by
# itself. Every build step says what it builds and, every 15 s, how long it
# has taken so far.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# building NAME CMD...: run a build, telling every 15 s how long it has taken.
building() {
  local name=$1 start=$SECONDS
  shift
  echo ">> building $name" >&2
  ( while sleep 15; do echo ">>   still building $name: $((SECONDS - start))s so far" >&2; done ) &
  local ticker=$!
  local rc=0
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  if ((rc == 0)); then echo ">>   $name built in $((SECONDS - start))s" >&2; fi
  return "$rc"
}

assets=$(hack/testbin.sh)
building bin/watchgate make --no-print-directory build >/dev/null
building "the demo (hack/demo, first time: its modules are downloaded and compiled)" \
  bash -c 'cd hack/demo && go build -o "$1/bin/demo" .' _ "$root"
export KUBEBUILDER_ASSETS=$assets
exec bin/demo --watchgate "$root/bin/watchgate" "$@"
