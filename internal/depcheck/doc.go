// Package depcheck lets a test assert what a package links: it runs
// `go list -deps` on the package (the non-test import graph, the one a
// user's binary gets) and fails the test if any dependency falls under a
// forbidden import-path prefix, naming the import chain that brought it
// in. The go command is found on $PATH, else under runtime.GOROOT().
//
// The graph is checked for each tag set given, so optional native
// transports (verbs, fabric) and the invariants build cannot bring a
// forbidden package in either.
package depcheck
