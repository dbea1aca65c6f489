// Package ctl is crescentctl's logic: a command-line client of a Crescent
// store in the etcdctl / redis-cli tradition. cmd/crescentctl is a thin
// main around Main.
//
//	crescentctl [global flags] COMMAND [args] [flags]
//
// Commands:
//
//	put KEY FILE|-        store FILE's bytes (- = stdin) under KEY
//	get KEY [--file F]    write KEY's value to stdout (or to F)
//	rm KEY [--force]      remove KEY
//	rm --regex RE         remove every key RE matches whole (prints the count)
//	ls [--prefix P]       list keys, sorted
//	stat KEY              size, replicas, lease and pins of KEY
//	segments              mounted segments: capacity, use, status
//	clients               clients with mounted segments (from segments)
//	health                the master's health (exit 1 when unhealthy)
//	events                tail a master's KV-event stream, decoded
//
// put and get go through a store.Client that contributes no segment (a
// pure client), so values move through the transfer engine as every
// client's do; rm goes through it too. ls, stat, segments, clients and
// health read the master's admin HTTP port (--admin). events subscribes
// to the master's KV-event PUB socket (--events) and, with --replay, fills
// gaps and starts at --replay-from SEQ from its replay socket; it runs
// until interrupted, or until --count batches were printed.
//
// Flags may come before or after the command and its arguments; "--" ends
// them (for a key that starts with "-"). --master is handed to the store
// client unchanged, so every address form the store client accepts works.
// -o text|json selects the output of every command; json listings are one
// JSON document (events: one JSON object per batch and line). get without
// --file writes the raw value whatever -o says. Diagnostics go to stderr,
// one line per error.
//
// --token_file, --tls_ca/--tls_cert/--tls_key and --admin_token_file
// (needed by rm --force and rm --regex) are the master's
// credentials, named as on every binary; any --tls_* flag also makes the
// admin commands speak https. --insecure with a credential is a usage
// error.
//
// Exit codes:
//
//	0  success
//	1  error (the master or a peer failed, unhealthy, I/O error)
//	2  usage error: unknown command or flag, bad flag value, wrong arguments
//	3  key not found (get, stat, rm KEY)
package ctl
