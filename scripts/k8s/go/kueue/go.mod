module caldera.local/k8s/kueue

go 1.26
