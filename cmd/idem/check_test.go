package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServerPrint: a server is named by its own name and version, and its
// mode read from server_mode when redis_mode is absent (Valkey 8).
func TestServerPrint(t *testing.T) {
	tests := []struct {
		name string
		info map[string]string
		want string
	}{
		{"Redis 7.0", map[string]string{"redis_version": "7.0.15", "redis_mode": "standalone", "role": "master"},
			"h:1: Redis 7.0.15, standalone, master\n"},
		{"Redis 7.4 cluster", map[string]string{"redis_version": "7.4.1", "redis_mode": "cluster", "role": "master"},
			"h:1: Redis 7.4.1, cluster, master\n"},
		{"Valkey 8 cluster", map[string]string{"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "8.0.1",
			"server_mode": "cluster", "role": "master"},
			"h:1: Valkey 8.0.1, cluster, master\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			s := &server{name: "h:1", info: tt.info, save: "", persistence: "none"}
			s.print(&b)
			first, _, _ := bytes.Cut(b.Bytes(), []byte("\n"))
			require.Equal(t, tt.want, string(first)+"\n")
		})
	}
}
