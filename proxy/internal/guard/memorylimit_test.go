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
	for name, tc := range map[string]struct {
		goMemLimit int64
		fs         fstest.MapFS
		want       MemoryLimit
	}{
		"GOMEMLIMIT wins over the cgroup": {
			goMemLimit: 460 << 20,
			fs:         files("proc/self/cgroup", "0::/\n", "sys/fs/cgroup/memory.max", "536870912\n"),
			want:       MemoryLimit{460 << 20, MemoryLimitFromGoMemLimit},
		},
		"a container's own cgroup v2 namespace": {
			goMemLimit: unset,
			fs:         files("proc/self/cgroup", "0::/\n", "sys/fs/cgroup/memory.max", "536870912\n", "proc/meminfo", meminfo),
			want:       MemoryLimit{512 << 20, MemoryLimitFromCgroup},
		},
		"cgroup v2: the pod's limit under a container without one": {
			goMemLimit: unset,
			fs: files("proc/self/cgroup", "0::/kubepods.slice/pod1/ctr\n",
				"sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.max", "max\n",
				"sys/fs/cgroup/kubepods.slice/pod1/memory.max", "1073741824\n",
				"sys/fs/cgroup/kubepods.slice/memory.max", "2147483648\n"),
			want: MemoryLimit{1 << 30, MemoryLimitFromCgroup},
		},
		"cgroup v2 without a limit: physical memory": {
			goMemLimit: unset,
			fs:         files("proc/self/cgroup", "0::/user.slice\n", "sys/fs/cgroup/user.slice/memory.max", "max\n", "proc/meminfo", meminfo),
			want:       MemoryLimit{24683664 << 10, MemoryLimitFromPhysical},
		},
		"cgroup v1 (hybrid), the process's own memory cgroup under an unlimited root": {
			goMemLimit: unset,
			fs: files("proc/self/cgroup", "4:memory:/process_api/34ef\n3:cpuset:/\n0::/\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n",
				"sys/fs/cgroup/memory/process_api/34ef/memory.limit_in_bytes", "268435456\n",
				"proc/meminfo", meminfo),
			want: MemoryLimit{256 << 20, MemoryLimitFromCgroup},
		},
		"cgroup v1 without a cgroup namespace: the host's path is not mounted, the mount's root is the container's": {
			goMemLimit: unset,
			fs: files("proc/self/cgroup", "9:memory,kmem:/docker/abc\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes", "536870912\n"),
			want: MemoryLimit{512 << 20, MemoryLimitFromCgroup},
		},
		"cgroup v1 unlimited everywhere: physical memory": {
			goMemLimit: unset,
			fs: files("proc/self/cgroup", "4:memory:/\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n", "proc/meminfo", meminfo),
			want: MemoryLimit{24683664 << 10, MemoryLimitFromPhysical},
		},
		"a path that climbs out of the mount is read at the mount only": {
			goMemLimit: unset,
			fs: files("proc/self/cgroup", "0::/../../etc\n", "sys/fs/cgroup/memory.max", "536870912\n",
				"etc/memory.max", "1024\n"),
			want: MemoryLimit{512 << 20, MemoryLimitFromCgroup},
		},
		"garbage everywhere: unknown": {
			goMemLimit: unset,
			fs: files("proc/self/cgroup", "nonsense\n0::/\n", "sys/fs/cgroup/memory.max", "lots\n",
				"proc/meminfo", "MemTotal: many\n"),
			want: MemoryLimit{},
		},
		"nothing to read: unknown": {goMemLimit: unset, fs: files(), want: MemoryLimit{}},
	} {
		t.Run(name, func(t *testing.T) {
			if got := memoryLimitFrom(tc.goMemLimit, tc.fs); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestMaxWatchesFor(t *testing.T) {
	for name, tc := range map[string]struct {
		limit MemoryLimit
		want  int
	}{
		"the chart's default replica (GOMEMLIMIT 460 MiB of 512Mi) gets DefaultMaxWatches": {
			MemoryLimit{460 << 20, MemoryLimitFromGoMemLimit}, DefaultMaxWatches,
		},
		"GOMEMLIMIT 1 GiB: (1024 − 64) MiB ÷ 26 KiB":      {MemoryLimit{1 << 30, MemoryLimitFromGoMemLimit}, 37809},
		"the chart with a 1Gi limit (GOMEMLIMIT 921 MiB)": {MemoryLimit{921 << 20, MemoryLimitFromGoMemLimit}, 33752},
		"a 1 GiB cgroup without GOMEMLIMIT counts half":   {MemoryLimit{1 << 30, MemoryLimitFromCgroup}, 17644},
		"a large machine without any limit admits 10,000 and more": {
			MemoryLimit{16 << 30, MemoryLimitFromPhysical}, 320118,
		},
		"a limit under the process's own share: the minimum": {MemoryLimit{32 << 20, MemoryLimitFromGoMemLimit}, minMaxWatches},
		"a limit just over it: the minimum":                  {MemoryLimit{65 << 20, MemoryLimitFromGoMemLimit}, minMaxWatches},
		"unknown: DefaultMaxWatches":                         {MemoryLimit{}, DefaultMaxWatches},
	} {
		t.Run(name, func(t *testing.T) {
			if got := MaxWatchesFor(tc.limit); got != tc.want {
				t.Errorf("MaxWatchesFor(%+v) = %d, want %d", tc.limit, got, tc.want)
			}
		})
	}
	if DefaultMaxWatches != 15596 {
		t.Errorf("DefaultMaxWatches = %d; the chart's docs say 15,596", DefaultMaxWatches)
	}
}
