// Package shm is the shared-memory transport for peers on the same host
// (equal boot ids in their descriptors).
//
// The target listens on an abstract Unix socket (SOCK_SEQPACKET) named in
// its descriptor ("crescent.shm_socket"). A connecting peer must have the
// target's uid (or one allowed by Config), checked with SO_PEERCRED; with
// Config.Token set it then runs the internal/auth challenge
// (PurposeShmControl, one packet per challenge message; a shorter packet
// fails it at once) before any message is served, so a same-uid process
// without the token gets no memfd. The control protocol is one JSON
// object per packet:
//
//	peer   -> target  {"op":"list","id":n}
//	target -> peer    {"op":"regions","id":n,"version":v,"more":b,
//	                   "regions":[{"addr","len","fd","off"}]}  + SCM_RIGHTS memfds
//	target -> peer    {"op":"revoke","id":n,"addr":a,"len":l}
//	peer   -> target  {"op":"revoked","id":n}
//	target -> peer    {"op":"error","error":text}  (then closes)
//
// "fd" indexes the memfds attached to that packet; a reply whose id is
// not the pending request's is dropped. The peer closes at once attached
// fds no region refers to and keeps one per memfd; a listing (all its
// packets) with more than 65536 regions or 256 distinct memfds fails,
// and the peer drops that target. A packet from a peer
// carrying fds closes the connection. Only registered
// buffers backed by a memfd (memory from mempool) are listed. The peer maps
// the pages of each listed region (not the whole memfd), prefaulted when
// every page of the memfd exists (a sparse one is mapped lazily, so a
// listing cannot make the peer allocate what the target never had), and
// copies directly with memcpy, bounds-checked against the listed regions.
// Shared memfds are sealed against shrinking and growing, so a peer cannot
// make the owner's own accesses fault.
//
// Before the target unregisters a buffer it stops listing it and sends
// "revoke" to every connected peer at once, waiting for "revoked": the peer replies only after its
// copies into the region finished and the region is unmapped. A peer that
// does not answer in time has our writing half shut (it reads EOF and
// drops its mappings); BeforeUnregister then returns a
// transport.UnconfirmedError whose channels close when that peer
// confirms late or its end of the connection closes, the only sign that
// it can no longer write into the buffer. When the control connection
// drops, the peer unmaps everything of that target.
//
// The control socket serves through internal/netx: accept errors such
// as EMFILE back off and retry; live connections are capped (MaxConns,
// 1024). Only a connection that has sent nothing yet is closed to make
// room at the cap: once a peer has spoken it may hold mappings that only
// its connection can revoke.
//
// Trust: a process of the same uid could read the target's memory anyway
// (ptrace, /proc/pid/mem); the uid check keeps other users out.
package shm
