// Command pause is the real node's pod sandbox process: it holds the pod's namespaces and does nothing else,
// like the upstream pause image's C program (build/pause/linux/pause.c). It exits on SIGINT or SIGTERM and
// reaps children, which matters when a pod shares its process namespace and pause is its PID 1.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
