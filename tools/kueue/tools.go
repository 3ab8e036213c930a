//go:build tools

// Package tools pins the Kueue release the operator's queue integration is tested against.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
