// Package redisinfo reads the reply of the INFO command: its fields, and
// which server answered (Redis, Valkey, ...), in which version and mode.
//
// Valkey 8 answers INFO server with redis_version:7.2.4 (the Redis version
// it is compatible with), server_name:valkey, valkey_version:8.0.1 and
// server_mode instead of redis_mode; Redis has neither server_name nor
// server_mode. Server names the server by its own name and version and keeps
// the compatibility version apart, for version gates.
package redisinfo

import (
	"bufio"
	"strconv"
	"strings"
)

// Parse returns the fields of an INFO reply ("name:value" lines; section
// headers and blank lines are skipped).
func Parse(text string) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}

// Server is which server answered INFO server.
type Server struct {
	Name         string // the server's own name: "Redis", "Valkey"
	Version      string // the server's own version: "8.0.1" for Valkey 8.0.1
	RedisVersion string // redis_version: the Redis version it is compatible with
	Mode         string // standalone, cluster or sentinel
}

// ServerOf reads the server's name, version and mode from INFO fields (see
// Parse). A server without server_name is Redis; one without redis_mode or
// server_mode is standalone. Version and RedisVersion are empty when INFO
// does not say.
func ServerOf(info map[string]string) Server {
	s := Server{Name: "Redis", RedisVersion: info["redis_version"], Mode: info["redis_mode"]}
	s.Version = s.RedisVersion
	if n := info["server_name"]; n != "" && !strings.EqualFold(n, "redis") {
		s.Name = strings.ToUpper(n[:1]) + n[1:]
		if v := info[strings.ToLower(n)+"_version"]; v != "" {
			s.Version = v
		}
	}
	if s.Mode == "" {
		s.Mode = info["server_mode"]
	}
	if s.Mode == "" {
		s.Mode = "standalone"
	}
	return s
}

// String returns the name and version, "Valkey 8.0.1".
func (s Server) String() string {
	if s.Version == "" {
		return s.Name + " (version unknown)"
	}
	return s.Name + " " + s.Version
}

// RedisMajor returns the major number of the Redis version the server is
// compatible with (7 for Valkey 8, which reports redis_version 7.2.4), and
// false when INFO did not report it.
func (s Server) RedisMajor() (int, bool) {
	major, err := strconv.Atoi(strings.SplitN(s.RedisVersion, ".", 2)[0])
	return major, err == nil
}
