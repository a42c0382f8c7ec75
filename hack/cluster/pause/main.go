// Command pause is the cluster's pod sandbox program, what
// registry.k8s.io/pause is to a node that pulls: the first process of every
// pod, holding its namespaces. It reaps the zombies the pod's processes leave
// (it is their init when the pod shares its PID namespace) and exits on
// SIGINT or SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
