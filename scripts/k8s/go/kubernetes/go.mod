module caldera.local/k8s/kubernetes

go 1.26
