//go:build invariants

package invariants

// Enabled is true when the binary was built with the invariants build tag.
const Enabled = true
