//go:build unix && !linux

package redistest

import "syscall"

// sysProcAttr returns nil: outside Linux a server that loses its test binary
// keeps running until killed (StopShared stops the shared ones).
func sysProcAttr() *syscall.SysProcAttr { return nil }
