"""Kubernetes backend: jobs as Kubernetes Jobs, admitted by Kueue."""
