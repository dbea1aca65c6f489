// Package redisproc starts a real redis-server on a free 127.0.0.1 port,
// with persistence off in a private directory, for benchmarks and tests
// that measure against or depend on Redis.
package redisproc
