//go:build unix

package redistest

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// process is a started server process, reaped with wait4 directly so that no
// goroutine is left behind (a shared server outlives every test).
type process struct {
	pid    int
	exited bool
}

// spawn starts path with args in dir, appending its output to logPath. Where
// the platform allows it, the process is killed when the test binary dies.
func spawn(path string, args []string, dir, logPath string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	pid := cmd.Process.Pid
	_ = cmd.Process.Release() // reaped by pid below
	return &process{pid: pid}, nil
}

// reap collects the exit status if the process has exited; with block it
// waits for that.
func (p *process) reap(block bool) bool {
	if p.exited {
		return true
	}
	opts := syscall.WNOHANG
	if block {
		opts = 0
	}
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(p.pid, &ws, opts, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid == p.pid { // ECHILD: already reaped
			p.exited = true
		}
		return p.exited
	}
}

// is reports whether pid is the process's.
func (p *process) is(pid int) bool { return p.pid == pid }

// signal sends sig unless the process has exited.
func (p *process) signal(sig syscall.Signal) error {
	if p.reap(false) {
		return errors.New("redistest: process has exited")
	}
	return syscall.Kill(p.pid, sig)
}

// kill sends SIGKILL (which also ends a stopped process) and reaps it.
func (p *process) kill() {
	if p.reap(false) {
		return
	}
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	p.reap(true)
}

// waitExit waits up to d for the process to exit by itself.
func (p *process) waitExit(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for !p.reap(false) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// alive reports whether a process with the given pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// pause stops the process (SIGSTOP).
func (p *process) pause() error { return p.signal(syscall.SIGSTOP) }

// resume continues a stopped process (SIGCONT).
func (p *process) resume() error { return p.signal(syscall.SIGCONT) }
