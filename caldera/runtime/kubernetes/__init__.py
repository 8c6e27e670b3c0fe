"""Kubernetes backend: jobs become batch/v1 Jobs that Kueue admits and kube-scheduler places (README "Kubernetes")."""
