// Command notcovered runs the mutants a gremlins report lists as NOT COVERED.
//
// gremlins v0.6.0 decides whether a mutant is covered from Go's coverage
// profile, which counts statement blocks: the condition of a switch case and
// a constant's expression lie outside every block, so their mutants are
// never run however many tests reach them (go-gremlins/gremlins#298). This
// command applies each such mutant with a build overlay (the source tree is
// not touched), runs the package's tests and reports whether a test failed:
//
//	go run ./internal/notcovered -report R.json [-workers N] [-timeout D] PKG
//
// PKG is the package gremlins ran on (./idemclient); GOFLAGS and the rest of
// the environment pass to go test. The tests must first pass without a
// mutant. It prints one line per mutant (a killed one names the first test
// that failed) and a
// summary: "blind spot: K killed, L lived, T timed out, N not viable", where a
// mutant that does not build is not viable and one that outlasts -timeout
// (default 3m) counts as a survivor, as in gremlins.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// report is the part of a gremlins JSON report read here.
type report struct {
	Files []struct {
		FileName  string `json:"file_name"`
		Mutations []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
			Line   int    `json:"line"`
			Column int    `json:"column"`
		} `json:"mutations"`
	} `json:"files"`
}

// mutant is one not-covered mutant: where, and of which type.
type mutant struct {
	file      string // path of the source file
	name      string // as the report names it
	typ       string
	line, col int
}

func main() {
	reportPath := flag.String("report", "", "gremlins' JSON report (-o)")
	workers := flag.Int("workers", 1, "mutants tested at once")
	timeout := flag.Duration("timeout", 3*time.Minute, "bound on one mutant's go test (a timeout is a survivor)")
	flag.Parse()
	if *reportPath == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: notcovered -report R.json [-workers N] [-timeout D] PKG")
		os.Exit(2)
	}
	pkg := flag.Arg(0)
	muts, err := load(*reportPath, pkg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "notcovered:", err)
		os.Exit(1)
	}
	// Without a mutant the tests must pass, or every mutant would count as
	// killed.
	if out, err := goTest(context.Background(), pkg, ""); err != nil {
		fmt.Fprintf(os.Stderr, "notcovered: the tests fail without a mutant (%v):\n%s", err, out)
		os.Exit(1)
	}
	results := make([]result, len(muts))
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(*workers, 1))
	for i, m := range muts {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			results[i] = run(m, pkg, *timeout)
		})
	}
	wg.Wait()
	count := map[string]int{}
	for i, m := range muts {
		fmt.Printf("%12s %s at %s:%d:%d%s\n", results[i].status, m.typ, m.name, m.line, m.col, results[i].detail)
		count[results[i].status]++
	}
	fmt.Printf("blind spot: %d killed, %d lived, %d timed out, %d not viable\n",
		count["KILLED"], count["LIVED"], count["TIMED OUT"], count["NOT VIABLE"])
	if count["ERROR"] > 0 {
		os.Exit(1)
	}
}

// load returns the report's not-covered mutants, their files found under
// the package's folder or the module's root.
func load(path, pkg string) ([]mutant, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var muts []mutant
	for _, f := range r.Files {
		file := filepath.Join(pkg, f.FileName)
		if _, err := os.Stat(file); err != nil {
			file = f.FileName
		}
		for _, m := range f.Mutations {
			if m.Status == "NOT COVERED" {
				muts = append(muts, mutant{file: file, name: f.FileName, typ: m.Type, line: m.Line, col: m.Column})
			}
		}
	}
	sort.SliceStable(muts, func(i, j int) bool { return muts[i].name < muts[j].name })
	return muts, nil
}

// A result is a mutant's status, and why when it could not be run.
type result struct{ status, detail string }

// run applies m through an overlay and tests pkg: KILLED when go test
// fails, LIVED when it passes, TIMED OUT after timeout, NOT VIABLE when the
// mutant does not build, ERROR when it cannot be applied.
func run(m mutant, pkg string, timeout time.Duration) result {
	failed := func(err error) result { return result{"ERROR", ": " + err.Error()} }
	src, err := os.ReadFile(m.file)
	if err != nil {
		return failed(err)
	}
	mutated, err := apply(src, m.typ, m.line, m.col)
	if err != nil {
		return failed(err)
	}
	dir, err := os.MkdirTemp("", "notcovered-")
	if err != nil {
		return failed(err)
	}
	defer os.RemoveAll(dir)
	abs, _ := filepath.Abs(m.file)
	repl := filepath.Join(dir, filepath.Base(m.file))
	overlay := filepath.Join(dir, "overlay.json")
	ov, _ := json.Marshal(map[string]map[string]string{"Replace": {abs: repl}})
	if err := errors.Join(os.WriteFile(repl, mutated, 0o644), os.WriteFile(overlay, ov, 0o644)); err != nil {
		return failed(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := goTest(ctx, pkg, overlay)
	switch {
	case err == nil:
		return result{status: "LIVED"}
	case strings.Contains(out, "[build failed]") || strings.Contains(out, "[setup failed]"):
		return result{status: "NOT VIABLE"}
	case ctx.Err() != nil:
		return result{status: "TIMED OUT"}
	}
	return result{status: "KILLED", detail: firstFailure(out)}
}

// goTest runs pkg's tests, through overlay unless it is "", and returns
// their output.
func goTest(ctx context.Context, pkg, overlay string) (string, error) {
	args := []string{"test", "-count=1"}
	if overlay != "" {
		args = append(args, "-overlay="+overlay)
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "go", append(args, pkg)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// firstFailure returns " by TestName" for the first test that failed in a
// go test output, "" when none is named (a panic, a watchdog).
func firstFailure(out string) string {
	for line := range strings.Lines(out) {
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "--- FAIL: "); ok {
			return " by " + strings.Fields(name)[0]
		}
	}
	return ""
}
