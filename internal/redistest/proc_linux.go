package redistest

import "syscall"

// sysProcAttr asks the kernel to SIGKILL the server when the thread that
// started it exits. Go keeps its threads for the life of the process (unless
// a goroutine exits while locked to one), so in practice the server dies with
// the test binary even when no cleanup ran (a panic, a -timeout, a kill).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
