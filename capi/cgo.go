package main

/*
#cgo CFLAGS: -I${SRCDIR}/../include -O2
#define CRESCENT_BUILDING_LIB 1
#include <stdlib.h>
#include "crescent.h"
void crescent_set_error_(int code, const char *msg, size_t n);
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// fail records err as this thread's error and returns code.
func fail(code int, err error) C.int {
	msg := err.Error()
	C.crescent_set_error_(C.int(code), (*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
	return C.int(code)
}

func engineRC(err error) C.int {
	if err == nil {
		return 0
	}
	return fail(engineCode(err), err)
}

func storeRC(err error) C.int {
	if err == nil {
		return 0
	}
	return fail(storeCode(err), err)
}

// recoverEngine/recoverStore turn a panic into a code: a panic must never
// unwind into C.
func recoverEngine(rc *C.int) {
	if r := recover(); r != nil {
		*rc = fail(errInvalidArgument, fmt.Errorf("crescent: internal error: %v", r))
	}
}

func recoverStore(rc *C.int) {
	if r := recover(); r != nil {
		*rc = fail(-1, fmt.Errorf("crescent: internal error: %v", r))
	}
}

// onEngine is every engine export's prologue and epilogue: it finds the
// engine under e, runs f on it, turns f's error into a code and a panic
// into one too (a panic must never unwind into C).
func onEngine(e C.crescent_engine_t, f func(o *engineObj) error) (rc C.int) {
	defer recoverEngine(&rc)
	o, err := getEngine(uint64(e))
	if err == nil {
		err = f(o)
	}
	return engineRC(err)
}

// onStore is onEngine for store exports: f returns the call's
// non-negative result (a size, a count, 1/0) or an error.
func onStore[R ~int32 | ~int64](s C.crescent_store_t, f func(o *storeObj) (R, error)) (rc R) {
	defer func() { // recover must be called by the deferred function itself
		if r := recover(); r != nil {
			rc = R(fail(-1, fmt.Errorf("crescent: internal error: %v", r)))
		}
	}()
	o, err := getStore(uint64(s))
	if err == nil {
		if rc, err = f(o); err == nil {
			return rc
		}
	}
	return R(storeRC(err))
}

// onStoreErr is onStore for calls with no result but success.
func onStoreErr(s C.crescent_store_t, f func(o *storeObj) error) C.int {
	return onStore(s, func(o *storeObj) (C.int, error) { return 0, f(o) })
}

// items bounds a C array's length before Go memory is made for it.
func items(n C.size_t) (int, error) {
	if n > maxItems {
		return 0, badArg(fmt.Sprintf("%d items: at most %d per call", uint64(n), maxItems))
	}
	return int(n), nil
}

func cStrings(p **C.char, n int) ([]string, error) {
	if n == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, badArg("NULL array")
	}
	out := make([]string, n)
	for i, s := range unsafe.Slice(p, n) {
		if s == nil {
			return nil, badArg(fmt.Sprintf("NULL string at %d", i))
		}
		out[i] = C.GoString(s)
	}
	return out, nil
}

// putName writes s NUL-terminated into buf.
func putName(s string, buf *C.char, n C.size_t) error {
	if buf == nil || uint64(n) < uint64(len(s))+1 {
		return badArg(fmt.Sprintf("buffer of %d bytes for a %d-byte name", uint64(n), len(s)+1))
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), len(s)+1)
	copy(dst, s)
	dst[len(s)] = 0
	return nil
}

//export crescent_abi_version
func crescent_abi_version() C.int { return C.CRESCENT_ABI_VERSION }
