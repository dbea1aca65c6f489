// Package transport defines what every data transport implements and the
// registry of local memory that remote peers may touch.
//
// A Transport is batch-first: Submit hands over many Tasks at once and
// never waits for the network; each Task completes exactly once (bytes
// moved, or an error) by its deadline or shortly after. The engine asks
// transports in order of preference whether they Accept a target range and
// uses the first that does.
//
// A Peer's descriptor has passed metadata.SegmentDesc.Validate (the
// engine refuses others at open and refresh), but a transport must not
// rely on it for memory safety: every index, offset and length it takes
// from a descriptor is checked in a form that cannot overflow
// (first > len-count, not first+count > len), so a descriptor that
// slipped through yields a clean error, never a panic or a stray copy.
//
// The Registry is the only way a transport's server side may turn a remote
// address into memory: Acquire checks [addr, addr+n) against the
// registered buffers and pins the buffer until Release, so unregistering
// waits for transfers in progress and refuses new ones. A Remove whose
// ctx ends first leaves the buffer draining: out of the table, its memfd
// descriptor closed when the last user leaves (Close closes it too), and
// found again by a retried Remove, which succeeds once it is idle.
//
// An Unregisterer whose peers may still write into a buffer returns an
// *UnconfirmedError carrying one channel per such peer, closed once it
// cannot any more; the engine keeps the buffer quarantined until then.
package transport
