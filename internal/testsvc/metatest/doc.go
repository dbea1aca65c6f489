// Package metatest is the conformance suite every metadata store backend
// (etcd, Redis, HTTP) passes against a real server: key names and value
// formats exactly as the reference writes them, round trips, watches,
// expiry of a killed owner's entries, and two engines finding each other
// and moving bytes through the store.
package metatest
