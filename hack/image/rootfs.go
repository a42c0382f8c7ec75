package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// entry is one file or folder of a layer, owned by root.
type entry struct {
	// path is absolute; a folder's has no trailing slash.
	path string
	// mode is the permission bits, with fs.ModeDir for a folder and
	// fs.ModeSticky where it applies.
	mode fs.FileMode
	data []byte
}

func dir(path string, perm fs.FileMode) entry { return entry{path: path, mode: fs.ModeDir | perm} }

func file(path string, perm fs.FileMode, data []byte) entry {
	return entry{path: path, mode: perm, data: data}
}

// describe is the entry as describe prints it.
func (e entry) describe() describedFile {
	mode := fmt.Sprintf("%04o", e.mode.Perm())
	if e.mode&fs.ModeSticky != 0 {
		mode = fmt.Sprintf("%04o", 0o1000|e.mode.Perm())
	}
	if e.mode.IsDir() {
		return describedFile{Path: e.path + "/", Mode: mode}
	}
	sum := sha256.Sum256(e.data)
	return describedFile{Path: e.path, Mode: mode, SHA256: hex.EncodeToString(sum[:])}
}

// The users and groups of distroless's static image, with the same ids, so
// that a file owned by 65532 elsewhere (a volume) shows as nonroot. There is
// no home folder: the root filesystem is read-only in the chart, and the
// binary needs none.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\n" +
		"nobody:x:65534:\n" +
		"nonroot:x:65532:\n"
	// nsswitch tells Go's resolver to read /etc/hosts (which the kubelet
	// writes) before asking DNS, as glibc-based images do.
	nsswitch = "hosts: files dns\n"
)

// caBundlePath is where Go's crypto/x509 looks first on Linux.
const caBundlePath = "/etc/ssl/certs/ca-certificates.crt"

// licensePath is where the image carries watchgate's licence.
const licensePath = "/usr/share/doc/watchgate/LICENSE"

// baseFiles are what the image holds besides the binary, in the order of
// the layer (a folder before its content): what a distroless static base
// would give a static Go binary, and no shell. license is the repository's
// LICENSE.
func baseFiles(license []byte) []entry {
	return []entry{
		dir("/etc", 0o755),
		file("/etc/group", 0o644, []byte(group)),
		file("/etc/nsswitch.conf", 0o644, []byte(nsswitch)),
		file("/etc/passwd", 0o644, []byte(passwd)),
		dir("/etc/ssl", 0o755),
		dir("/etc/ssl/certs", 0o755),
		file(caBundlePath, 0o644, caBundle()),
		// Where an emptyDir is mounted in the chart; world-writable with the
		// sticky bit when the root filesystem is writable, as in distroless.
		dir("/tmp", fs.ModeSticky|0o777),
		dir("/usr", 0o755),
		dir("/usr/share", 0o755),
		dir("/usr/share/doc", 0o755),
		dir("/usr/share/doc/watchgate", 0o755),
		file(licensePath, 0o644, license),
	}
}

// writeRootfs writes entries under root (which must not exist yet; its
// parents are created), with their modes, for a Dockerfile to copy into a
// FROM scratch stage.
func writeRootfs(root string, entries []entry) error {
	if err := os.MkdirAll(filepath.Dir(root), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(root, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(root, filepath.FromSlash(strings.TrimPrefix(e.path, "/")))
		var err error
		if e.mode.IsDir() {
			err = os.Mkdir(p, 0o700)
		} else {
			err = os.WriteFile(p, e.data, 0o600)
		}
		if err != nil {
			return err
		}
		// Chmod after creating: the umask does not apply to it.
		if err := os.Chmod(p, e.mode&(fs.ModePerm|fs.ModeSticky)); err != nil {
			return err
		}
	}
	return nil
}
