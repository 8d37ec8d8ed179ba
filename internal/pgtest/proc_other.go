//go:build !unix

package pgtest

import (
	"errors"
	"time"
)

// errUnsupported is returned outside Unix, where the harness has no process
// control; tests needing PostgreSQL fail there with this message.
var errUnsupported = errors.New("pgtest: PostgreSQL tests need a Unix system")

type account struct{ name string }

func runAccount() (*account, error) { return nil, errUnsupported }
func (a *account) own(string) error { return errUnsupported }
func (a *account) apply(any)        {}
func alive(int) bool                { return false }

type process struct{}

func spawn(string, []string, string, string, *account) (*process, error) { return nil, errUnsupported }
func (p *process) reap(bool) bool                                        { return true }
func (p *process) kill(time.Duration)                                    {}
func (p *process) shutdown(time.Duration)                                {}
