#!/usr/bin/env bash
# demo.sh is `make demo`: build the test bed (cached) and watchgate, then run
# hack/demo, which starts a real control plane, puts watchgate in front and
# shows a watch storm being stopped. It stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
assets=$(hack/testbin.sh)
echo ">> building bin/watchgate"
make --no-print-directory build >/dev/null
export KUBEBUILDER_ASSETS=$assets
exec go run ./hack/demo "$@"
