package main

import (
	"bufio"
	"bytes"
	"debug/elf"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/idemkit/idem/internal/redistest"
)

// The deployment recipes of docs/proxy.md, in deploy/.
const (
	sidecarFile      = "../../deploy/kubernetes/sidecar.yaml"
	unitFile         = "../../deploy/systemd/idem-proxy.service"
	containerfile    = "../../deploy/container/Containerfile"
	ciFile           = "../../.ci/run"
	staticBinaryEnv  = "IDEM_STATIC_BINARY"
	settleAndShutoff = settleTimeout + 30*time.Second // the recipes' -shutdown-timeout and the settling after it
)

// proxyFlagSet returns idem proxy's flags.
func proxyFlagSet(t *testing.T) *flag.FlagSet {
	t.Helper()
	cmd, ok := commands("proxy", &commonFlags{})
	require.True(t, ok)
	return cmd.fs
}

// checkVariables fails unless every variable of env is a flag's of idem
// proxy, and each value parses as its flag's.
func checkVariables(t *testing.T, where string, env map[string]string) {
	t.Helper()
	fs := proxyFlagSet(t)
	names := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { names[envName(f.Name)] = f.Name })
	for name, v := range env {
		flagName, ok := names[name]
		require.True(t, ok, "%s sets %s, which is no flag of idem proxy", where, name)
		if v != "" {
			require.NoError(t, fs.Set(flagName, v), "%s: %s=%q", where, name, v)
		}
	}
}

// port returns the port of a host:port address.
func port(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return n
}

// sidecar is the part of the Kubernetes manifest the test reads.
type sidecar struct {
	Kind     string
	Metadata struct{ Name string }
	Spec     struct {
		Template struct {
			Metadata struct{ Annotations map[string]string }
			Spec     struct {
				EnableServiceLinks            *bool `yaml:"enableServiceLinks"`
				TerminationGracePeriodSeconds int   `yaml:"terminationGracePeriodSeconds"`
				Containers                    []struct {
					Name  string
					Args  []string
					Ports []struct {
						Name          string
						ContainerPort int `yaml:"containerPort"`
					}
					Env []struct {
						Name      string
						Value     string
						ValueFrom map[string]any `yaml:"valueFrom"`
					}
					ReadinessProbe probe `yaml:"readinessProbe"`
					LivenessProbe  probe `yaml:"livenessProbe"`
				}
			}
		}
		Ports []struct {
			TargetPort string `yaml:"targetPort"`
		}
	}
}

// probe is a container's HTTP probe.
type probe struct {
	HTTPGet struct {
		Path string
		Port string
	} `yaml:"httpGet"`
}

// TestKubernetesSidecar: the sidecar manifest sets only real flags, with
// values that parse; its ports, probes and scrape annotations agree; and a
// proxy started from its variables alone (Redis, the upstream and the
// ports replaced by the test's) answers its probes, its scrape and a keyed
// request.
func TestKubernetesSidecar(t *testing.T) {
	data, err := os.ReadFile(sidecarFile)
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var deployment, service *sidecar
	for {
		var doc sidecar
		if err := dec.Decode(&doc); err == io.EOF {
			break
		} else {
			require.NoError(t, err)
		}
		switch doc.Kind {
		case "Deployment":
			deployment = &doc
		case "Service":
			service = &doc
		}
	}
	require.NotNil(t, deployment)
	require.NotNil(t, service)
	pod := deployment.Spec.Template
	require.Len(t, pod.Spec.Containers, 2, "the service and the proxy in one pod")
	c := pod.Spec.Containers[1]
	require.Equal(t, "idem", c.Name)
	require.Equal(t, []string{"proxy"}, c.Args)
	env := map[string]string{}
	for _, e := range c.Env {
		require.True(t, strings.HasPrefix(e.Name, "IDEM_"), e.Name)
		require.True(t, e.Value != "" || e.ValueFrom != nil, e.Name)
		env[e.Name] = e.Value
	}
	checkVariables(t, sidecarFile, env)
	require.Contains(t, env, "IDEM_REDIS", "Redis from a Secret")
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	require.Equal(t, port(t, env["IDEM_LISTEN"]), ports["http"])
	require.Equal(t, port(t, env["IDEM_ADMIN"]), ports["admin"])
	require.Equal(t, "http", service.Spec.Ports[0].TargetPort)
	require.Equal(t, "admin", c.ReadinessProbe.HTTPGet.Port)
	require.Equal(t, "admin", c.LivenessProbe.HTTPGet.Port)
	a := pod.Metadata.Annotations
	require.Equal(t, "true", a["prometheus.io/scrape"])
	require.Equal(t, strconv.Itoa(ports["admin"]), a["prometheus.io/port"])
	shutdown, err := time.ParseDuration(env["IDEM_SHUTDOWN_TIMEOUT"])
	require.NoError(t, err)
	require.Greater(t, time.Duration(pod.Spec.TerminationGracePeriodSeconds)*time.Second, shutdown+settleTimeout)
	require.NotNil(t, pod.Spec.EnableServiceLinks)
	require.False(t, *pod.Spec.EnableServiceLinks)

	// The proxy, from these variables.
	u := newCounting(t, nil)
	listen, admin := closedAddr(t), closedAddr(t)
	env["IDEM_LISTEN"], env["IDEM_ADMIN"], env["IDEM_UPSTREAM"] = listen, admin, u.srv.URL
	env["IDEM_REDIS"], env["IDEM_PREFIX"] = "redis://"+redistest.Shared(t).Addr(), redistest.Prefix(t)
	for name, v := range env {
		t.Setenv(name, v)
	}
	p := startCommand(t, c.Args...)
	for _, path := range []string{c.ReadinessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path, a["prometheus.io/path"]} {
		resp, err := http.Get("http://" + admin + path)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
	}
	r := send(t, http.MethodPost, p.url+"/charges", `{}`, "Idempotency-Key", "k8s-1", "X-Account", "acct")
	require.Equal(t, http.StatusCreated, r.status, r.body)
	require.Equal(t, 1.0, outcomes(scrape(t, admin))["executed"])
}

