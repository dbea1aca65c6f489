package main

import "context"

// bg is the context of calls from C: they carry no deadline of their
// own; the engine's and the client's timeouts bound them.
func bg() context.Context { return context.Background() }
