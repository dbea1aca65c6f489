package depcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// Package is one entry of `go list -deps -json`.
type Package struct {
	ImportPath string
	Imports    []string
}

// List returns the packages pkg links (pkg included), as `go list -deps`
// run in the test's working directory with the given build tags reports
// them.
func List(t testing.TB, pkg string, tags ...string) []Package {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	args := []string{"list", "-deps", "-json=ImportPath,Imports"}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.Command(goBin, append(args, pkg)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("depcheck: go %s: %v\n%s", strings.Join(cmd.Args[1:], " "), err, stderr.String())
	}
	var pkgs []Package
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p Package
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("depcheck: decoding go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatalf("depcheck: go list -deps %s listed nothing", pkg)
	}
	return pkgs
}

// Forbid fails t if pkg, built with any of the tag sets (none given: the
// default build), links a package whose import path is one of prefixes or
// lies under one ("google.golang.org/grpc" matches google.golang.org/grpc
// and google.golang.org/grpc/codes, not google.golang.org/grpcx). It
// returns the number of packages linked by the default build, or by the
// first tag set.
func Forbid(t testing.TB, pkg string, prefixes []string, tagSets ...[]string) int {
	t.Helper()
	if len(tagSets) == 0 {
		tagSets = [][]string{nil}
	}
	n := 0
	for i, tags := range tagSets {
		pkgs := List(t, pkg, tags...)
		if i == 0 {
			n = len(pkgs)
		}
		build := "default build"
		if len(tags) > 0 {
			build = "tags " + strings.Join(tags, ",")
		}
		for _, pre := range prefixes {
			var bad []string
			for _, p := range pkgs {
				if p.ImportPath == pre || strings.HasPrefix(p.ImportPath, pre+"/") {
					bad = append(bad, p.ImportPath)
				}
			}
			if len(bad) == 0 {
				continue
			}
			// The shortest chain names the import to remove.
			best := ""
			for _, b := range bad {
				if c := Chain(pkgs, b); best == "" || strings.Count(c, " -> ") < strings.Count(best, " -> ") {
					best = c
				}
			}
			t.Errorf("%s (%s) links %d package(s) under %s: %s", pkg, build, len(bad), pre, best)
		}
	}
	return n
}

// Chain returns a shortest import chain to target, as "a -> b -> target",
// from a package of pkgs that no other one imports (the package go list
// was asked about).
func Chain(pkgs []Package, target string) string {
	imports := make(map[string][]string, len(pkgs))
	imported := make(map[string]bool, len(pkgs))
	for _, p := range pkgs {
		imports[p.ImportPath] = p.Imports
		for _, q := range p.Imports {
			imported[q] = true
		}
	}
	var roots []string
	for _, p := range pkgs {
		if !imported[p.ImportPath] {
			roots = append(roots, p.ImportPath)
		}
	}
	slices.Sort(roots)
	// Breadth-first from the roots gives a shortest chain.
	prev := map[string]string{}
	queue := slices.Clone(roots)
	seen := map[string]bool{}
	for _, r := range roots {
		seen[r] = true
	}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == target {
			var chain []string
			for c := cur; ; c = prev[c] {
				chain = append(chain, c)
				if _, ok := prev[c]; !ok {
					break
				}
			}
			slices.Reverse(chain)
			return strings.Join(chain, " -> ")
		}
		for _, q := range imports[cur] {
			if !seen[q] {
				seen[q] = true
				prev[q] = cur
				queue = append(queue, q)
			}
		}
	}
	return fmt.Sprintf("(no chain to %s found)", target)
}
