// Package efa is the libfabric transport: RMA reads and writes over RDM
// endpoints, for AWS EFA NICs and any other provider offering RDM with
// RMA (on hosts without EFA, libfabric's software providers "tcp;ofi_rxm"
// and "sockets" run it on loopback for tests and benchmarks).
//
// # Selection and start-up
//
// The provider is Config.Provider, else $FI_PROVIDER, else "efa": software
// providers are used only when asked for. Start loads libfabric at run
// time (internal/fabric) and opens one endpoint per domain (NIC) of the
// provider: every domain, or Config.Domains; loopback domains are used
// only when the engine's host is a loopback address, and then alone.
// Without the fabric build tag, without libfabric, or without the
// provider, Start fails with an error wrapping transport.ErrNotSupported
// and the engine goes on with its other transports (tcp stays available
// for peers that have no efa).
//
// # Descriptor
//
// Describe appends the domains to the descriptor's devices
// ({"name": domain, "lid": 0, "gid": hex of the domain's source address}),
// after any devices already listed, and for every buffer registered on
// them appends one 64-bit key per domain to "rkey" and "lkey" (padded with
// zeros to align with earlier devices). The "crescent" object gets
//
//	"efa": {"provider": "tcp;ofi_rxm", "virt_addr": false,
//	        "first_device": 0, "devices": 1}
//
// locating them. virt_addr false means remote addresses are offsets into
// the buffer (the provider lacks FI_MR_VIRT_ADDR); requests still name
// virtual addresses and the transport translates. A reference descriptor
// with "protocol": "efa" and no extension means provider "efa", virtual
// addresses, every device. Accepts takes a range inside one buffer that
// has keys for the peer's domains, from a peer using the same provider.
//
// # Handshake
//
// Before its first request to a peer (or at Warmup), the transport sends,
// for each local domain i, the reference's Connection message (frame type
// 0 of the engine's handshake) pairing it with the peer's domain
// i mod n:
//
//	{"protocol": "efa", "payload": "", "local_nic_path": "<our segment>@<our domain>",
//	 "local_lid": 0, "local_gid": "", "peer_nic_path": "<peer segment>@<peer domain>",
//	 "qp_num": [], "reply_msg": "", "efa_addr": "<lower-case hex of fi_getname>"}
//
// The peer answers with the same fields from its side (its endpoint's
// address in "efa_addr"), or an error ("Malformed transfer handshake",
// "EFA nic path inconsistency", "No EFA address provided", "unknown EFA
// device"), and the address is inserted into that domain's address
// vector. Requests wait for the handshake on their own; Submit never
// blocks on the network. A peer whose endpoint refuses us, or that
// changed its domains, is connected anew; ClosePeer removes its addresses
// once no operation uses them.
//
// # Data path
//
// Submit turns each task into one operation (or slices of SliceSize) on
// one domain (round-robin over the domains) and queues them to that
// domain's worker goroutine. The worker posts everything queued in one
// crossing into C (up to 256 operations), reads up to 256 completions
// per crossing, and otherwise sleeps on the completion queue's wait fd
// through the Go netpoller (or polls with backoff when the provider has
// none); it never blocks inside C. When the provider's queue is full
// (-FI_EAGAIN) operations wait and are posted again: back-pressure, never
// a failure. An operation that fails because its connection broke
// (ENOTCONN, ECONNRESET, ECONNABORTED, EPIPE) is posted again up to
// Retries times before its deadline; other failures end the task with an
// error carrying the provider's text (fi_cq_strerror), which the engine
// reports as FAILED. Operations the provider refuses for PeerTimeout with
// nothing moving end with transport.ErrPeerGone.
//
// # Deadlines and buffers
//
// A task ends only when the provider can no longer touch its buffer. A
// queued operation past its deadline (or aborted) ends with
// transport.ErrTimeout without being posted. A posted one is asked to
// cancel (fi_cancel); if no completion comes within StuckGrace, the
// domain's endpoint is closed and replaced (fi_close makes the provider
// drop everything posted), the stuck tasks end with ErrTimeout and the
// other operations are posted again. Until then the engine shows the
// request as TIMEOUT and FreeBatch refuses the batch. Providers that bind
// registrations to the endpoint (FI_MR_ENDPOINT) cannot be reset: their
// stuck operations keep their buffers until Close.
//
// Memory registered with the engine is registered on every domain
// (AfterRegister); BeforeUnregister refuses new requests on it and closes
// its registrations when the requests using it have ended; if its ctx
// ends first it returns a transport.UnconfirmedError whose channel closes
// with the registrations (until then peers can still reach the memory).
// Close closes
// the endpoints first (every pending task ends with transport.ErrClosed),
// then the registrations, completion queues, address vectors, domains and
// fabrics.
package efa
