// Command image is `make image`: it builds watchgate's container image
// without a container engine, for linux/amd64 and linux/arm64, and writes
// into bin/image:
//
//	oci/                              an OCI image layout: index.json names one
//	                                  image index (tag in org.opencontainers.image.ref.name)
//	                                  whose manifests are the platforms' images
//	watchgate-linux-amd64.tar         a tarball per platform, tagged <repository>:<version>:
//	watchgate-linux-arm64.tar         a `docker save` archive (docker load, crane push) that
//	                                  is an OCI layout too (skopeo's oci-archive:, containerd)
//	watchgate-linux-amd64.spdx.json   an SPDX 2.3 SBOM per platform: the Go modules
//	watchgate-linux-arm64.spdx.json   compiled into its binary, read back from the binary
//
// The tour, one concept a file:
//
//   - spec.go: what every platform's image is — user 65532, entrypoint,
//     ports, environment, the OCI labels, the `go build` flags — and
//     -describe, which prints it for the test that keeps the Dockerfile in
//     agreement (test/packaging);
//   - rootfs.go: the base files in place of a base image: /etc/passwd and
//     /etc/group with the nonroot user, /etc/nsswitch.conf, the CA bundle
//     (cabundle.go: Mozilla's roots as golang.org/x/crypto/x509roots/fallback
//     ships them), the licence, /tmp; -rootfs writes them into a folder for
//     the Dockerfile's FROM scratch stage;
//   - layer.go: a reproducible tar.gz layer (sorted, owned by root, one
//     fixed time);
//   - binary.go: the static binary per platform (CGO_ENABLED=0);
//   - sbom.go: the SPDX document from the binary's build information (what
//     `go version -m` prints);
//   - assemble.go: the images, the index and the layout; archive.go: the
//     tarballs.
//
// The only network it needs is the Go module proxy (for its own modules and
// the product's). Every time in the output is SOURCE_DATE_EPOCH (default:
// the commit time of HEAD), and nothing else varies, so one commit built
// with one Go toolchain gives one digest.
package main