// unitEnvironment returns the variables of a unit file's Environment=
// lines, and its other Key=Value lines of [Service].
func unitEnvironment(t *testing.T, data []byte) (env map[string]string, service map[string]string) {
	t.Helper()
	env, service = map[string]string{}, map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	section := ""
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, ok := strings.Cut(line, "=")
			require.True(t, ok, line)
			if k == "Environment" {
				name, value, _ := strings.Cut(v, "=")
				env[name] = value
			} else {
				service[k] = v
			}
		}
	}
	return env, service
}

// TestSystemdUnit: the unit sets only real flags, with values that parse,
// gives the proxy its shutdown time, and systemd finds nothing wrong in it.
func TestSystemdUnit(t *testing.T) {
	data, err := os.ReadFile(unitFile)
	require.NoError(t, err)
	env, service := unitEnvironment(t, data)
	checkVariables(t, unitFile, env)
	require.Equal(t, "/usr/local/bin/idem proxy", service["ExecStart"])
	require.Equal(t, "SIGTERM", service["KillSignal"])
	stop, err := strconv.Atoi(service["TimeoutStopSec"])
	require.NoError(t, err)
	shutdown, err := time.ParseDuration(env["IDEM_SHUTDOWN_TIMEOUT"])
	require.NoError(t, err)
	require.Greater(t, time.Duration(stop)*time.Second, shutdown+settleTimeout)

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not on PATH: the unit is not verified")
	}
	self, err := os.Executable()
	require.NoError(t, err)
	unit := filepath.Join(t.TempDir(), "idem-proxy.service")
	require.NoError(t, os.WriteFile(unit, bytes.ReplaceAll(data, []byte("/usr/local/bin/idem"), []byte(self)), 0o644))
	out, err := exec.Command(analyze, "verify", unit).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Empty(t, strings.TrimSpace(string(out)), "systemd-analyze verify")
}

// TestContainerfile: the image is the static binary CI builds and runs
// (the same build command), on distroless/static, as a non-root user, with
// no shell to start it.
func TestContainerfile(t *testing.T) {
	data, err := os.ReadFile(containerfile)
	require.NoError(t, err)
	cf := string(data)
	ci, err := os.ReadFile(ciFile)
	require.NoError(t, err)
	for _, want := range []string{"ENV CGO_ENABLED=0 GOWORK=/src/cmd/idem/go.work\n", "FROM gcr.io/distroless/static-debian12:nonroot\n",
		"USER 65532:65532\n", `ENTRYPOINT ["/idem"]` + "\n", `CMD ["proxy"]` + "\n"} {
		require.Contains(t, cf, want)
	}
	build := "go -C cmd/idem build -trimpath"
	require.Contains(t, cf, "RUN "+build)
	require.True(t, strings.Contains(string(ci), `CGO_ENABLED=0 GOWORK="$PWD/cmd/idem/go.work" `+build), "CI builds the image's binary as the image does")
}

// TestStaticBinary: the static binary that .ci/run builds as the image
// does (CGO_ENABLED=0; its path in IDEM_STATIC_BINARY) links no shared
// library, and runs with an empty environment but IDEM_* variables, as in
// the image: /readyz, a keyed request and its replay, /metrics, and SIGTERM.
func TestStaticBinary(t *testing.T) {
	bin := os.Getenv(staticBinaryEnv)
	if bin == "" {
		t.Skip(staticBinaryEnv + " is not set: .ci/run builds the static binary and sets it")
	}
	f, err := elf.Open(bin)
	require.NoError(t, err)
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	require.Empty(t, libs, "no shared library")
	for _, p := range f.Progs {
		require.NotEqual(t, elf.PT_INTERP, p.Type, "no dynamic loader")
	}
	f.Close()

	u := newCounting(t, nil)
	listen, admin := closedAddr(t), closedAddr(t)
	cmd := exec.Command(bin, "proxy")
	cmd.Env = []string{ // env -i, then only these
		"IDEM_LISTEN=" + listen,
		"IDEM_ADMIN=" + admin,
		"IDEM_UPSTREAM=" + u.srv.URL,
		"IDEM_REDIS=redis://" + redistest.Shared(t).Addr(),
		"IDEM_PREFIX=" + redistest.Prefix(t),
		"IDEM_SCOPE_HEADER=X-Account",
	}
	logs := &logSink{}
	cmd.Stderr = logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer cmd.Process.Kill()
	require.Eventually(t, func() bool { return logs.find(map[string]any{"event": "start"}) != nil }, 15*time.Second, 10*time.Millisecond, "%s", logs)

	resp, err := http.Get("http://" + admin + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	a := send(t, http.MethodPost, "http://"+listen+"/charges", `{}`, "Idempotency-Key", "static-1", "X-Account", "acct")
	b := send(t, http.MethodPost, "http://"+listen+"/charges", `{}`, "Idempotency-Key", "static-1", "X-Account", "acct")
	require.Equal(t, http.StatusCreated, a.status, a.body)
	require.Equal(t, "true", b.header.Get("Idempotent-Replayed"))
	require.EqualValues(t, 1, u.runs.Load())
	got := outcomes(scrape(t, admin))
	require.Equal(t, 1.0, got["executed"])
	require.Equal(t, 1.0, got["replayed"])

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "exit status 0: %s", logs)
	case <-time.After(settleAndShutoff):
		t.Fatalf("idem proxy did not exit: %s", logs)
	}
}
