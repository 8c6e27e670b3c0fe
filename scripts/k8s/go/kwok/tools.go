//go:build tools

// Package tools pins the kwok command scripts/k8s/build compiles.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
