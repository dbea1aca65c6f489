package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		fmt.Fprintln(os.Stderr, "usage: crescent-bench transfer|store|rpc|ha [flags]\n\nRun 'crescent-bench transfer -h', 'crescent-bench store -h', 'crescent-bench rpc -h' or 'crescent-bench ha -h' for the flags.")
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "transfer":
		err = transferMain(ctx, os.Args[2:])
	case "store":
		err = storeMain(ctx, os.Args[2:], os.Stdout)
	case "rpc":
		err = rpcMain(ctx, os.Args[2:], os.Stdout)
	case "ha":
		err = haMain(ctx, os.Args[2:], os.Stdout)
	case storeClientCmd:
		err = storeClientMain(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (want transfer, store, rpc or ha)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "crescent-bench:", err)
		os.Exit(1)
	}
}

// startCPUProfile writes a CPU profile to path until the returned stop;
// an empty path profiles nothing.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
