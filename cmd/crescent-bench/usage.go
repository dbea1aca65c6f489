package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"github.com/crescent-kv/crescent/bench"
	"github.com/crescent-kv/crescent/internal/logx"
)

// usageError is a bad command line: exit 2.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// parseFlags parses a subcommand's flags: -h prints them to stderr
// (flag.ErrHelp, exit 0); a bad flag or a stray argument is a
// usageError naming it, in one line. It also takes --log_level and
// --log_format (default warn: the bench's output is its table).
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	lo := logx.Flags(fs, "warn")
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "usage: crescent-bench %s [flags]\n", fs.Name())
		fs.SetOutput(os.Stderr)
		fs.PrintDefaults()
		return err
	}
	if err != nil {
		return usagef("%s: %v", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return usagef("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	if err := lo.Validate(); err != nil {
		return usagef("%s: %v", fs.Name(), err)
	}
	if setGlobalLog {
		logx.SetGlobal(lo.New(os.Stderr)) // the bench's libraries log through slog.Default()
	}
	return nil
}

// setGlobalLog: parseFlags installs the logger as the process's (main
// only: tests run many benches in one process).
var setGlobalLog bool

// exitCode is main's exit status for err: 0 for none and for -h, 2 for
// usage errors (and the bench's own configuration errors), else 1.
func exitCode(err error) int {
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue), errors.Is(err, bench.ErrStoreConfig), errors.Is(err, bench.ErrRPCConfig):
		return 2
	}
	return 1
}

// positive refuses a count below 1 (0 is never "the default" here).
func positive(name string, v int) error {
	if v < 1 {
		return usagef("--%s %d: must be at least 1", name, v)
	}
	return nil
}

// checkSeconds checks a seconds flag: positive, or with zeroOK also 0.
func checkSeconds(name string, v float64, zeroOK bool) error {
	switch {
	case v > 0 && v < 1e9:
		return nil
	case v == 0 && zeroOK:
		return nil
	case zeroOK:
		return usagef("--%s %v: must not be negative", name, v)
	}
	return usagef("--%s %v: must be positive (the bench runs for a set time)", name, v)
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// firstErr returns the first non-nil error.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// checkLocalHost gives a --local_server_name (host or host:port) that
// does not resolve or is not this host's an error naming the flag,
// instead of the engine's "no free handshake port".
func checkLocalHost(flagName, hostport string) error {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host, port = hostport, "0"
	}
	if host == "" {
		return nil
	}
	if net.ParseIP(host) == nil {
		if _, err := net.LookupHost(host); err != nil {
			return fmt.Errorf("--%s %q: host %q does not resolve: %w", flagName, hostport, host, err)
		}
	}
	if port == "0" {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return fmt.Errorf("--%s %q: not an address of this host: %w", flagName, hostport, err)
		}
		l.Close()
	}
	return nil
}

// checkMaster gives a --master host:port that does not resolve an error
// naming the flag, instead of the RPC layer's resolver jargon.
func checkMaster(addr string) error {
	if addr == "" || strings.Contains(addr, "://") {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("--master %q: want host:port", addr)
	}
	if host != "" && net.ParseIP(host) == nil {
		if _, err := net.LookupHost(host); err != nil {
			return fmt.Errorf("--master %q: host %q does not resolve: %w", addr, host, err)
		}
	}
	return nil
}
