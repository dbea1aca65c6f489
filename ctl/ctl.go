package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/crescent-kv/crescent/internal/buildinfo"
	"github.com/crescent-kv/crescent/internal/logx"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
)

// Exit codes of Main (see the package doc).
const (
	ExitOK       = 0
	ExitError    = 1
	ExitUsage    = 2
	ExitNotFound = 3
)

// Defaults of the address flags.
const (
	DefaultMaster = store.DefaultMasterAddr
	DefaultAdmin  = "127.0.0.1:9003"
	DefaultEvents = "tcp://127.0.0.1:5557"
	DefaultReplay = "tcp://127.0.0.1:5558"
)

const name = "crescentctl"

// usageError is a bad command line: exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// errNotFound marks a key the master does not have: exit 3.
var errNotFound = errors.New("key not found")

// IO is where a command reads and writes.
type IO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Global makes the logger the process's too (slog.SetDefault, gRPC's
	// logger): the binary sets it, tests running many commands do not.
	Global bool
}

// options are the global flags; every command takes them.
type options struct {
	master, masterProtocol, admin string
	clusterID                     string
	output                        string
	log                           logx.Options
	localHostname, protocols      string
	metadata, bufferSize          string
	timeout                       time.Duration
	version                       bool
	sec                           securityFlags

	level  slog.Level
	logger *slog.Logger // on stdio.Stderr
	buffer int64
}

func (o *options) bind(fs *flag.FlagSet) {
	fs.StringVar(&o.master, "master", DefaultMaster, "master address host:port, or the HA masters' view: etcd://h:p[,h:p] or redis://h:p")
	fs.StringVar(&o.clusterID, "cluster_id", "", "with an etcd:// or redis:// --master: the masters' --cluster_id (default crescent)")
	fs.StringVar(&o.masterProtocol, "master_protocol", "auto", "protocol to the master: auto, crpc, grpc or grpc_tuned")
	fs.StringVar(&o.admin, "admin", DefaultAdmin, "master's admin HTTP address host:port (ls, stat, segments, clients, health)")
	fs.StringVar(&o.output, "o", "text", "output format: text or json")
	o.log = logx.Options{LogLevel: "warn", LogFormat: logx.FormatText}
	o.log.Register(fs)
	fs.StringVar(&o.localHostname, "local_hostname", "", "this client's transfer engine host or host:port (default: the engine's choice)")
	fs.StringVar(&o.protocols, "protocol", "", `transports in order of preference, e.g. "shm,tcp" (default: the engine's)`)
	fs.StringVar(&o.metadata, "metadata_server", "P2PHANDSHAKE", "transfer engine metadata connection string")
	fs.StringVar(&o.bufferSize, "buffer_size", "16MiB", "staging pool for put and get (values larger than it move in pieces)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on one command (not events)")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	o.sec.bind(fs)
}

// check validates the global flags after parsing.
func (o *options) check() error {
	if o.output != "text" && o.output != "json" {
		return usagef("-o %q: want text or json", o.output)
	}
	if err := o.log.Validate(); err != nil {
		return usagef("%v", err)
	}
	o.level = o.log.Level()
	if o.timeout <= 0 {
		return usagef("--timeout %v: must be positive", o.timeout)
	}
	n, err := parseSize(o.bufferSize)
	if err != nil || n <= 0 {
		return usagef("--buffer_size %q: want a positive size such as 16MiB", o.bufferSize)
	}
	o.buffer = n
	if o.master == "" {
		return usagef("--master: empty")
	}
	if _, _, err := net.SplitHostPort(o.admin); err != nil {
		return usagef("--admin %q: want host:port", o.admin)
	}
	return o.sec.check()
}

func (o *options) json() bool { return o.output == "json" }

// command is one subcommand.
type command struct {
	name, args, help string
	// setup binds the command's own flags (fresh variables each run) and
	// returns what runs once they are parsed.
	setup func(fs *flag.FlagSet) runFunc
	nargs [2]int // fewest and most positional arguments
}

type runFunc func(ctx context.Context, o *options, pos []string, stdio IO) error

var commands []*command

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// order is the commands' order in -h.
var order = []string{"put", "get", "rm", "ls", "stat", "segments", "clients", "health", "events"}

