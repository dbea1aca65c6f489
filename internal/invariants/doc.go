// Package invariants reports whether expensive internal consistency checks are
// compiled in.
//
// Build with `-tags invariants` to set Enabled to true. Packages guard their
// expensive checks (poisoning freed memory, full structure validation,
// stricter double-free detection) with `if invariants.Enabled { ... }`; the
// constant lets the compiler drop that code entirely from release builds.
package invariants
