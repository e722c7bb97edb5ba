// Command pause is the sandbox ("pause") image of the local cluster's pods
// (docs/dev/cluster.md#images): the first process of every pod, it holds the pod's namespaces
// until the kubelet stops the pod. It waits for SIGTERM or SIGINT and exits 0.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
