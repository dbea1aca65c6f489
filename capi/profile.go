package main

import (
	"os"
	"runtime/pprof"
	"strconv"
	"time"
)

// CRESCENT_CPUPROFILE=file writes a Go CPU profile of the library (the
// Go side of every call, and the runtime's scheduling around the calls)
// for CRESCENT_CPUPROFILE_SECONDS (default 30) from load: a C or Python
// program has no other hook to profile the Go half of its calls.
func init() {
	path := os.Getenv("CRESCENT_CPUPROFILE")
	if path == "" {
		return
	}
	secs, err := strconv.Atoi(os.Getenv("CRESCENT_CPUPROFILE_SECONDS"))
	if err != nil || secs <= 0 {
		secs = 30
	}
	f, err := os.Create(path)
	if err != nil {
		logger.Warn("CRESCENT_CPUPROFILE: cannot create the profile", "path", path, "err", err)
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		logger.Warn("CRESCENT_CPUPROFILE: cannot start the profile", "err", err)
		f.Close()
		return
	}
	time.AfterFunc(time.Duration(secs)*time.Second, func() {
		pprof.StopCPUProfile()
		f.Close()
		logger.Warn("CRESCENT_CPUPROFILE: profile written", "path", path)
	})
}
