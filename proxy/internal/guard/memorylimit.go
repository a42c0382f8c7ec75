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
	MemoryLimitFromFallback   = "fallback"
	// MemoryLimitOff is GOMEMLIMIT=off, Go's spelling of "no limit": the
	// process leaves its runtime without one, so the memory guard does not
	// check; Bytes and GoMemLimit are what the cgroup or the fallback
	// give, for the watch cap.
	MemoryLimitOff = "GOMEMLIMIT=off"
)

const (
	// fallbackMemoryBytes is the memory a process is taken to run under
	// when neither GOMEMLIMIT nor a cgroup sets a limit (a developer's
	// machine, a VM, a pod without resources.limits.memory): it shares
	// the machine with everything else and nothing says what its share
	// is. Deriving the cap from the whole machine would give one replica
	// 470,000 watches on 24 GiB and millions on a large node, so that the
	// cap per caller and the fair share bound nothing and the process
	// grows until the kernel or the kubelet kills it. 512 MiB is the
	// memory watchgate is sized and load-tested at (a cap of 15,627
	// watches), enough for a replica of an ordinary cluster; an operator
	// who wants more sets GOMEMLIMIT or a memory limit, which the
	// start-up log tells.
	fallbackMemoryBytes = 512 << 20
	// fallbackPhysicalDivisor bounds the fallback on a small machine: at
	// most a quarter of its memory.
	fallbackPhysicalDivisor = 4
	// goMemLimitPercent is the Go runtime's soft limit, in percent of a
	// cgroup's limit or the fallback, when GOMEMLIMIT is unset; the rest
	// is for memory the runtime does not count (the binary's pages, the
	// kernel's per-socket buffers), as the chart's
	// memory.goMemLimitPercent.
	goMemLimitPercent = 90
)

// MemoryLimit is the memory a process runs under, where it was found, and
// the Go runtime's soft limit that the watch cap (MaxWatchesFor) and the
// memory guard count against.
type MemoryLimit struct {
	// Source is where Bytes comes from: MemoryLimitFromGoMemLimit,
	// MemoryLimitFromCgroup, MemoryLimitFromFallback or MemoryLimitOff.
	Source string
	// Bytes is the limit: GOMEMLIMIT, the cgroup's memory limit, or the
	// fallback.
	Bytes uint64
	// GoMemLimit is the Go runtime's soft memory limit: GOMEMLIMIT as
	// set, else goMemLimitPercent of Bytes, which the process must set
	// (debug.SetMemoryLimit; SetsRuntimeLimit) for the memory guard to
	// read it.
	GoMemLimit uint64
	// PhysicalBytes is the machine's memory (MemTotal), 0 when unread;
	// read only without GOMEMLIMIT.
	PhysicalBytes uint64
}

// Why says in a sentence where l comes from, for the start-up log.
func (l MemoryLimit) Why() string {
	switch l.Source {
	case MemoryLimitFromGoMemLimit:
		return "GOMEMLIMIT is set"
	case MemoryLimitFromCgroup:
		return "no GOMEMLIMIT: the Go runtime's limit is set to 90% of the cgroup's memory limit"
	case MemoryLimitFromFallback:
		return "no GOMEMLIMIT and no cgroup memory limit: 512 MiB (at most a quarter of physical memory) is assumed and the Go runtime's limit set to 90% of it; set GOMEMLIMIT or a memory limit to change it"
	case MemoryLimitOff:
		return "GOMEMLIMIT=off: the Go runtime has no memory limit and the memory guard does not check; the watch cap counts 90% of the cgroup's memory limit, else of 512 MiB"
	}
	return "unknown"
}

// SetsRuntimeLimit reports whether the process should set the Go
// runtime's memory limit to GoMemLimit: when it came from the cgroup or
// the fallback, not from GOMEMLIMIT or GOMEMLIMIT=off.
func (l MemoryLimit) SetsRuntimeLimit() bool {
	return l.Source == MemoryLimitFromCgroup || l.Source == MemoryLimitFromFallback
}

// ProcessMemoryLimit is the memory this process runs under: GOMEMLIMIT
// (or debug.SetMemoryLimit) when set, else its cgroup's memory limit (v2
// memory.max, v1 memory.limit_in_bytes, the smallest on the way from its
// cgroup to the root), else the fallback: 512 MiB, or a quarter of the
// machine's physical memory when that is less. Without GOMEMLIMIT the
// process should set the runtime's limit to GoMemLimit
// (SetsRuntimeLimit); GOMEMLIMIT=off says it should not.
func ProcessMemoryLimit() MemoryLimit {
	return memoryLimitFrom(debug.SetMemoryLimit(-1), strings.TrimSpace(os.Getenv("GOMEMLIMIT")) == "off", os.DirFS("/"))
}

// memoryLimitFrom is ProcessMemoryLimit with GOMEMLIMIT (math.MaxInt64:
// unset; off: GOMEMLIMIT=off) and the file system (proc/self/cgroup,
// sys/fs/cgroup, proc/meminfo) as parameters.
func memoryLimitFrom(goMemLimit int64, off bool, root fs.FS) MemoryLimit {
	if goMemLimit > 0 && goMemLimit < math.MaxInt64 {
		return MemoryLimit{Source: MemoryLimitFromGoMemLimit, Bytes: uint64(goMemLimit), GoMemLimit: uint64(goMemLimit)}
	}
	l := MemoryLimit{Source: MemoryLimitFromFallback, Bytes: fallbackMemoryBytes}
	l.PhysicalBytes, _ = physicalMemory(root)
	if b, ok := cgroupMemoryLimit(root); ok {
		l.Source, l.Bytes = MemoryLimitFromCgroup, b
	} else if l.PhysicalBytes > 0 {
		l.Bytes = min(l.Bytes, l.PhysicalBytes/fallbackPhysicalDivisor)
	}
	// goMemLimitPercent of Bytes, rounded down, without overflow.
	l.GoMemLimit = l.Bytes/100*goMemLimitPercent + l.Bytes%100*goMemLimitPercent/100
	if off {
		l.Source = MemoryLimitOff
	}
	return l
}

// MaxWatchesFor is the default of --max-watches for a process whose Go
// runtime runs under l.GoMemLimit (ProcessMemoryLimit):
//
//	(GoMemLimit − 64 MiB) ÷ 26 KiB
//
// at least 100. The collector works to keep the heap within GoMemLimit,
// and the memory guard (--memory-high-water-percent, 85% of it) refuses
// before it: the cap leaves the guard room for garbage, so that a full
// replica answers 429 MaxWatches rather than 503. With GoMemLimit at 90%
// of a container's memory limit that is about 33,000 watches per GiB of
// limit; without any limit, the fallback's (512 MiB) 15,627.
func MaxWatchesFor(l MemoryLimit) int {
	if l.GoMemLimit <= baseMemoryBytes {
		return minMaxWatches
	}
	return int(max(minMaxWatches, min((l.GoMemLimit-baseMemoryBytes)/watchMemoryBytes, math.MaxInt32)))
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
