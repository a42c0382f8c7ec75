// Command etcd is the etcd server of the test bed: etcdmain.Main is the whole
// etcd binary, pinned to the version k8s.io/kubernetes requires.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
