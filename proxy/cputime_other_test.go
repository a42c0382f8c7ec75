//go:build !unix

package proxy

import "time"

// cpuTime is unknown on this platform.
func cpuTime() time.Duration { return 0 }
