package main

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// timer is a timerfd read through the runtime's netpoller: a goroutine
// waiting on it is parked like on a socket, and wakes with microsecond
// precision. (time.Sleep rounds sub-millisecond sleeps up to about a
// millisecond when the scheduler is idle; nanosleep(2) would hold the P.)
type timer struct {
	fd int
	f  *os.File
}

var timers = sync.Pool{New: func() any {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	return &timer{fd: fd, f: os.NewFile(uintptr(fd), "timerfd")}
}}

// preciseSleep pauses the calling goroutine for d.
func preciseSleep(d time.Duration) {
	t, _ := timers.Get().(*timer)
	if t == nil {
		time.Sleep(d)
		return
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(max(d, time.Microsecond)))}
	var b [8]byte
	if unix.TimerfdSettime(t.fd, 0, &spec, nil) != nil {
		time.Sleep(d)
	} else if _, err := t.f.Read(b[:]); err != nil {
		time.Sleep(d)
	}
	timers.Put(t)
}
