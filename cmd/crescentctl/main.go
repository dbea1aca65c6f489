package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/crescent-kv/crescent/ctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := ctl.Main(ctx, os.Args[1:], ctl.IO{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Global: true})
	stop()
	os.Exit(code)
}