// Usage writes crescentctl -h.
func Usage(w io.Writer) {
	fmt.Fprintf(w, "usage: %s [flags] COMMAND [args] [flags]\n\ncommands:\n", name)
	for _, n := range order {
		c := lookup(n)
		fmt.Fprintf(w, "  %-26s %s\n", strings.TrimSpace(c.name+" "+c.args), c.help)
	}
	fmt.Fprint(w, `
exit codes: 0 ok, 1 error, 2 usage error, 3 key not found

global flags (before or after the command):
`)
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var o options
	o.bind(fs)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprintf(w, "\nRun '%s COMMAND -h' for a command's own flags.\n", name)
}

// Main runs crescentctl with args (without the program name) and returns
// the exit code. ctx ends long-running commands (events) and bounds the
// others.
func Main(ctx context.Context, args []string, stdio IO) int {
	err := run(ctx, args, stdio)
	var ue *usageError
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, flag.ErrHelp):
		return ExitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stdio.Stderr, "%s: %v (see %s -h)\n", name, err, name)
		return ExitUsage
	case errors.Is(err, errNotFound), errors.Is(err, errcode.ErrObjectNotFound):
		fmt.Fprintf(stdio.Stderr, "%s: %v\n", name, err)
		return ExitNotFound
	default:
		fmt.Fprintf(stdio.Stderr, "%s: %v\n", name, err)
		return ExitError
	}
}

func run(ctx context.Context, args []string, stdio IO) error {
	var o options
	// Global flags before the command.
	gfs := flag.NewFlagSet(name, flag.ContinueOnError)
	gfs.SetOutput(io.Discard)
	o.bind(gfs)
	if err := gfs.Parse(args); errors.Is(err, flag.ErrHelp) {
		Usage(stdio.Stdout)
		return err
	} else if err != nil {
		return usagef("%v", err)
	}
	if o.version {
		fmt.Fprintln(stdio.Stdout, buildinfo.Line(name))
		return nil
	}
	rest := gfs.Args()
	if len(rest) == 0 {
		return usagef("no command")
	}
	cmd := lookup(rest[0])
	if cmd == nil {
		if rest[0] == "help" {
			Usage(stdio.Stdout)
			return nil
		}
		return usagef("unknown command %q", rest[0])
	}
	// The command's flags, with the global ones again (bound to the same
	// options, so values given before the command stand unless repeated).
	given := map[string]string{}
	gfs.Visit(func(f *flag.Flag) { given[f.Name] = f.Value.String() }) // before bind resets them
	fs := flag.NewFlagSet(name+" "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.bind(fs)
	for k, v := range given {
		fs.Set(k, v)
	}
	runCmd := cmd.setup(fs)
	pos, err := parseInterspersed(fs, rest[1:])
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(stdio.Stdout, "usage: %s %s %s [flags]\n\n%s\n", name, cmd.name, cmd.args, cmd.help)
		own := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
		cmd.setup(own)
		hasOwn := false
		own.VisitAll(func(*flag.Flag) { hasOwn = true })
		if hasOwn {
			fmt.Fprintln(stdio.Stdout, "\nflags:")
			own.SetOutput(stdio.Stdout)
			own.PrintDefaults()
		}
		fmt.Fprintf(stdio.Stdout, "\nThe global flags (%s -h) work here too.\n", name)
		return err
	} else if err != nil {
		return usagef("%s: %v", cmd.name, err)
	}
	if o.version {
		fmt.Fprintln(stdio.Stdout, buildinfo.Line(name))
		return nil
	}
	if err := o.check(); err != nil {
		return err
	}
	o.logger = o.log.New(stdio.Stderr)
	if stdio.Global {
		logx.SetGlobal(o.logger)
	}
	if len(pos) < cmd.nargs[0] || len(pos) > cmd.nargs[1] {
		if len(pos) > cmd.nargs[1] {
			return usagef("%s: unexpected argument %q (usage: %s %s)", cmd.name, pos[cmd.nargs[1]], cmd.name, cmd.args)
		}
		return usagef("%s: missing arguments (usage: %s %s)", cmd.name, cmd.name, cmd.args)
	}
	return runCmd(ctx, &o, pos, stdio)
}

// parseInterspersed parses args with fs, taking flags after positional
// arguments too (get KEY --file F); "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// parseSize reads "16777216", "64KiB", "16MiB", "1GiB" (K, M, G alone
// and KB, MB, GB are powers of 1024 too).
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	mult := map[string]int64{"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
		"G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}[strings.ToUpper(strings.TrimSpace(t[i:]))]
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil || mult == 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mult, nil
}
