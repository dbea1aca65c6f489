// Package testutil holds small helpers shared by the transports' tests:
// deterministic fill patterns, byte comparison with a useful message,
// waiting for a condition, counting open file descriptors, and a
// handshake over a real handshake server.
package testutil
