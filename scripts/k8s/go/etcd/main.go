// Command etcd runs etcd's server main, built from the Go module proxy for Caldera's test cluster.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
