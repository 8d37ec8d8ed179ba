package pgtest

import "syscall"

// sysProcAttr asks the kernel to SIGKILL postgres when the thread that
// started it exits. Go keeps its threads for the life of the process, so in
// practice the server dies with the test binary even when no cleanup ran (a
// panic, a -timeout, a kill); its backends notice and exit by themselves.
// The setting survives the switch to another user: Go applies it after the
// credentials.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
