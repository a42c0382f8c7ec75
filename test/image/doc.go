// Package image tests the container image as the chart runs it, on a
// machine without a container engine.
//
// The image is the one `make image` builds (hack/image, a module of its own
// with go-containerregistry); this package reads it with the standard
// library only. Building the linux/amd64 image of the current sources takes
// a few minutes the first time; it is cached under
// ${XDG_CACHE_HOME:-~/.cache}/watchgate/image/, keyed by the content of
// everything it is built from (the binary's Go files, go.mod, go.sum,
// LICENSE, hack/image, the Go version), so later runs find it at once.
//
// The tests check:
//
//   - the image runs as the chart's Deployment runs it: its layers unpacked
//     into a folder (every entry owned by root), which is then made
//     read-only (readOnlyRootFilesystem); the chart's volumes provided where
//     the Deployment mounts them (the emptyDir, the TLS Secret from the
//     installed release, the service-account token of the chart's
//     ServiceAccount with the chart's RBAC); the image's entrypoint started
//     with the Deployment's arguments and environment, chrooted into the
//     folder as the Deployment's user and groups, with the in-cluster
//     environment (KUBERNETES_SERVICE_HOST/PORT) pointing at the test bed.
//     It must turn ready, pass a watch, and answer a watch from a
//     resourceVersion the API server already called too old with 410
//     Expired, learning that version. What a process cannot emulate: the
//     pod's network namespace (each container port is mapped to a free
//     loopback port, the only change to the arguments), /proc and /dev
//     inside the root, seccomp and capability settings (the user is not
//     root, so it holds no capability anyway);
//   - the SBOM beside the image lists exactly the modules the image's
//     binary was built from (debug/buildinfo, what `go version -m` prints)
//     and the binary's SHA-256;
//   - the linux/arm64 image's binary is an ARM64 ELF file: from bin/image
//     when `make image` wrote it, else from a cached build of that platform.
//
// It needs root (chroot and setuid); run as another user, the tests that
// run the image skip.
package image
