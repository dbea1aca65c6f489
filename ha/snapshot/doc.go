// Package snapshot stores snapshots of a master's state: payload stores
// (bodies) and catalogs (which snapshots exist, which is the latest).
package snapshot
