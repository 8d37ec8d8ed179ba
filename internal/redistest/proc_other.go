//go:build !unix

package redistest

import (
	"errors"
	"time"
)

// errUnsupported is returned outside Unix, where the harness has no process
// control; tests needing a real server fail there with this message.
var errUnsupported = errors.New("redistest: real redis-server tests need a Unix system")

type process struct{}

func spawn(path string, args []string, dir, logPath string) (*process, error) {
	return nil, errUnsupported
}

func (p *process) reap(block bool) bool          { return true }
func (p *process) pause() error                  { return errUnsupported }
func (p *process) resume() error                 { return errUnsupported }
func (p *process) kill()                         {}
func (p *process) is(pid int) bool               { return false }
func (p *process) waitExit(d time.Duration) bool { return true }
func alive(pid int) bool                         { return false }
