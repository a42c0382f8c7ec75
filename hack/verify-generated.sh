#!/usr/bin/env bash
# verify-generated.sh fails when a generated file is stale: it copies the
# sources (tracked and untracked files, not ignored ones) into a temporary
# folder, runs `make manifests generate` there and compares what came out
# with the tree. The tree itself is left as it is; the remedy for a failure
# is `make manifests generate` and a commit of the result.
#
# Generated: config/crd/bases, config/rbac, config/webhook/rbac (the CRD and
# RBAC from markers), the chart's copies of them (sync-generated.sh),
# api/v1alpha1's deepcopy code and its apply configurations.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
generated=(
  config/crd/bases
  config/rbac
  config/webhook/rbac
  charts/watchgate/templates
  api/v1alpha1
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$root"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [[ -e $f ]] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$tmp"

make -s -C "$tmp" manifests generate >"$tmp/.make.log" 2>&1 || {
  cat "$tmp/.make.log" >&2
  echo "verify-generated: make manifests generate failed" >&2
  exit 1
}
stale=0
for d in "${generated[@]}"; do
  if ! out=$(diff -r "$root/$d" "$tmp/$d"); then
    echo "$out" | sed "s#$tmp/##g; s#$root/##g" >&2
    stale=1
  fi
done
if ((stale)); then
  echo "verify-generated: generated files are stale: run make manifests generate and commit the result" >&2
  exit 1
fi
echo "generated files are fresh"
