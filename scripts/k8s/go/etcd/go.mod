module caldera.local/k8s/etcd

go 1.26
