#!/usr/bin/env bash
# testbin.sh builds the test bed's control plane — kube-apiserver and kubectl
# from k8s.io/kubernetes, etcd from go.etcd.io/etcd/server/v3 — from the pinned
# module in hack/testbin, into a folder keyed by version outside the clone.
# It prints that folder on stdout (and nothing else), so callers can do
#   KUBEBUILDER_ASSETS=$(hack/testbin.sh)
# A cold build takes ~8 minutes on 2 cores; later runs find the binaries and
# return at once. Progress goes to stderr.
set -euo pipefail

KUBE_VERSION=v1.37.2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${WATCHGATE_TESTBIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/watchgate/testbin}
dir=$cache/$KUBE_VERSION

if [[ -x $dir/kube-apiserver && -x $dir/etcd && -x $dir/kubectl && -f $dir/.complete ]]; then
  echo "$dir"
  exit 0
fi

mkdir -p "$dir"
tmp=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

echo ">> building the test bed (kube-apiserver, etcd, kubectl $KUBE_VERSION) into $dir" >&2
echo ">> a cold build takes ~8 minutes on 2 cores; later runs reuse it" >&2
cd "$here/testbin"
start=$(date +%s)
# A ticker tells a newcomer every 15 s what is being built and for how long,
# on stderr: stdout stays exactly the folder.
progress=$tmp/.building
ticker() {
  while sleep 15; do
    echo ">>   still building $(cat "$progress" 2>/dev/null): $(( $(date +%s) - start ))s so far" >&2
  done
}
ticker >&2 &  # not on stdout: `$(hack/testbin.sh)` would wait for it
ticker_pid=$!
# set -e applies inside the trap too: the ticker is usually gone by then.
trap 'kill "$ticker_pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
for target in k8s.io/kubernetes/cmd/kube-apiserver ./etcd k8s.io/kubernetes/cmd/kubectl; do
  name=$(basename "$target")
  echo "$name" >"$progress"
  echo ">>   go build $name ($(( $(date +%s) - start ))s elapsed)" >&2
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/$name" "$target"
done
kill "$ticker_pid" 2>/dev/null || true
mv "$tmp"/kube-apiserver "$tmp"/etcd "$tmp"/kubectl "$dir"/
touch "$dir/.complete"
echo ">> test bed ready in $(( $(date +%s) - start ))s: $dir" >&2
echo "$dir"
