package redistest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Shared state for the per-binary server and cluster.
var (
	sharedMu             sync.Mutex
	sharedServer         *Server
	sharedCluster        *Cluster
	sharedDirs           []string
	sharedFailure        error // sticky: a failed start is not retried by every test
	sharedClusterFailure error
	sharedSweep          sync.Once
)

// Shared returns a redis-server shared by all tests of the test binary,
// starting it on first use. Tests must not stop it and should keep apart by
// key (see Prefix); nothing is flushed between tests. It skips the test like
// Start when redis-server is not on PATH. The server lives until StopShared
// or the end of the test binary.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	path := lookPath(tb, "redis-server", skipServer)
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedServer == nil && sharedFailure == nil {
		var dir string
		dir, sharedFailure = sharedDir()
		if sharedFailure == nil {
			sharedServer, sharedFailure = startServer(path, dir, nil)
		}
		if sharedServer != nil {
			sharedServer.shared = true
		}
	}
	if sharedFailure != nil {
		tb.Fatal(sharedFailure)
	}
	return sharedServer
}

// StopShared stops the shared server and cluster, if started, and removes
// their directories. Call it from TestMain after m.Run; without it, on Linux,
// the kernel kills them when the test binary exits and the next run removes
// the directories.
func StopShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedServer != nil {
		sharedServer.stopNow()
		sharedServer = nil
	}
	if sharedCluster != nil {
		sharedCluster.stopNow()
		sharedCluster = nil
	}
	for _, d := range sharedDirs {
		_ = os.RemoveAll(d)
	}
	sharedDirs = nil
	sharedFailure = nil
	sharedClusterFailure = nil
}

const sharedDirPrefix = "idem-redistest-"

// sharedDir makes a directory for a shared server, named after this process
// so that a later run can remove it once this process is gone.
func sharedDir() (string, error) {
	sharedSweep.Do(sweepSharedDirs)
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", sharedDirPrefix, os.Getpid()))
	if err != nil {
		return "", err
	}
	sharedDirs = append(sharedDirs, dir)
	return dir, nil
}

// sweepSharedDirs removes directories left by earlier test binaries.
func sweepSharedDirs() {
	entries, _ := os.ReadDir(os.TempDir())
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), sharedDirPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid == os.Getpid() || alive(pid) {
			continue
		}
		_ = os.RemoveAll(filepath.Join(os.TempDir(), e.Name()))
	}
}

var (
	prefixSeq   atomic.Int64
	unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)
)
