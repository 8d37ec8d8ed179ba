package redisinfo

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// INFO server replies, trimmed to their first lines, as the servers send
// them (CRLF line ends).
const (
	redis70 = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\nredis_git_dirty:0\r\n" +
		"redis_build_id:ae4d7c971a948f0\r\nredis_mode:standalone\r\nos:Linux 6.1.0 x86_64\r\narch_bits:64\r\n" +
		"tcp_port:6379\r\nexecutable:/usr/bin/redis-server\r\nconfig_file:\r\n\r\n"
	redis74 = "# Server\r\nredis_version:7.4.1\r\nredis_git_sha1:00000000\r\nredis_git_dirty:0\r\n" +
		"redis_build_id:4f2a5c8c1ba7f0e8\r\nredis_mode:cluster\r\nos:Linux 6.8.0 aarch64\r\narch_bits:64\r\n" +
		"tcp_port:7001\r\nlistener0:name=tcp,bind=*,bind=-::*,port=7001\r\n\r\n"
	valkey8 = "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\n" +
		"redis_git_sha1:00000000\r\nredis_git_dirty:0\r\nredis_build_id:6a0a4c8e1c2d3b4f\r\n" +
		"server_mode:cluster\r\nos:Linux 6.8.0 x86_64\r\narch_bits:64\r\n" +
		"listener0:name=tcp,bind=*,bind=-::*,port=6379\r\n\r\n"
)

func TestServerOf(t *testing.T) {
	tests := []struct {
		name  string
		info  string
		want  Server
		str   string
		major int
	}{
		{"Redis 7.0", redis70, Server{Name: "Redis", Version: "7.0.15", RedisVersion: "7.0.15", Mode: "standalone"}, "Redis 7.0.15", 7},
		{"Redis 7.4", redis74, Server{Name: "Redis", Version: "7.4.1", RedisVersion: "7.4.1", Mode: "cluster"}, "Redis 7.4.1", 7},
		{"Valkey 8", valkey8, Server{Name: "Valkey", Version: "8.0.1", RedisVersion: "7.2.4", Mode: "cluster"}, "Valkey 8.0.1", 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ServerOf(Parse(tt.info))
			require.Equal(t, tt.want, s)
			require.Equal(t, tt.str, s.String())
			major, ok := s.RedisMajor()
			require.True(t, ok)
			require.Equal(t, tt.major, major)
		})
	}
}

func TestParse(t *testing.T) {
	m := Parse(redis74)
	require.Equal(t, "name=tcp,bind=*,bind=-::*,port=7001", m["listener0"], "a value may hold colons")
	require.Equal(t, "", m["config_file"])
	require.NotContains(t, m, "# Server")
	require.Len(t, Parse(redis70), 10)
}

func TestServerOfUnknown(t *testing.T) {
	s := ServerOf(map[string]string{})
	require.Equal(t, Server{Name: "Redis", Mode: "standalone"}, s)
	require.Equal(t, "Redis (version unknown)", s.String())
	_, ok := s.RedisMajor()
	require.False(t, ok)

	// A Valkey with extended-redis-compatibility reports redis_mode too.
	s = ServerOf(map[string]string{"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "8.1.0", "redis_mode": "standalone", "server_mode": "standalone"})
	require.Equal(t, "Valkey 8.1.0, standalone", s.String()+", "+s.Mode)
}
