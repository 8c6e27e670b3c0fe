//go:build tools

// Package tools pins the Kueue manager scripts/k8s/build compiles.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
