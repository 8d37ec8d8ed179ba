//go:build unix && !linux

package pgtest

import "syscall"

// sysProcAttr returns empty attributes: outside Linux a server that loses its
// test binary keeps running until killed (StopShared stops the shared one).
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
