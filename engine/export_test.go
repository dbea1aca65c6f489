package engine

import "github.com/crescent-kv/crescent/engine/transport"

// SetTransportWrapper makes New wrap every transport it starts with f,
// until the returned restore is called.
func SetTransportWrapper(f func(transport.Transport) transport.Transport) (restore func()) {
	wrapTransport = f
	return func() { wrapTransport = nil }
}

// ForTransport calls f on each started transport until it returns true.
func ForTransport(e *Engine, f func(any) bool) bool {
	for _, t := range e.transportsNow() {
		if f(t) {
			return true
		}
	}
	return false
}
