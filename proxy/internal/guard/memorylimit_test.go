package guard

import (
	"math"
	"testing"
	"testing/fstest"
)

func files(kv ...string) fstest.MapFS {
	m := fstest.MapFS{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = &fstest.MapFile{Data: []byte(kv[i+1])}
	}
	return m
}

const meminfo = "MemTotal:       24683664 kB\nMemFree:         1000000 kB\n"

func TestMemoryLimitFrom(t *testing.T) {
	unset := int64(math.MaxInt64)
	const physical = 24683664 << 10
	for name, tc := range map[string]struct {
		goMemLimit int64
		off        bool
		fs         fstest.MapFS
		want       MemoryLimit
	}{
		"GOMEMLIMIT wins over the cgroup": {
			goMemLimit: 460 << 20,
			fs:         files("proc/self/cgroup", "0::/\n", "sys/fs/cgroup/memory.max", "536870912\n"),
			want:       MemoryLimit{Source: MemoryLimitFromGoMemLimit, Bytes: 460 << 20, GoMemLimit: 460 << 20},
		},
		"a container's own cgroup v2 namespace: 90% of its limit for the runtime": {
			goMemLimit: unset,
			fs:         files("proc/self/cgroup", "0::/\n", "sys/fs/cgroup/memory.max", "536870912\n", "proc/meminfo", meminfo),
			want:       MemoryLimit{Source: MemoryLimitFromCgroup, Bytes: 512 << 20, GoMemLimit: 483183820, PhysicalBytes: physical},
		},
		"cgroup v2: the pod's limit under a container without one": {
			goMemLimit: unset,
			fs: files("proc/self/cgroup", "0::/kubepods.slice/pod1/ctr\n",
				"sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.max", "max\n",
				"sys/fs/cgroup/kubepods.slice/pod1/memory.max", "1073741824\n",
				"sys/fs/cgroup/kubepods.slice/memory.max", "2147483648\n"),
			want: MemoryLimit{Source: MemoryLimitFromCgroup, Bytes: 1 << 30, GoMemLimit: 966367641},
		},
		"cgroup v2 without a limit: the fallback": {
			goMemLimit: unset,
			fs:         files("proc/self/cgroup", "0::/user.slice\n", "sys/fs/cgroup/user.slice/memory.max", "max\n", "proc/meminfo", meminfo),
			want:       MemoryLimit{Source: MemoryLimitFromFallback, Bytes: 512 << 20, GoMemLimit: 483183820, PhysicalBytes: physical},
		},
		"cgroup v1 (hybrid), the process's own memory cgroup under an unlimited root": {
			goMemLimit: unset,
			fs: files("proc/self/cgroup", "4:memory:/process_api/34ef\n3:cpuset:/\n0::/\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n",
				"sys/fs/cgroup/memory/process_api/34ef/memory.limit_in_bytes", "268435456\n",
				"proc/meminfo", meminfo),
			want: MemoryLimit{Source: MemoryLimitFromCgroup, Bytes: 256 << 20, GoMemLimit: 241591910, PhysicalBytes: physical},
		},
		"cgroup v1 without a cgroup namespace: the host's path is not mounted, the mount's root is the container's": {
			goMemLimit: unset,
			fs: files("proc/self/cgroup", "9:memory,kmem:/docker/abc\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes", "536870912\n"),
			want: MemoryLimit{Source: MemoryLimitFromCgroup, Bytes: 512 << 20, GoMemLimit: 483183820},
		},
		"cgroup v1 unlimited everywhere (this machine's kind): the fallback, not 24 GiB": {
			goMemLimit: unset,
			fs: files("proc/self/cgroup", "4:memory:/\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n", "proc/meminfo", meminfo),
			want: MemoryLimit{Source: MemoryLimitFromFallback, Bytes: 512 << 20, GoMemLimit: 483183820, PhysicalBytes: physical},
		},
		"no limit on a small machine: a quarter of its memory": {
			goMemLimit: unset,
			fs:         files("proc/meminfo", "MemTotal:        1048576 kB\n"),
			want:       MemoryLimit{Source: MemoryLimitFromFallback, Bytes: 256 << 20, GoMemLimit: 241591910, PhysicalBytes: 1 << 30},
		},
		"a path that climbs out of the mount is read at the mount only": {
			goMemLimit: unset,
			fs: files("proc/self/cgroup", "0::/../../etc\n", "sys/fs/cgroup/memory.max", "536870912\n",
				"etc/memory.max", "1024\n"),
			want: MemoryLimit{Source: MemoryLimitFromCgroup, Bytes: 512 << 20, GoMemLimit: 483183820},
		},
		"garbage everywhere: the fallback": {
			goMemLimit: unset,
			fs: files("proc/self/cgroup", "nonsense\n0::/\n", "sys/fs/cgroup/memory.max", "lots\n",
				"proc/meminfo", "MemTotal: many\n"),
			want: MemoryLimit{Source: MemoryLimitFromFallback, Bytes: 512 << 20, GoMemLimit: 483183820},
		},
		"GOMEMLIMIT=off: none for the runtime, the cgroup's for the cap": {
			goMemLimit: unset, off: true,
			fs:   files("proc/self/cgroup", "0::/\n", "sys/fs/cgroup/memory.max", "536870912\n"),
			want: MemoryLimit{Source: MemoryLimitOff, Bytes: 512 << 20, GoMemLimit: 483183820},
		},
		"nothing to read: the fallback": {
			goMemLimit: unset, fs: files(),
			want: MemoryLimit{Source: MemoryLimitFromFallback, Bytes: 512 << 20, GoMemLimit: 483183820},
		},
	} {
		t.Run(name, func(t *testing.T) {
			if got := memoryLimitFrom(tc.goMemLimit, tc.off, tc.fs); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The process sets the runtime's limit only where nobody chose one.
func TestSetsRuntimeLimit(t *testing.T) {
	for source, want := range map[string]bool{
		MemoryLimitFromGoMemLimit: false, MemoryLimitFromCgroup: true, MemoryLimitFromFallback: true, MemoryLimitOff: false,
	} {
		if got := (MemoryLimit{Source: source}).SetsRuntimeLimit(); got != want {
			t.Errorf("from %s: SetsRuntimeLimit() = %v, want %v", source, got, want)
		}
	}
}

func TestMaxWatchesFor(t *testing.T) {
	unset := int64(math.MaxInt64)
	for name, tc := range map[string]struct {
		limit MemoryLimit
		want  int
	}{
		"the chart's default replica (GOMEMLIMIT 460 MiB of 512Mi): the chart's 15,596": {
			MemoryLimit{Source: MemoryLimitFromGoMemLimit, Bytes: 460 << 20, GoMemLimit: 460 << 20}, 15596,
		},
		"GOMEMLIMIT 1 GiB: (1024 − 64) MiB ÷ 26 KiB": {MemoryLimit{Source: MemoryLimitFromGoMemLimit, Bytes: 1 << 30, GoMemLimit: 1 << 30}, 37809},
		"the chart with a 1Gi limit (GOMEMLIMIT 921 MiB)": {
			MemoryLimit{Source: MemoryLimitFromGoMemLimit, Bytes: 921 << 20, GoMemLimit: 921 << 20}, 33752,
		},
		"a 512Mi cgroup without GOMEMLIMIT: as the chart's, within rounding": {
			memoryLimitFrom(unset, false, files("proc/self/cgroup", "0::/\n", "sys/fs/cgroup/memory.max", "536870912\n")), 15627,
		},
		"a 24 GiB machine without any limit: the fallback's cap, not 472,167": {
			memoryLimitFrom(unset, false, files("proc/self/cgroup", "0::/\n", "sys/fs/cgroup/memory.max", "max\n", "proc/meminfo", meminfo)), 15627,
		},
		"a 1 TiB machine without any limit: the same": {
			memoryLimitFrom(unset, false, files("proc/meminfo", "MemTotal: 1073741824 kB\n")), 15627,
		},
		"a limit under the process's own share: the minimum": {MemoryLimit{Source: MemoryLimitFromGoMemLimit, Bytes: 32 << 20, GoMemLimit: 32 << 20}, minMaxWatches},
		"a limit just over it: the minimum":                  {MemoryLimit{Source: MemoryLimitFromGoMemLimit, Bytes: 65 << 20, GoMemLimit: 65 << 20}, minMaxWatches},
		"none (the zero MemoryLimit): the minimum":           {MemoryLimit{}, minMaxWatches},
	} {
		t.Run(name, func(t *testing.T) {
			if got := MaxWatchesFor(tc.limit); got != tc.want {
				t.Errorf("MaxWatchesFor(%+v) = %d, want %d", tc.limit, got, tc.want)
			}
		})
	}
}
