// Package testutil holds small helpers shared by the transports' tests:
// deterministic fill patterns, byte comparison with a useful message,
// waiting for a condition, counting open file descriptors, a handshake
// over a real handshake server, and a TCP proxy that resets or
// partitions the connections through it.
package testutil
