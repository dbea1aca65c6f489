// Package buildinfo names the build a binary came from, for every
// binary's --version: the main module's version (a tag when built with
// `go install module@version`, "(devel)" from a checkout) and, when the
// build recorded them (not with -buildvcs=false), the VCS revision and
// whether the tree had uncommitted changes.
//
// The line is
//
//	NAME VERSION [rev REVISION[ (modified)]] GOVERSION
//
// for example "crescentctl (devel) rev 1f3c2a9d0b7e (modified) go1.24.4".
package buildinfo
