module caldera.local/k8s/kwok

go 1.26
