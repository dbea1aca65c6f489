// Package budget is the byte semaphore the RPC servers bound the request
// bytes they hold with (crpc's MaxBufferedBytes, the master's gRPC side
// through h2bound): a reader takes a request's bytes before it holds
// them and gives them back when the call is done; one that finds the
// budget spent waits, within its context. Release wakes waiters only when
// there are any, so the path without pressure allocates nothing.
//
// budget owns no wire or file format.
package budget
