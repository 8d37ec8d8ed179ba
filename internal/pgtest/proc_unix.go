//go:build unix

package pgtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// account is the user initdb and postgres run as: the test's own user, or,
// when the tests run as root, which PostgreSQL refuses, postgres or nobody.
type account struct {
	name string
	cred *syscall.Credential // nil: run as the test's own user
}

// runAccount chooses the account to run PostgreSQL as.
func runAccount() (*account, error) {
	if os.Geteuid() != 0 {
		name := strconv.Itoa(os.Geteuid())
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
		return &account{name: name}, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, uerr := strconv.ParseUint(u.Uid, 10, 32)
		gid, gerr := strconv.ParseUint(u.Gid, 10, 32)
		if uerr != nil || gerr != nil || uid == 0 {
			continue
		}
		return &account{name: name, cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}, nil
	}
	return nil, errors.New("pgtest: the tests run as root, which PostgreSQL refuses, and there is no user postgres or nobody to run it as")
}

// own gives path to the account; it must also be able to reach path, so
// every directory above it must be searchable by others.
func (a *account) own(path string) error {
	if a.cred == nil {
		return nil
	}
	for d := filepath.Dir(path); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s is not searchable by others; set TMPDIR to a directory that is (e.g. /tmp)", d)
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	return os.Chown(path, int(a.cred.Uid), int(a.cred.Gid))
}

// apply makes cmd run as the account.
func (a *account) apply(cmd *exec.Cmd) {
	if a.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: a.cred}
	}
}

// process is a started postmaster, reaped with wait4 directly so that no
// goroutine is left behind (the shared server outlives every test). It runs
// in a process group of its own, so that a terminal's Ctrl-C reaches the
// test binary and not the server; its backends make sessions of their own
// and exit by themselves once the postmaster is gone.
type process struct {
	pid    int
	exited bool
}

// spawn starts path with args in dir as acct, appending its output to
// logPath. Where the platform allows it, the process is killed when the test
// binary dies.
func spawn(path string, args []string, dir, logPath string, acct *account) (*process, error) {
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
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Credential = acct.cred
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

// kill ends postgres like a crash: an immediate shutdown (SIGQUIT: the
// postmaster SIGQUITs every backend, which exit at once without cleanup, and
// exits when they are gone; the next start runs crash recovery), then SIGKILL
// if that takes longer than d.
func (p *process) kill(d time.Duration) { p.end(syscall.SIGQUIT, d) }

// shutdown asks postgres for a fast shutdown (SIGINT: sessions are ended,
// without waiting for clients), then SIGKILL if that takes longer than d.
func (p *process) shutdown(d time.Duration) { p.end(syscall.SIGINT, d) }

func (p *process) end(sig syscall.Signal, d time.Duration) {
	if p.reap(false) {
		return
	}
	_ = syscall.Kill(p.pid, sig)
	deadline := time.Now().Add(d)
	for !p.reap(false) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
			p.reap(true)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// alive reports whether a process with the given pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
