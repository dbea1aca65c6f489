// Package auth holds the cluster credential and the checks every Crescent
// listener shares: the token file, the protected default (loopback peers
// only when no credential is configured), and a mutual HMAC challenge that
// authenticates a connection once before any frame is served.
//
// # Token files
//
// A token file holds one secret; surrounding whitespace is trimmed. It must
// hold at least MinTokenBytes bytes and must not be readable by group or
// others (mode 0600 or stricter): LoadToken refuses it otherwise.
//
// # Protected default
//
// Decide turns (credential configured, --insecure) into a Mode. In
// Protected mode a listener admits loopback peers only (LoopbackOnly, for
// netx.Config.Allow) and the binary says so in one log line.
// AllowSameHost (SameHost) also admits this host's own addresses, for
// listeners bound to the host's address (the transfer engine's).
//
// # Flags
//
// Flags (or FlagValues.Register, which keeps values already set as
// defaults: the master's config file) is the one registration of the
// security flags: --token_file, --admin_token_file, --tls_cert, --tls_key,
// --tls_ca and --insecure, with empty defaults unless set. A binary names
// the ones it has (FlagTokenFile, FlagAdminTokenFile, FlagTLS for the
// three --tls_* flags, FlagInsecure) and its Role: RoleServer (the
// master) or RoleClient, which picks the help texts; Flag.For adds what a
// flag does on that binary. FlagValues' yaml tags are the master's config
// keys of the same names. FlagValues.Mode is Decide on the flags: a
// credential is the token or, on a server, --tls_ca (client certificates
// required), on a client its --tls_cert; the error is
// ErrInsecureWithCredential. Loading the files stays with the binary
// (LoadToken, ServerTLS, ClientTLS).
//
// # Challenge wire format (version 1)
//
// Run once on a fresh connection, by the dialler (Client) and the
// acceptor (Server); both prove knowledge of the token, neither sends it.
// purpose binds the exchange to one channel (Purpose* constants) so that
// an answer from one kind of connection cannot be replayed on another.
//
//	client -> server   hello    "CRAU" | u8 version=1 | u8 purpose | nonceC[32]          (38 bytes)
//	server -> client   answer   "CRAU" | u8 version=1 | u8 purpose | nonceS[32] | macS[32] (70 bytes)
//	client -> server   proof    macC[32]                                                (32 bytes)
//	server -> client   verdict  u8 (0 accepted; anything else: refused, then close)       (1 byte)
//
//	macS = HMAC-SHA256(token, "crescent-auth-v1 server" | purpose | nonceC | nonceS)
//	macC = HMAC-SHA256(token, "crescent-auth-v1 client" | purpose | nonceS | nonceC)
//
// The server reads exactly 38 then 32 bytes (nothing a peer sends is
// allocated by size), checks the magic, version and purpose, and closes a
// connection whose proof is wrong after sending a non-zero verdict. The
// distinct labels stop a server's answer being reflected as a client's
// proof. Each side bounds the exchange with a deadline (DefaultTimeout).
package auth
