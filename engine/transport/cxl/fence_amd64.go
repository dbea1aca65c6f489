package cxl

import (
	"runtime"
	"unsafe"
)

// fence orders the copy against the completion that reports it (MFENCE).
//
//go:noescape
func fence()

// flushLines writes back and invalidates n 64-byte cache lines starting at
// the line-aligned address p (CLFLUSHOPT, then SFENCE).
//
//go:noescape
func flushLines(p, n uintptr)

const canFlush = true

func flushRange(b []byte) {
	if len(b) == 0 {
		return
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	start, end := p&^63, p+uintptr(len(b))
	flushLines(start, (end-start+63)/64)
	runtime.KeepAlive(b)
}
