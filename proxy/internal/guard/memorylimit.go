package guard

import (
	"bufio"
	"bytes"
	"io/fs"
	"math"
	"os"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
)

// Sources of a MemoryLimit.
const (
	MemoryLimitFromGoMemLimit = "GOMEMLIMIT"
	MemoryLimitFromCgroup     = "cgroup"
	MemoryLimitFromPhysical   = "physical memory"
)

// MemoryLimit is the memory a process runs under and where it was found;
// Bytes 0 when nothing says.
type MemoryLimit struct {
	Bytes  uint64
	Source string
}

// ProcessMemoryLimit is the memory this process runs under: GOMEMLIMIT
// (or debug.SetMemoryLimit) when set, else its cgroup's memory limit (v2
// memory.max, v1 memory.limit_in_bytes, the smallest on the way from its
// cgroup to the root), else the machine's physical memory.
func ProcessMemoryLimit() MemoryLimit {
	return memoryLimitFrom(debug.SetMemoryLimit(-1), os.DirFS("/"))
}

// memoryLimitFrom is ProcessMemoryLimit with GOMEMLIMIT (math.MaxInt64:
// unset) and the file system (proc/self/cgroup, sys/fs/cgroup,
// proc/meminfo) as parameters.
func memoryLimitFrom(goMemLimit int64, root fs.FS) MemoryLimit {
	if goMemLimit > 0 && goMemLimit < math.MaxInt64 {
		return MemoryLimit{Bytes: uint64(goMemLimit), Source: MemoryLimitFromGoMemLimit}
	}
	if b, ok := cgroupMemoryLimit(root); ok {
		return MemoryLimit{Bytes: b, Source: MemoryLimitFromCgroup}
	}
	if b, ok := physicalMemory(root); ok {
		return MemoryLimit{Bytes: b, Source: MemoryLimitFromPhysical}
	}
	return MemoryLimit{}
}

// cgroupMemoryLimit reads the memory limit of the process's cgroup from
// /proc/self/cgroup and the cgroup file system under /sys/fs/cgroup, v2
// (the "0::" line, memory.max; "max" is none) and v1 (the line naming the
// memory controller, memory/…/memory.limit_in_bytes; values from 2^62 up
// are none). A cgroup is held to its ancestors' limits too, so the limit
// is the smallest found on the way from the process's cgroup to the
// mount's root; in a container without its own cgroup namespace the
// process's path does not exist under the mount, and only the root is
// read. false when no limit is set.
func cgroupMemoryLimit(root fs.FS) (uint64, bool) {
	self, err := fs.ReadFile(root, "proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	limit, found := uint64(math.MaxUint64), false
	take := func(b uint64, ok bool) {
		if ok && b < limit {
			limit, found = b, true
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(self))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		id, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		controllers, cgroupPath, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		switch {
		case id == "0" && controllers == "":
			take(smallestOnPath(root, "sys/fs/cgroup", cgroupPath, "memory.max"))
		case hasController(controllers, "memory"):
			take(smallestOnPath(root, "sys/fs/cgroup/memory", cgroupPath, "memory.limit_in_bytes"))
		}
	}
	return limit, found
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// smallestOnPath reads file in mount/cgroupPath and each of its parents
// up to mount and returns the smallest limit set.
func smallestOnPath(root fs.FS, mount, cgroupPath, file string) (uint64, bool) {
	limit, found := uint64(math.MaxUint64), false
	dir := path.Join(mount, path.Clean("/" + cgroupPath)[1:])
	for {
		if b, ok := readCgroupLimit(root, path.Join(dir, file)); ok && b < limit {
			limit, found = b, true
		}
		if dir == mount || !strings.HasPrefix(dir, mount+"/") {
			return limit, found
		}
		dir = path.Dir(dir)
	}
}

// readCgroupLimit parses one limit file: a byte count, "max" (v2) or a
// v1 "unlimited" (2^63 rounded down to the page size) as none.
func readCgroupLimit(root fs.FS, name string) (uint64, bool) {
	b, err := fs.ReadFile(root, name)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v == 0 || v >= 1<<62 {
		return 0, false
	}
	return v, true
}

// physicalMemory is MemTotal of /proc/meminfo.
func physicalMemory(root fs.FS) (uint64, bool) {
	b, err := fs.ReadFile(root, "proc/meminfo")
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "MemTotal:")
		if !ok {
			continue
		}
		kb, ok := strings.CutSuffix(strings.TrimSpace(rest), " kB")
		if !ok {
			return 0, false
		}
		v, err := strconv.ParseUint(strings.TrimSpace(kb), 10, 64)
		if err != nil || v == 0 {
			return 0, false
		}
		return v << 10, true
	}
	return 0, false
}
