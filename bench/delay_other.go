//go:build !linux

package main

import "time"

// preciseSleep pauses the calling goroutine for d (time.Sleep: coarser
// than on Linux for sub-millisecond d).
func preciseSleep(d time.Duration) { time.Sleep(d) }
