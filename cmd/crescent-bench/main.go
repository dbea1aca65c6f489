package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"syscall"

	"github.com/crescent-kv/crescent/internal/buildinfo"
)

func main() {
	setGlobalLog = true
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := benchMain(ctx, os.Args[1:])
	stop()
	if code := exitCode(err); code != 0 {
		fmt.Fprintln(os.Stderr, "crescent-bench:", oneLine(err))
		os.Exit(code)
	}
}

const usage = "usage: crescent-bench transfer|store|rpc|ha [flags]\n\nRun 'crescent-bench transfer -h', 'crescent-bench store -h', 'crescent-bench rpc -h' or 'crescent-bench ha -h' for the flags.\n" +
	"Exit codes: 0 ok, 1 error, 2 usage error."

func benchMain(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("no command (want transfer, store, rpc or ha; -h for help)")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(os.Stderr, usage)
		return nil
	case "-version", "--version", "version":
		fmt.Println(buildinfo.Line("crescent-bench"))
		return nil
	case "transfer":
		return transferMain(ctx, args[1:])
	case "store":
		return storeMain(ctx, args[1:], os.Stdout)
	case "rpc":
		return rpcMain(ctx, args[1:], os.Stdout)
	case "ha":
		return haMain(ctx, args[1:], os.Stdout)
	case storeClientCmd:
		return storeClientMain(ctx, args[1:])
	}
	return usagef("unknown command %q (want transfer, store, rpc or ha)", args[0])
}

// startTrace writes an execution trace (runtime/trace) to path until the
// returned stop; an empty path traces nothing.
func startTrace(path string) (stop func(), err error) {
	return record(path, trace.Start, trace.Stop)
}

// startCPUProfile writes a CPU profile to path until the returned stop;
// an empty path profiles nothing.
func startCPUProfile(path string) (stop func(), err error) {
	return record(path, pprof.StartCPUProfile, pprof.StopCPUProfile)
}

// startMemProfile samples one allocation per 4 KiB (the runtime's default
// is one per 512 KiB, too coarse for a run of small values) and writes
// the allocs profile to path when stopped. It is called before the run
// starts, so the rate applies to all of the run's allocations.
func startMemProfile(path string) (stop func(), err error) {
	var w io.Writer
	old := runtime.MemProfileRate
	return record(path, func(f io.Writer) error {
		w, runtime.MemProfileRate = f, 4096
		return nil
	}, func() {
		runtime.GC() // the profile is as of the last GC
		if err := pprof.Lookup("allocs").WriteTo(w, 0); err != nil {
			fmt.Fprintf(os.Stderr, "crescent-bench: memprofile: %v\n", err)
		}
		runtime.MemProfileRate = old
	})
}

// record runs a runtime recorder (start, stop) into the file path.
func record(path string, start func(io.Writer) error, end func()) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := start(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		end()
		f.Close()
	}, nil
}
